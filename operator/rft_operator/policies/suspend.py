"""Suspend policy: which children exist while a job is suspended, and when its clock restarts.

``spec.suspend: true`` removes the role workloads (inference, reward and rollout Deployments, the
trainer Job) and keeps everything that holds state or identity: the checkpoint claim, the config and
progress ConfigMaps, the Services and the trainer's RBAC. ``false`` brings the workloads back; the new
trainer resumes from the latest checkpoint on the claim. Terminal jobs keep the trainer Job (its
pods' logs) but lose their Deployments (nothing is left to serve or roll out).

The deadline clock (``spec.activeDeadlineSeconds``) restarts on resume, as a Kubernetes Job's does:
suspended time never counts.
"""
from __future__ import annotations

import datetime as dt
from typing import Optional

from rft_api.constants import TERMINAL_PHASES
from rft_api.status import Condition

from ..timeutil import parse_time

WORKLOAD_KINDS = ("Deployment", "Job")
RESUMED = "Resumed"


def deployments_allowed(suspend: bool, phase: str) -> bool:
    """Whether the role Deployments should exist."""
    return not suspend and phase not in TERMINAL_PHASES


def trainer_allowed(suspend: bool, phase: str) -> bool:
    """Whether the trainer Job should exist (kept, finished, once the job is terminal)."""
    return not suspend and phase != "ValidationFailed"


def clock_start(start_time: Optional[str], suspended: Optional[Condition]) -> Optional[dt.datetime]:
    """Where the deadline clock starts: the later of the start time and the last resume (the
    ``Suspended`` condition turning False with reason ``Resumed``)."""
    if start_time is None:
        return None
    start = parse_time(start_time)
    if suspended is not None and suspended.status == "False" and suspended.reason == RESUMED \
            and suspended.last_transition_time:
        start = max(start, parse_time(suspended.last_transition_time))
    return start
