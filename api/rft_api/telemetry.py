"""The labels every role's Prometheus metrics carry: ``rft_job``, ``rft_namespace`` and ``rft_role``.

The operator gives every pod it builds ``RFT_METRIC_JOB`` (the RFTJob's name, from the pod's
``app.kubernetes.io/instance`` label), ``RFT_METRIC_NAMESPACE`` and ``RFT_METRIC_ROLE`` (its
``rft.dev/role`` label) through the downward API. A role builds its registry with
:func:`job_registry`; every sample it exposes then carries those three labels, so one dashboard
query reads the same series whatever scrapes it. They are prefixed so that they never collide with the
target labels Prometheus adds itself (``job``, ``namespace``, ``pod``): a scrape config needs no
``honorLabels``, and a platform's own relabelling keeps working.
The operator itself gets them from its chart (role ``operator``). Outside a pod (``rft run``, tests)
the job and namespace default to ``local`` and the role to the one the caller names.
"""

from __future__ import annotations

import os
from typing import Iterable, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

__all__ = ["LABELS", "JobLabeledRegistry", "job_labels", "job_registry"]

LABELS = ("rft_job", "rft_namespace", "rft_role")
ENV = {"rft_job": "RFT_METRIC_JOB", "rft_namespace": "RFT_METRIC_NAMESPACE", "rft_role": "RFT_METRIC_ROLE"}


def job_labels(role: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{"rft_job", "rft_namespace", "rft_role"}`` of this process (from the pod's environment)."""
    env = os.environ if environ is None else environ
    return {"rft_job": env.get(ENV["rft_job"]) or "local", "rft_namespace": env.get(ENV["rft_namespace"]) or "local",
            "rft_role": env.get(ENV["rft_role"]) or role}


class JobLabeledRegistry(CollectorRegistry):
    """A registry whose every sample carries ``labels`` (a metric's own label of the same name wins)."""

    def __init__(self, labels: Mapping[str, str]) -> None:
        super().__init__()
        self.labels = dict(labels)

    def collect(self) -> Iterable[Metric]:
        for metric in super().collect():
            out = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            out.samples = [s._replace(labels={**self.labels, **s.labels}) for s in metric.samples]
            yield out


def job_registry(role: str) -> JobLabeledRegistry:
    """A fresh registry labelled with this process's job, namespace and ``role``."""
    return JobLabeledRegistry(job_labels(role))
