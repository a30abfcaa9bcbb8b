"""policies.phase: the phase machine's transitions and precedence."""
from __future__ import annotations

import pytest

from rft_api.constants import TERMINAL_PHASES
from rft_operator.policies.failure import Failure
from rft_operator.policies.phase import Signals, next_phase

FAIL = Failure("DeadlineExceeded", "too long")
READY = dict(trainer_running=True, inference_ready=True, children_exist=True)


@pytest.mark.parametrize("prev,signals,phase", [
    (None, Signals(), "Pending"),
    ("Pending", Signals(children_exist=True), "Provisioning"),
    ("Provisioning", Signals(children_exist=True), "Provisioning"),
    ("Provisioning", Signals(**READY), "Running"),
    ("Provisioning", Signals(trainer_running=True, children_exist=True), "Provisioning"),
    ("Running", Signals(children_exist=True), "Running"),          # degraded stays Running
    ("Running", Signals(restarting=True, children_exist=True), "Running"),
    ("Running", Signals(trainer_succeeded=True), "Succeeded"),
    ("Running", Signals(failure=FAIL, **READY), "Failed"),
    ("Running", Signals(suspend=True, **READY), "Suspended"),
    ("Pending", Signals(suspend=True), "Suspended"),
    ("Suspended", Signals(), "Provisioning"),                       # resume
    ("Suspended", Signals(**READY), "Running"),
    ("Running", Signals(invalid="spec.x: bad"), "ValidationFailed"),
    # precedence
    ("Running", Signals(failure=FAIL, trainer_succeeded=True), "Failed"),
    ("Running", Signals(trainer_succeeded=True, suspend=True), "Succeeded"),
    ("Running", Signals(invalid="x", failure=FAIL), "ValidationFailed"),
])
def test_transitions(prev, signals, phase) -> None:
    assert next_phase(prev, "", "", signals).phase == phase


@pytest.mark.parametrize("terminal", TERMINAL_PHASES)
@pytest.mark.parametrize("signals", [Signals(**READY), Signals(suspend=True), Signals(failure=FAIL),
                                     Signals(trainer_succeeded=True), Signals(invalid="x"), Signals()])
def test_terminal_phases_are_terminal(terminal, signals) -> None:
    d = next_phase(terminal, "SomeReason", "why", signals)
    assert (d.phase, d.reason, d.message) == (terminal, "SomeReason", "why")


def test_failure_carries_reason_and_message() -> None:
    d = next_phase("Running", "", "", Signals(failure=FAIL))
    assert (d.reason, d.message) == ("DeadlineExceeded", "too long")
    d = next_phase(None, "", "", Signals(invalid="spec.trainer.learningRate: must be positive"))
    assert d.reason == "InvalidSpec" and "learningRate" in d.message
