"""Kubernetes Events about an RFTJob: which transitions deserve one (pure) and the Event objects."""
from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any, Optional

from rft_api.status import RFTJobStatus

from .names import MANAGED_BY

Obj = dict[str, Any]
WARNING_PHASES = ("Failed", "ValidationFailed")


@dataclass(frozen=True)
class JobEvent:
    type: str  # Normal | Warning
    reason: str
    message: str


def _failure_reason(status: RFTJobStatus) -> str:
    for c in status.conditions:
        if c.type == "Failed" and c.status == "True" and c.reason:
            return c.reason
    return status.phase


def transition_events(prev: Optional[RFTJobStatus], new: RFTJobStatus, cause: str = "") -> list[JobEvent]:
    """Events for what changed between two statuses, so that ``kubectl describe rftjob`` tells the
    job's story: each phase change (with the reason in its message), each new checkpoint, each trainer
    restart with its cause (``cause``: what the failed trainer's pods reported, when known)."""
    out: list[JobEvent] = []
    prev_phase = prev.phase if prev is not None else None
    prev_restarts = prev.restarts if prev is not None else 0
    prev_ckpt = prev.last_checkpoint.step if prev is not None and prev.last_checkpoint is not None else -1
    if new.last_checkpoint is not None and new.last_checkpoint.step > prev_ckpt:
        out.append(JobEvent("Normal", "CheckpointSaved",
                            f"checkpoint of step {new.last_checkpoint.step} saved at {new.last_checkpoint.path}"))
    if new.restarts > prev_restarts:
        last = next((c for c in new.checkpoints[::-1]), None) if new.checkpoints else new.last_checkpoint
        where = f"checkpoint of step {last.step}" if last is not None else "the start (no checkpoint yet)"
        out.append(JobEvent("Warning", "TrainerRestarted",
                            f"the trainer failed{': ' + cause if cause else ''}; attempt {new.restarts} resumes "
                            f"from the {where} (restarts {new.restarts})"))
    if new.phase != prev_phase:
        if prev_phase == "Suspended" and new.phase not in WARNING_PHASES:
            out.append(JobEvent("Normal", "Resumed", "the job is no longer suspended or held: role workloads are "
                                                     "restored and the trainer resumes from the latest checkpoint"))
        if new.phase in WARNING_PHASES:
            out.append(JobEvent("Warning", _failure_reason(new), new.message))
        else:
            out.append(JobEvent("Normal", new.phase, new.message))
    return out


def event_object(job_obj: Obj, ev: JobEvent, now: str) -> Obj:
    """A core/v1 Event about the RFTJob ``job_obj``."""
    meta = job_obj["metadata"]
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta.get("namespace", "default")},
        "involvedObject": {"apiVersion": job_obj.get("apiVersion", ""), "kind": job_obj.get("kind", ""),
                           "name": meta["name"], "namespace": meta.get("namespace", "default"),
                           "uid": meta.get("uid", "")},
        "type": ev.type, "reason": ev.reason, "message": ev.message[:1024],
        "source": {"component": MANAGED_BY},
        "reportingComponent": MANAGED_BY, "reportingInstance": socket.gethostname()[:128],
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }
