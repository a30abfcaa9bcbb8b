"""compute_status: table tests of phases, conditions, progress folding and the failure policies."""
from __future__ import annotations

import pytest

from rft_api.constants import CONDITION_TYPES, OPTIONAL_CONDITION_TYPES
from rft_api.progress import Progress
from rft_api.status import RFTJobStatus
from rft_operator.status import compute_status, validation_failed_status
from tests.operator.support import at, make_job, observed, trainer_obs

RUNNING = dict(inference=1, rollout=1, trainer=trainer_obs(ready=1, active=1))


def step(job, obs) -> RFTJobStatus:
    """One reconcile's status; the job then carries it as its previous status."""
    job.status = compute_status(job, obs)
    return job.status


def cond(status: RFTJobStatus, ctype: str):
    return next(c for c in status.conditions if c.type == ctype)


def test_new_job_without_children_is_pending(tiny_job) -> None:
    s = compute_status(tiny_job, observed(children=False))
    assert s.phase == "Pending"
    assert [c.type for c in s.conditions] == [c for c in CONDITION_TYPES if c not in OPTIONAL_CONDITION_TYPES]
    assert all(c.observed_generation == 1 for c in s.conditions)
    assert s.observed_generation == 1 and s.start_time is None and s.total_steps == 30


@pytest.mark.parametrize("obs_kwargs,phase", [
    (dict(), "Provisioning"),
    (dict(inference=0, rollout=0, trainer=trainer_obs(active=1)), "Provisioning"),
    (dict(inference=1, rollout=0, trainer=trainer_obs(active=1)), "Provisioning"),
    (dict(inference=0, rollout=1, trainer=trainer_obs(ready=1, active=1)), "Provisioning"),
    (RUNNING, "Running"),
    (dict(inference=1, rollout=0, trainer=trainer_obs(ready=1, active=1)), "Running"),
    (dict(inference=1, rollout=1, trainer=trainer_obs(complete=True)), "Succeeded"),
])
def test_phase_from_children(tiny_job, obs_kwargs, phase) -> None:
    assert compute_status(tiny_job, observed(**obs_kwargs)).phase == phase


def test_lifecycle_and_conditions(tiny_job) -> None:
    s = step(tiny_job, observed(at(0)))
    assert s.phase == "Provisioning" and s.start_time == "2025-01-01T12:00:00Z"
    assert cond(s, "InferenceReady").status == "False" and cond(s, "InferenceReady").reason == "NotReady"
    assert cond(s, "RewardReady").status == "True" and cond(s, "RewardReady").reason == "NotRequired"
    assert cond(s, "TrainerRunning").reason == "NotCreated"

    s = step(tiny_job, observed(at(10), **RUNNING))
    assert s.phase == "Running"
    assert cond(s, "InferenceReady").status == "True"
    assert cond(s, "InferenceReady").last_transition_time == "2025-01-01T12:00:10Z"
    assert cond(s, "TrainerRunning").status == "True"
    assert s.roles.inference.ready == 1 and s.roles.inference.desired == 1 and s.roles.trainer.ready == 1
    assert s.start_time == "2025-01-01T12:00:00Z"  # kept

    # degraded inference: still Running, the condition says so
    s = step(tiny_job, observed(at(20), inference=0, rollout=1, trainer=trainer_obs(ready=1, active=1)))
    assert s.phase == "Running" and cond(s, "InferenceReady").status == "False"
    assert cond(s, "InferenceReady").last_transition_time == "2025-01-01T12:00:20Z"

    s = step(tiny_job, observed(at(30), inference=1, rollout=1, trainer=trainer_obs(complete=True)))
    assert s.phase == "Succeeded" and s.completion_time == "2025-01-01T12:00:30Z"
    assert cond(s, "Succeeded").status == "True" and cond(s, "Succeeded").reason == "TrainerCompleted"
    assert cond(s, "TrainerRunning").reason == "Completed"
    assert s.roles.inference.desired == 0  # Deployments go away once terminal

    # terminal is terminal, whatever is observed next
    s2 = step(tiny_job, observed(at(40), trainer=trainer_obs(failed=True)))
    assert s2.phase == "Succeeded" and s2.completion_time == s.completion_time
    assert cond(s2, "Succeeded").reason == "TrainerCompleted"


def test_transition_time_changes_only_with_status(tiny_job) -> None:
    a = step(tiny_job, observed(at(0), **RUNNING))
    b = step(tiny_job, observed(at(50), **RUNNING))
    assert [c.last_transition_time for c in a.conditions] == [c.last_transition_time for c in b.conditions]
    assert a == b  # a fixed point: nothing to write on the next reconcile


