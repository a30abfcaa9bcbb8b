"""Events on transitions: which ones, and the Event object."""
from __future__ import annotations

from rft_api.status import CheckpointRecord, Condition, RFTJobStatus
from rft_operator.events import event_object, transition_events


def st(phase: str, restarts: int = 0, failed_reason: str = "", message: str = "m") -> RFTJobStatus:
    conds = [Condition(type="Failed", status="True" if failed_reason else "False", reason=failed_reason or "NoFailure")]
    return RFTJobStatus(phase=phase, restarts=restarts, conditions=conds, message=message)


def test_no_change_no_event() -> None:
    assert transition_events(st("Running"), st("Running")) == []


def test_phase_transitions() -> None:
    [e] = transition_events(None, st("Provisioning"))
    assert (e.type, e.reason) == ("Normal", "Provisioning")
    [e] = transition_events(st("Provisioning"), st("Running", message="the trainer is running"))
    assert (e.type, e.reason, e.message) == ("Normal", "Running", "the trainer is running")
    [e] = transition_events(st("Running"), st("Failed", failed_reason="DeadlineExceeded"))
    assert (e.type, e.reason) == ("Warning", "DeadlineExceeded")
    [e] = transition_events(None, st("ValidationFailed", failed_reason="InvalidSpec", message="spec.x: bad"))
    assert (e.type, e.reason, e.message) == ("Warning", "InvalidSpec", "spec.x: bad")
    resumed = transition_events(st("Suspended"), st("Provisioning"))
    assert [e.reason for e in resumed] == ["Resumed", "Provisioning"]


def test_restart_event_names_its_cause_and_the_checkpoint_it_resumes_from() -> None:
    [e] = transition_events(st("Running", restarts=0), st("Running", restarts=1))
    assert (e.type, e.reason) == ("Warning", "TrainerRestarted") and "attempt 1" in e.message
    assert "the start (no checkpoint yet)" in e.message
    before = st("Running")
    before.last_checkpoint = CheckpointRecord(step=4, path="step-4")
    after = st("Running", restarts=1)
    after.last_checkpoint = before.last_checkpoint
    [e] = transition_events(before, after, cause="tiny-arith-trainer-0-x/trainer exited 137 (OOMKilled)")
    assert "OOMKilled" in e.message and "checkpoint of step 4" in e.message


def test_each_new_checkpoint_is_an_event() -> None:
    before, after = st("Running"), st("Running")
    before.last_checkpoint = CheckpointRecord(step=2, path="step-2")
    after.last_checkpoint = CheckpointRecord(step=3, path="step-3")
    [e] = transition_events(before, after)
    assert (e.type, e.reason) == ("Normal", "CheckpointSaved") and "step 3" in e.message and "step-3" in e.message
    assert transition_events(after, after) == []


def test_event_object_refers_to_the_job() -> None:
    job = {"apiVersion": "rft.dev/v1alpha1", "kind": "RFTJob",
           "metadata": {"name": "j", "namespace": "ns", "uid": "u1"}}
    [e] = transition_events(None, st("Provisioning"))
    ev = event_object(job, e, "2025-01-01T00:00:00Z")
    assert ev["involvedObject"] == {"apiVersion": "rft.dev/v1alpha1", "kind": "RFTJob", "name": "j",
                                    "namespace": "ns", "uid": "u1"}
    assert ev["metadata"] == {"generateName": "j.", "namespace": "ns"}
    assert ev["reason"] == "Provisioning" and ev["type"] == "Normal" and ev["source"] == {"component": "rft-operator"}


def test_restart_cause_comes_from_the_failed_trainer_pods() -> None:
    import datetime as dt

    from rft_operator.observe import observe
    from rft_operator.reconcile import restart_cause

    pod = {"kind": "Pod", "metadata": {"name": "j-trainer-0-abc", "labels": {"app.kubernetes.io/instance": "j",
                                                                              "rft.dev/role": "trainer"}},
           "status": {"containerStatuses": [{"name": "trainer", "state": {"terminated": {
               "exitCode": 137, "reason": "OOMKilled"}}}]}}
    observed = observe("j", [pod], dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc))
    assert restart_cause(observed) == "j-trainer-0-abc/trainer exited 137 (OOMKilled)"
