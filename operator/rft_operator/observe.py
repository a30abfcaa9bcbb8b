"""What the operator sees of a job's children, extracted from the Kubernetes objects (pure functions).

``Observed`` is the input of :func:`rft_operator.status.compute_status` and of the reconcile plan; it
is built from plain object dicts (as listed from, or returned by, the API server), so tests build it
from literal dicts.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

from . import names
from rft_api.progress import Progress, ProgressError, parse

Obj = dict[str, Any]


@dataclass(frozen=True)
class WorkloadObs:
    """A role's Deployment."""

    name: str
    desired: int
    ready: int


@dataclass(frozen=True)
class TrainerObs:
    """The trainer Job."""

    name: str
    attempt: int
    desired: int
    active: int = 0
    ready: int = 0
    succeeded: int = 0
    failed: int = 0
    complete: bool = False
    failed_condition: bool = False
    reason: str = ""
    message: str = ""
    terminating: bool = False

    @property
    def finished(self) -> bool:
        return self.complete or self.failed_condition


@dataclass(frozen=True)
class Observed:
    """A job's children as last seen, plus the time of the observation."""

    now: dt.datetime
    workloads: Mapping[str, WorkloadObs] = field(default_factory=dict)
    trainer: Optional[TrainerObs] = None
    progress: Optional[Progress] = None
    progress_error: Optional[str] = None
    children: frozenset[tuple[str, str]] = frozenset()
    """(kind, name) of every child seen."""

    @property
    def any_children(self) -> bool:
        return bool(self.children)


def _cond(obj: Obj, ctype: str) -> Optional[Obj]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype and c.get("status") == "True":
            return c
    return None


def observe_deployment(obj: Obj) -> WorkloadObs:
    """Desired and ready replicas of a Deployment."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    return WorkloadObs(name=obj["metadata"]["name"], desired=int(spec.get("replicas", 1) or 0),
                       ready=int(status.get("readyReplicas") or 0))


def attempt_of(obj: Obj) -> int:
    """The trainer attempt recorded on a trainer Job (0 when absent or unreadable)."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(names.ANNOTATION_ATTEMPT, "0")
    try:
        return max(0, int(raw))
    except (TypeError, ValueError):
        return 0


def observe_job(obj: Obj) -> TrainerObs:
    """Pod counts and terminal conditions of the trainer Job."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    failed = _cond(obj, "Failed") or _cond(obj, "FailureTarget")
    complete = _cond(obj, "Complete") or _cond(obj, "SuccessCriteriaMet")
    terminal = failed or complete
    return TrainerObs(
        name=obj["metadata"]["name"], attempt=attempt_of(obj), desired=int(spec.get("parallelism", 1) or 0),
        active=int(status.get("active") or 0), ready=int(status.get("ready") or 0),
        succeeded=int(status.get("succeeded") or 0), failed=int(status.get("failed") or 0),
        complete=complete is not None and failed is None, failed_condition=failed is not None,
        reason=(terminal or {}).get("reason", "") or "", message=(terminal or {}).get("message", "") or "",
        terminating=bool(obj["metadata"].get("deletionTimestamp")),
    )


def observe_progress(obj: Optional[Obj]) -> tuple[Optional[Progress], Optional[str]]:
    """The parsed progress record, or the reason it could not be parsed."""
    if obj is None:
        return None, None
    try:
        return parse(obj.get("data")), None
    except ProgressError as e:
        return None, str(e)


def observe(job_name: str, objects: Iterable[Obj], now: dt.datetime) -> Observed:
    """Fold a job's child objects (any kinds) into an :class:`Observed`."""
    workloads: dict[str, WorkloadObs] = {}
    trainer = None
    progress_obj = None
    children = set()
    for obj in objects:
        kind, name = obj.get("kind", ""), obj["metadata"]["name"]
        children.add((kind, name))
        role = (obj["metadata"].get("labels") or {}).get(names.LABEL_ROLE, "")
        if kind == "Deployment":
            workloads[role] = observe_deployment(obj)
        elif kind == "Job" and name == names.trainer(job_name):
            trainer = observe_job(obj)
        elif kind == "ConfigMap" and name == names.progress(job_name):
            progress_obj = obj
    progress, error = observe_progress(progress_obj)
    return Observed(now=now, workloads=workloads, trainer=trainer, progress=progress, progress_error=error,
                    children=frozenset(children))