def test_suspend_and_resume(tiny_job) -> None:
    step(tiny_job, observed(at(0), **RUNNING))
    tiny_job.spec.suspend = True
    s = step(tiny_job, observed(at(10)))
    assert s.phase == "Suspended"
    assert cond(s, "Suspended").status == "True"
    assert cond(s, "InferenceReady").reason == "Removed" and cond(s, "TrainerRunning").reason == "Removed"
    assert s.roles.inference.desired == 0 and s.roles.trainer.desired == 0
    tiny_job.spec.suspend = False
    s = step(tiny_job, observed(at(20)))
    assert s.phase == "Provisioning"
    assert cond(s, "Suspended").status == "False" and cond(s, "Suspended").reason == "Resumed"
    assert cond(s, "Suspended").last_transition_time == "2025-01-01T12:00:20Z"
    s = step(tiny_job, observed(at(30), **RUNNING))
    assert s.phase == "Running" and cond(s, "Suspended").reason == "Resumed"


def test_created_suspended_has_no_start_time() -> None:
    job = make_job(suspend=True)
    s = step(job, observed(at(0)))
    assert s.phase == "Suspended" and s.start_time is None


def test_progress_is_folded_in(tiny_job) -> None:
    p = Progress.model_validate({
        "step": 12, "totalSteps": 30, "policyVersion": 12, "rewardMean": 0.4, "rewardStd": 0.1, "evalScore": 0.5,
        "samplesScored": 1536, "errors": {"timeouts": 2, "parseErrors": 7},
        "checkpoints": [{"step": 0, "path": "/checkpoints/step-0"}, {"step": 10, "path": "/checkpoints/step-10",
                                                                     "time": "2025-01-01T12:05:00Z"}]})
    s = step(tiny_job, observed(at(0), progress=p, **RUNNING))
    assert (s.step, s.total_steps, s.policy_version) == (12, 30, 12)
    assert (s.reward_mean, s.reward_std, s.eval_score) == (0.4, 0.1, 0.5)
    assert s.errors.timeouts == 2 and s.errors.parse_errors == 7
    assert s.last_checkpoint.step == 10 and s.last_checkpoint.time == "2025-01-01T12:05:00Z"
    assert [c.step for c in s.checkpoints] == [0, 10]
    # no record (e.g. a restarted trainer has not written yet): the previous values stay
    s = step(tiny_job, observed(at(5), **RUNNING))
    assert s.step == 12 and s.last_checkpoint.step == 10
    # garbage: previous values stay and the message says why
    s = step(tiny_job, observed(at(6), progress_error="progress.json: step: Input should be a valid integer", **RUNNING))
    assert s.step == 12 and "progress ConfigMap ignored: progress.json: step" in s.message


def test_trainer_restart_counts_once_and_keeps_running(tiny_job) -> None:
    step(tiny_job, observed(at(0), **RUNNING))
    failed0 = trainer_obs(attempt=0, failed=True)
    s = step(tiny_job, observed(at(10), inference=1, rollout=1, trainer=failed0))
    assert s.restarts == 1 and s.phase == "Running"
    assert cond(s, "TrainerRunning").reason == "Restarting"
    # the same failed Job seen again (not yet deleted) is not counted twice
    s = step(tiny_job, observed(at(11), inference=1, rollout=1, trainer=failed0))
    assert s.restarts == 1 and s.phase == "Running"
    # attempt 1 runs
    s = step(tiny_job, observed(at(20), inference=1, rollout=1, trainer=trainer_obs(attempt=1, ready=1, active=1)))
    assert s.restarts == 1 and cond(s, "TrainerRunning").status == "True"


def test_restart_budget_exhausted_fails_the_job() -> None:
    job = make_job(restartLimit=1)
    step(job, observed(at(0), **RUNNING))
    s = step(job, observed(at(1), inference=1, rollout=1, trainer=trainer_obs(attempt=0, failed=True)))
    assert s.restarts == 1 and s.phase == "Running"
    s = step(job, observed(at(2), inference=1, rollout=1, trainer=trainer_obs(attempt=1, failed=True)))
    assert s.phase == "Failed" and s.restarts == 1
    f = cond(s, "Failed")
    assert f.status == "True" and f.reason == "RestartLimitExceeded" and "restartLimit is 1" in f.message
    assert s.completion_time == "2025-01-01T12:00:02Z"


def test_restart_limit_zero_fails_on_first_failure() -> None:
    job = make_job(restartLimit=0)
    s = step(job, observed(at(0), inference=1, rollout=1, trainer=trainer_obs(failed=True)))
    assert s.phase == "Failed" and s.restarts == 0


def test_deadline() -> None:
    job = make_job(activeDeadlineSeconds=100)
    step(job, observed(at(0), **RUNNING))
    assert step(job, observed(at(99), **RUNNING)).phase == "Running"
    s = step(job, observed(at(100), **RUNNING))
    assert s.phase == "Failed" and cond(s, "Failed").reason == "DeadlineExceeded"


def test_deadline_clock_restarts_on_resume() -> None:
    job = make_job(activeDeadlineSeconds=100)
    step(job, observed(at(0), **RUNNING))
    job.spec.suspend = True
    step(job, observed(at(50)))
    assert step(job, observed(at(500))).phase == "Suspended"  # suspended time never counts
    job.spec.suspend = False
    step(job, observed(at(600)))
    assert step(job, observed(at(699), **RUNNING)).phase == "Running"
    assert step(job, observed(at(700), **RUNNING)).phase == "Failed"


