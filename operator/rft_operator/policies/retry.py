"""Retrying a Failed job in place: it resumes from its latest checkpoint instead of being deleted and
applied again (which deletes the checkpoint claim unless ``checkpoint.retainOnDelete``).

A Failed job is retried when its spec is edited (``metadata.generation`` above the generation it
failed at, ``status.observedGeneration``: the fix for what failed it, a higher ``restartLimit``), or
when the annotation :data:`~rft_api.constants.RETRY_ANNOTATION` holds a number above
``status.retry.count`` (``kubectl rft resume`` sets it: the cause was outside the spec, a node, a
registry, a quota). The retry is a new trainer attempt (``status.restarts`` + 1: the failed trainer Job
is stale and goes), the restart budget counts from it (``status.retry.restartsAtRetry``), the deadline
clock starts again, and ``status.retry`` records the failure it came from. ``ValidationFailed`` is not
retried (its spec never ran), nor is ``Succeeded``.
"""
from __future__ import annotations

from typing import Optional

from rft_api.constants import RETRY_ANNOTATION
from rft_api.job import RFTJob
from rft_api.status import RetryRecord, RFTJobStatus

__all__ = ["requested", "reopen"]


def requested(job: RFTJob) -> Optional[tuple[str, int]]:
    """``(why, retry count after it)`` when the Failed ``job`` is to be retried, else None."""
    st = job.status
    if st is None or st.phase != "Failed":
        return None
    count = st.retry.count if st.retry is not None else 0
    raw = str((job.metadata.get("annotations") or {}).get(RETRY_ANNOTATION, "")).strip()
    if raw.isdigit() and int(raw) > count:
        return f"annotation {RETRY_ANNOTATION}={raw}", int(raw)
    generation = job.metadata.get("generation")
    if isinstance(generation, int) and st.observed_generation is not None and generation > st.observed_generation:
        return f"the spec was edited (generation {generation})", count + 1
    return None


def _failure(prev: RFTJobStatus) -> str:
    failed = next((c for c in prev.conditions if c.type == "Failed" and c.status == "True"), None)
    return f"{failed.reason}: {failed.message}" if failed is not None else prev.message


def reopen(prev: RFTJobStatus, why: str, count: int, now: str) -> RFTJobStatus:
    """The status a retried job continues from: Provisioning, a new trainer attempt, no completion time,
    ``retry`` recording it."""
    was = _failure(prev)
    restarts = prev.restarts + 1
    return prev.model_copy(update={
        "phase": "Provisioning", "restarts": restarts, "completion_time": None,
        "message": f"retried ({why}) after {was}"[:1024],
        "retry": RetryRecord(count=count, restarts_at_retry=restarts, failure=was[:4096], time=now),
    })
