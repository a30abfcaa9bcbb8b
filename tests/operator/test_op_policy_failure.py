"""policies.failure: restart budget, trainer action, deadline, evaluator failure."""
from __future__ import annotations

import pytest

from rft_api.progress import Progress
from rft_operator.policies import failure
from rft_operator.policies.failure import TrainerAction
from tests.operator.support import at, make_job, trainer_obs


@pytest.mark.parametrize("trainer,restarts,limit,expected_restarts,fails", [
    (None, 0, 3, 0, False),
    (trainer_obs(ready=1), 0, 3, 0, False),
    (trainer_obs(complete=True), 0, 3, 0, False),
    (trainer_obs(attempt=0, failed=True), 0, 3, 1, False),
    (trainer_obs(attempt=2, failed=True), 2, 3, 3, False),
    (trainer_obs(attempt=3, failed=True), 3, 3, 3, True),
    (trainer_obs(attempt=0, failed=True), 0, 0, 0, True),
    (trainer_obs(attempt=0, failed=True), 1, 3, 1, False),  # stale failure, already counted
])
def test_next_restarts(trainer, restarts, limit, expected_restarts, fails) -> None:
    got, f = failure.next_restarts(trainer, restarts, limit)
    assert got == expected_restarts
    assert (f is not None) is fails
    if fails:
        assert f.reason == "RestartLimitExceeded" and f"restartLimit is {limit}" in f.message
        assert "BackoffLimitExceeded" in f.message


@pytest.mark.parametrize("trainer,persisted,action", [
    (None, 0, TrainerAction.APPLY),
    (None, 2, TrainerAction.APPLY),
    (trainer_obs(attempt=1, ready=1), 1, TrainerAction.APPLY),
    (trainer_obs(attempt=0, failed=True), 0, TrainerAction.APPLY),   # counted first, deleted later
    (trainer_obs(attempt=0, failed=True), 1, TrainerAction.DELETE_STALE),
    (trainer_obs(attempt=0, failed=True, terminating=True), 1, TrainerAction.WAIT),
])
def test_trainer_action(trainer, persisted, action) -> None:
    assert failure.trainer_action(trainer, persisted) is action


def test_deadline() -> None:
    spec = make_job(activeDeadlineSeconds=60).spec
    assert failure.deadline_failure(spec, None, at(1000)) is None
    assert failure.deadline_failure(spec, at(0), at(59)) is None
    f = failure.deadline_failure(spec, at(0), at(61))
    assert f.reason == "DeadlineExceeded" and "activeDeadlineSeconds is 60" in f.message
    assert failure.deadline_failure(make_job().spec, at(0), at(10 ** 6)) is None


def test_evaluator_failure_needs_a_full_step() -> None:
    spec = make_job(rollout={"samplesPerPrompt": 2, "promptsPerStep": 3}).spec
    assert failure.min_samples_for_evaluator_verdict(spec) == 6

    def p(n: int, t: int, r: int) -> Progress:
        return Progress.model_validate({"samplesScored": n, "errors": {"timeouts": t, "runtimeErrors": r}})

    assert failure.evaluator_failure(spec, None) is None
    assert failure.evaluator_failure(spec, p(5, 5, 0)) is None
    assert failure.evaluator_failure(spec, p(6, 3, 3)).reason == "EvaluatorFailing"
    assert failure.evaluator_failure(spec, p(6, 2, 3)) is None
