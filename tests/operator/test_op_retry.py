"""A Failed job retried in place (policies.retry): by the rft.dev/retry annotation kubectl rft resume
sets, or by a spec edit; it becomes a new trainer attempt that resumes from the latest checkpoint, with
a fresh restart budget, and status.retry records the failure it came from."""
from __future__ import annotations

from rft_api.constants import RETRY_ANNOTATION
from rft_operator import names
from rft_operator.observe import observe
from rft_operator.policies import failure, retry
from rft_operator.policies.failure import TrainerAction
from rft_operator.status import compute_status
from tests.operator.support import at, make_job

TERMINAL = [("Failed", "PodFailurePolicy", "Container trainer for pod x failed with exit code 2")]


def _trainer_job(attempt: str, conditions=TERMINAL) -> dict:
    return {"kind": "Job", "metadata": {"name": "tiny-arith-trainer", "annotations": {names.ANNOTATION_ATTEMPT: attempt}},
            "spec": {"parallelism": 1},
            "status": {"conditions": [{"type": t, "status": "True", "reason": r, "message": m} for t, r, m in conditions]}}


def _trainer_pod(message: str) -> dict:
    return {"kind": "Pod", "metadata": {"name": "tiny-arith-trainer-0-abc", "labels": {names.LABEL_ROLE: "trainer"}},
            "status": {"containerStatuses": [{"name": "trainer", "state": {"terminated": {
                "exitCode": 2, "message": message}}}]}}


def _failed_job(generation: int = 1, **kw):
    """A job that failed terminally (the trainer's NonFiniteTraining) at ``generation``."""
    job = make_job(generation=generation, **kw)
    obs = observe("tiny-arith", [_trainer_job("0"), _trainer_pod("rft trainer: NonFiniteTraining: 3 steps\n")], at(0))
    job.status = compute_status(job, obs)
    assert job.status.phase == "Failed" and job.status.observed_generation == generation
    return job, obs


def test_a_failed_job_stays_failed_until_asked() -> None:
    job, obs = _failed_job()
    assert retry.requested(job) is None
    again = compute_status(job, obs)
    assert again.phase == "Failed" and again.retry is None


def test_the_retry_annotation_reopens_it_as_a_new_attempt_with_the_failure_recorded() -> None:
    job, obs = _failed_job()
    job.metadata["annotations"] = {RETRY_ANNOTATION: "1"}
    st = compute_status(job, obs)
    assert st.phase == "Provisioning" and st.restarts == 1 and st.completion_time is None
    assert st.retry is not None and (st.retry.count, st.retry.restarts_at_retry) == (1, 1)
    assert st.retry.failure.startswith("NonFiniteTraining: ") and "retried (annotation rft.dev/retry=1)" in st.message
    failed = next(c for c in st.conditions if c.type == "Failed")
    assert failed.status == "False"
    # the failed Job of attempt 0 is stale now: it goes, and attempt 1 is created in its place
    assert failure.trainer_action(obs.trainer, st.restarts) is TrainerAction.DELETE_STALE
    # the same annotation does not retry twice
    job.status = st.model_copy(update={"phase": "Failed"})
    assert retry.requested(job) is None
    job.metadata["annotations"] = {RETRY_ANNOTATION: "2"}
    assert retry.requested(job) == (f"annotation {RETRY_ANNOTATION}=2", 2)
    job.metadata["annotations"] = {RETRY_ANNOTATION: "not a number"}
    assert retry.requested(job) is None


def test_a_spec_edit_retries_it() -> None:
    job, obs = _failed_job(generation=3)
    job.metadata["generation"] = 4
    st = compute_status(job, obs)
    assert st.phase == "Provisioning" and st.retry is not None and st.retry.count == 1
    assert "the spec was edited (generation 4)" in st.message


def test_the_restart_budget_counts_from_the_retry() -> None:
    job, _ = _failed_job(restartLimit=1)
    job.metadata["annotations"] = {RETRY_ANNOTATION: "1"}
    crashed = [("Failed", "BackoffLimitExceeded", "")]
    job.status = compute_status(job, observe("tiny-arith", [_trainer_job("0")], at(0)))
    assert job.status.restarts == 1
    # attempt 1 crashes: one restart left in the budget counted from the retry
    job.status = compute_status(job, observe("tiny-arith", [_trainer_job("1", crashed)], at(1)))
    assert job.status.phase != "Failed" and job.status.restarts == 2
    job.status = compute_status(job, observe("tiny-arith", [_trainer_job("2", crashed)], at(2)))
    assert job.status.phase == "Failed" and "since the job was retried" in job.status.message


def test_validation_failed_and_succeeded_are_not_retried() -> None:
    job, _ = _failed_job()
    job.metadata["annotations"] = {RETRY_ANNOTATION: "5"}
    for phase in ("ValidationFailed", "Succeeded"):
        job.status = job.status.model_copy(update={"phase": phase})
        assert retry.requested(job) is None


def test_an_earlier_attempts_evaluator_record_is_no_verdict_on_the_retried_job() -> None:
    from rft_api.progress import Progress

    spec = make_job().spec
    p = Progress.model_validate({"samplesScored": 512, "errors": {"runtimeErrors": 512}, "attempt": 0})
    assert failure.evaluator_failure(spec, p, attempt=0) is not None
    assert failure.evaluator_failure(spec, p, attempt=1) is None
