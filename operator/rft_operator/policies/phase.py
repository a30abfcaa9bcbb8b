"""The job's phase machine.

::

    Pending ──► Provisioning ──► Running ──► Succeeded
       │             │              │  └───► Failed
       └─────────────┴──────────────┴──► Suspended ──► Provisioning (resume)
    (any non-terminal) ──► Failed | ValidationFailed

- Pending: nothing of the job exists yet.
- Provisioning: children exist; the trainer is not running with ready inference yet.
- Running: the trainer has a ready pod and inference is ready. A running job stays Running while a
  role is degraded or the trainer restarts (the conditions say which); it leaves Running only for a
  terminal phase or Suspended.
- Suspended: ``spec.suspend`` is true, or Kueue has not admitted (or has evicted) a queued job
  (``policies.admission``).
- Succeeded / Failed / ValidationFailed are terminal: once reached, nothing changes the phase.

Precedence in one evaluation: terminal stays terminal > ValidationFailed > Failed > Succeeded >
Suspended > Running > Provisioning > Pending.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rft_api.constants import TERMINAL_PHASES

from .failure import Failure


@dataclass(frozen=True)
class Signals:
    """Everything the phase machine looks at, already reduced to facts."""

    suspend: bool = False
    suspend_reason: str = "Suspended"
    suspend_message: str = "spec.suspend is true: role workloads are removed"
    invalid: Optional[str] = None
    failure: Optional[Failure] = None
    trainer_succeeded: bool = False
    trainer_running: bool = False
    inference_ready: bool = False
    children_exist: bool = False
    restarting: bool = False


@dataclass(frozen=True)
class PhaseDecision:
    phase: str
    reason: str
    message: str


def is_terminal(phase: Optional[str]) -> bool:
    return phase in TERMINAL_PHASES


def next_phase(prev: Optional[str], prev_reason: str, prev_message: str, s: Signals) -> PhaseDecision:
    """The phase after observing ``s`` in phase ``prev`` (``None`` for a new job)."""
    if prev is not None and is_terminal(prev):
        return PhaseDecision(prev, prev_reason, prev_message)
    if s.invalid is not None:
        return PhaseDecision("ValidationFailed", "InvalidSpec", s.invalid)
    if s.failure is not None:
        return PhaseDecision("Failed", s.failure.reason, s.failure.message)
    if s.trainer_succeeded:
        return PhaseDecision("Succeeded", "TrainerCompleted", "the trainer completed every step")
    if s.suspend:
        return PhaseDecision("Suspended", s.suspend_reason, s.suspend_message)
    if prev == "Running":
        if s.restarting:
            return PhaseDecision("Running", "TrainerRestarting", "the trainer failed and is restarting from the latest checkpoint")
        if s.trainer_running:
            return PhaseDecision("Running", "Running", "the trainer is running")
        return PhaseDecision("Running", "TrainerNotRunning", "the trainer has no ready pod (see the conditions)")
    if s.trainer_running and s.inference_ready:
        return PhaseDecision("Running", "Running", "the trainer is running")
    if s.children_exist or prev in ("Provisioning", "Suspended"):
        return PhaseDecision("Provisioning", "Provisioning", "waiting for the roles to become ready")
    return PhaseDecision("Pending", "Pending", "waiting for the operator to create the job's children")
