"""Events on transitions: which ones, and the Event object."""
from __future__ import annotations

from rft_api.status import Condition, RFTJobStatus
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


def test_restart_event() -> None:
    [e] = transition_events(st("Running", restarts=0), st("Running", restarts=1))
    assert (e.type, e.reason) == ("Warning", "TrainerRestarted") and "attempt 1" in e.message


def test_event_object_refers_to_the_job() -> None:
    job = {"apiVersion": "rft.dev/v1alpha1", "kind": "RFTJob",
           "metadata": {"name": "j", "namespace": "ns", "uid": "u1"}}
    [e] = transition_events(None, st("Provisioning"))
    ev = event_object(job, e, "2025-01-01T00:00:00Z")
    assert ev["involvedObject"] == {"apiVersion": "rft.dev/v1alpha1", "kind": "RFTJob", "name": "j",
                                    "namespace": "ns", "uid": "u1"}
    assert ev["metadata"] == {"generateName": "j.", "namespace": "ns"}
    assert ev["reason"] == "Provisioning" and ev["type"] == "Normal" and ev["source"] == {"component": "rft-operator"}
