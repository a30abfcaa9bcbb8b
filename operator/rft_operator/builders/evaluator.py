"""Where the evaluators run and what their pods need: file evaluators' ConfigMaps, API-key Secrets.

Scoring happens in the reward pods when the job has a reward role (``topology.reward_required``),
else in the rollout pods; evaluator files and API keys go only to the pods that score.
"""
from __future__ import annotations

from typing import Any

from rft_api.job import RFTJob
from rft_api.layout import EVALUATOR_DIR, api_key_env_name
from rft_api.spec import RFTJobSpec

from .common import BuildContext, secret_env

Obj = dict[str, Any]


def secret_envs(spec: RFTJobSpec) -> list[Obj]:
    """``valueFrom.secretKeyRef`` env vars for the scoring pods."""
    out = []
    for i, e in enumerate(spec.evaluator.entries()):
        ref = e.api_key_secret_ref
        if ref is not None:
            out.append(secret_env(api_key_env_name(i), ref.name, ref.key))
    return out


def file_volumes(job: RFTJob, rollout_only: bool = False) -> tuple[list[Obj], list[Obj]]:
    """A projected volume at ``/etc/rft/evaluator`` with each file (and Eval Protocol file) evaluator at ``<index>/<key>``
    (``rollout_only``: just the files that define a rollout function, for rollout pods that do not score)."""
    sources = []
    for i, e in enumerate(job.spec.evaluator.entries()):
        ref = e.file_ref()
        if ref is not None and (not rollout_only or (e.file is not None and e.file.rollout)):
            sources.append({"configMap": {"name": ref.name, "items": [{"key": ref.key, "path": f"{i}/{ref.key}"}]}})
    if not sources:
        return [], []
    return ([{"name": "evaluator", "projected": {"sources": sources}}],
            [{"name": "evaluator", "mountPath": EVALUATOR_DIR, "readOnly": True}])


def scoring_image(job: RFTJob, ctx: BuildContext) -> str:
    """The evaluator bundle's image when there is one, else the runtime image."""
    return job.spec.evaluator.bundle_image() or ctx.runtime_image_of(job)