@pytest.mark.parametrize("scored,timeouts,runtime,parse,failed", [
    (128, 128, 0, 0, True),      # one step's worth (16 prompts x 8 samples), all timed out
    (128, 64, 64, 0, True),
    (127, 127, 0, 0, False),     # not a full step yet
    (128, 127, 0, 0, False),     # one sample scored fine
    (128, 0, 0, 128, False),     # unparsable answers are the policy's fault, not the evaluator's
    (0, 0, 0, 0, False),
])
def test_evaluator_failing_on_every_sample(tiny_job, scored, timeouts, runtime, parse, failed) -> None:
    p = Progress.model_validate({"samplesScored": scored, "errors": {
        "timeouts": timeouts, "runtimeErrors": runtime, "parseErrors": parse}})
    s = compute_status(tiny_job, observed(at(0), progress=p, **RUNNING))
    assert (s.phase == "Failed") is failed
    if failed:
        assert cond(s, "Failed").reason == "EvaluatorFailing"
        assert f"every one of the {scored} samples" in s.message


def test_failure_beats_success_and_suspend(tiny_job) -> None:
    tiny_job.spec.suspend = True
    p = Progress.model_validate({"samplesScored": 128, "errors": {"runtimeErrors": 128}})
    assert compute_status(tiny_job, observed(progress=p)).phase == "Failed"


def test_spec_generation_is_observed(tiny_job) -> None:
    step(tiny_job, observed(at(0), **RUNNING))
    tiny_job.metadata["generation"] = 4
    s = step(tiny_job, observed(at(1), **RUNNING))
    assert s.observed_generation == 4 and {c.observed_generation for c in s.conditions} == {4}


def test_validation_failed_status_is_terminal() -> None:
    s = validation_failed_status(None, "spec.rollout.samplesPerPrompt: must be at least 2", 3, "2025-01-01T00:00:00Z")
    assert s.phase == "ValidationFailed" and "samplesPerPrompt" in s.message
    f = next(c for c in s.conditions if c.type == "Failed")
    assert f.status == "True" and f.reason == "InvalidSpec" and f.observed_generation == 3
    prev = s.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert validation_failed_status(prev, "other", 4, "2025-01-02T00:00:00Z") == s
    done = RFTJobStatus(phase="Succeeded").model_dump(by_alias=True, mode="json")
    assert validation_failed_status(done, "x", 5, "2025-01-02T00:00:00Z").phase == "Succeeded"


def test_validation_failed_stays_as_written(tiny_job) -> None:
    tiny_job.status = validation_failed_status(None, "spec.x: bad", 1, "2025-01-01T00:00:00Z")
    assert compute_status(tiny_job, observed(at(5), **RUNNING)) == tiny_job.status


def test_no_restart_is_counted_once_terminal() -> None:
    job = make_job(activeDeadlineSeconds=100)
    step(job, observed(at(0), **RUNNING))
    assert step(job, observed(at(100), **RUNNING)).phase == "Failed"
    s = step(job, observed(at(101), inference=1, rollout=1, trainer=trainer_obs(failed=True)))
    assert s.phase == "Failed" and s.restarts == 0 and cond(s, "Failed").reason == "DeadlineExceeded"


def test_evaluation_in_status_and_an_early_stop_in_the_message():
    from rft_api.progress import EvalPoint, ProgressEvaluation

    job = make_job(dataset={"train": {"builtin": "arithmetic"}, "eval": {"builtin": "arithmetic", "seed": 3}},
                   evaluation={"everySteps": 5, "stopWhen": {"patience": 2}})
    ev = ProgressEvaluation(baseline=0.1, step=15, score=0.3, pass_at_k=0.5, best_step=5, best_score=0.4,
                            best_checkpoint="/checkpoints/step-000005", stop_reason="patience",
                            curve=[EvalPoint(step=0, score=0.1), EvalPoint(step=5, score=0.4)])
    running = compute_status(job, observed(trainer=trainer_obs(), progress=Progress(step=10, evaluation=ev)))
    assert running.evaluation is not None and running.evaluation.best_checkpoint == "/checkpoints/step-000005"
    assert running.evaluation.baseline == 0.1 and "curve" not in running.evaluation.model_dump()
    assert "stopped early" not in running.message
    done = compute_status(job, observed(trainer=trainer_obs(complete=True), progress=Progress(step=15, evaluation=ev,
                                                                                              done=True)))
    assert done.phase == "Succeeded" and done.evaluation is not None and done.evaluation.stop_reason == "patience"
    assert "stopped early at step 15" in done.message and "evaluation.stopWhen.patience" in done.message
    # a later record without an evaluation keeps the last one
    later = compute_status(job.model_copy(update={"status": done}), observed(trainer=trainer_obs(complete=True),
                                                                             progress=Progress(step=15, done=True)))
    assert later.evaluation == done.evaluation
