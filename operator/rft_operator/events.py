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


def transition_events(prev: Optional[RFTJobStatus], new: RFTJobStatus) -> list[JobEvent]:
    """Events for what changed between two statuses: phase transitions and trainer restarts."""
    out: list[JobEvent] = []
    prev_phase = prev.phase if prev is not None else None
    prev_restarts = prev.restarts if prev is not None else 0
    if new.restarts > prev_restarts:
        out.append(JobEvent("Warning", "TrainerRestarted",
                            f"the trainer failed; attempt {new.restarts} resumes from the latest checkpoint "
                            f"(restarts {new.restarts})"))
    if new.phase != prev_phase:
        if prev_phase == "Suspended" and new.phase not in WARNING_PHASES:
            out.append(JobEvent("Normal", "Resumed", "spec.suspend is false: role workloads are restored"))
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
