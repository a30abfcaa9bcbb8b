"""policies.suspend: which workloads exist, and the deadline clock on resume."""
from __future__ import annotations

import pytest

from rft_api.status import Condition
from rft_operator.plan import TrainerStep, make_plan
from rft_operator.policies import suspend
from tests.operator.support import T0, at, observed, trainer_obs


@pytest.mark.parametrize("susp,phase,deployments,trainer", [
    (False, "Pending", True, True),
    (False, "Running", True, True),
    (True, "Running", False, False),
    (True, "Suspended", False, False),
    (False, "Succeeded", False, True),
    (False, "Failed", False, True),
    (False, "ValidationFailed", False, False),
])
def test_allowed(susp, phase, deployments, trainer) -> None:
    assert suspend.deployments_allowed(susp, phase) is deployments
    assert suspend.trainer_allowed(susp, phase) is trainer


def test_clock_start() -> None:
    assert suspend.clock_start(None, None) is None
    assert suspend.clock_start("2025-01-01T12:00:00Z", None) == T0
    resumed = Condition(type="Suspended", status="False", reason="Resumed", last_transition_time="2025-01-01T12:10:00Z")
    assert suspend.clock_start("2025-01-01T12:00:00Z", resumed) == at(600)
    never = Condition(type="Suspended", status="False", reason="NotSuspended", last_transition_time="2025-01-01T11:00:00Z")
    assert suspend.clock_start("2025-01-01T12:00:00Z", never) == T0


@pytest.mark.parametrize("susp,phase,trainer,persisted,deployments,step", [
    (False, "Running", trainer_obs(ready=1), 0, True, TrainerStep.APPLY),
    (True, "Suspended", trainer_obs(ready=1), 0, False, TrainerStep.DELETE),
    (True, "Suspended", None, 0, False, TrainerStep.ABSENT),
    (False, "Succeeded", trainer_obs(complete=True), 0, False, TrainerStep.KEEP),
    (False, "Failed", trainer_obs(failed=True), 0, False, TrainerStep.KEEP),
    (False, "Failed", trainer_obs(ready=1), 0, False, TrainerStep.DELETE),   # e.g. deadline: stop training
    (False, "Failed", None, 0, False, TrainerStep.ABSENT),
    (False, "Running", trainer_obs(attempt=0, failed=True), 1, True, TrainerStep.DELETE),
    (False, "Running", trainer_obs(attempt=0, failed=True, terminating=True), 1, True, TrainerStep.KEEP),
    (False, "Running", None, 1, True, TrainerStep.APPLY),
    (False, "ValidationFailed", trainer_obs(ready=1), 0, False, TrainerStep.DELETE),
])
def test_plan(susp, phase, trainer, persisted, deployments, step) -> None:
    plan = make_plan(susp, phase, observed(trainer=trainer), persisted)
    assert plan.deployments is deployments and plan.trainer is step and plan.attempt == persisted


def test_validation_failed_creates_nothing_new() -> None:
    assert make_plan(False, "ValidationFailed", observed(), 0).stateful is False
    for phase in ("Pending", "Provisioning", "Running", "Suspended", "Succeeded", "Failed"):
        assert make_plan(False, phase, observed(), 0).stateful is True
