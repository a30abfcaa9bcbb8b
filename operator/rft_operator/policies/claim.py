"""Claim policy: one live job at a time writes into a ``checkpoint.existingClaim``.

Two RFTJobs naming the same existing claim would both write checkpoints into it and corrupt each
other's resume. The reconcile marks the claim with annotation ``rft.dev/used-by: <job name>/<uid>``
(a merge patch that carries the claim's ``resourceVersion``, so of two jobs marking it at once one
wins and the other sees the winner at its next pass). A job whose claim is marked by another *live*
job (an RFTJob of that name and uid exists and is not terminal) is held: it waits, suspended with
reason ``ClaimInUse`` naming the other job, and proceeds once that job is deleted or finished. A job
that ends (Succeeded, Failed, ValidationFailed) releases the mark; a deleted job leaves its mark,
which the next job takes over since its holder is no longer live. The claim the operator creates
(``<job>-checkpoints``) is the job's alone and never marked.

Pure: the reconcile reads the claim and the holder and applies the patch this module computes.
"""
from __future__ import annotations

from typing import Any, Optional

from rft_api.constants import TERMINAL_PHASES

from .. import names
from .admission import Hold

Obj = dict[str, Any]
CLAIM_IN_USE = "ClaimInUse"


def mark(name: str, uid: str) -> str:
    """The ``rft.dev/used-by`` value naming a job."""
    return f"{name}/{uid}"


def holder(claim: Optional[Obj]) -> Optional[tuple[str, str]]:
    """``(name, uid)`` of the job that marked the claim, or None when unmarked (or unreadable)."""
    value = (((claim or {}).get("metadata") or {}).get("annotations") or {}).get(names.ANNOTATION_USED_BY) or ""
    name, _, uid = value.partition("/")
    return (name, uid) if name and uid else None


def live(job_obj: Optional[Obj], uid: str) -> bool:
    """Whether ``job_obj`` (the RFTJob read by the holder's name) is the holder and not terminal."""
    if job_obj is None or job_obj["metadata"].get("uid") != uid or job_obj["metadata"].get("deletionTimestamp"):
        return False
    return (job_obj.get("status") or {}).get("phase") not in TERMINAL_PHASES


def in_use(claim_name: str, other: str) -> Hold:
    """The hold of a job whose existing claim another live job writes into."""
    return Hold(CLAIM_IN_USE, f"checkpoint.existingClaim {claim_name} is in use by RFTJob {other} (annotation "
                              f"{names.ANNOTATION_USED_BY}): two jobs writing checkpoints into one claim corrupt "
                              "each other's resume, so this job waits until that one finishes or is deleted")


def mark_patch(claim: Obj, value: Optional[str]) -> Obj:
    """The merge patch that sets (``value``) or removes (None) the mark, conditional on the claim's
    ``resourceVersion``."""
    return {"metadata": {"resourceVersion": claim["metadata"].get("resourceVersion"),
                         "annotations": {names.ANNOTATION_USED_BY: value}}}
