"""Scheduling surfaced: a pod the scheduler cannot place (for UNSCHEDULABLE_AFTER_S or longer) and a
Deployment whose pods a ResourceQuota refuses set the role's condition (Unschedulable, QuotaExceeded,
FailedCreate) with the scheduler's or controller's words, and the job's message says so."""
from __future__ import annotations

import datetime as dt

from rft_operator import names
from rft_operator.observe import UNSCHEDULABLE_AFTER_S, observe
from rft_operator.status import compute_status
from tests.operator.support import at, make_job

SCHEDULER = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. preemption: 0/3 nodes are " \
            "available: 3 Preemption is not helpful for scheduling."


def _pod(role: str, message: str, since: dt.datetime) -> dict:
    return {"kind": "Pod", "metadata": {"name": f"tiny-arith-{role}-abc", "labels": {names.LABEL_ROLE: role}},
            "status": {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                "lastTransitionTime": since.strftime("%Y-%m-%dT%H:%M:%SZ")}]}}


def _deployment(role: str, message: str) -> dict:
    return {"kind": "Deployment", "metadata": {"name": f"tiny-arith-{role}", "generation": 1,
                                               "labels": {names.LABEL_ROLE: role}},
            "spec": {"replicas": 1}, "status": {"observedGeneration": 1, "conditions": [
                {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": message}]}}


def _condition(st, ctype: str):
    return next(c for c in st.conditions if c.type == ctype)


def test_a_trainer_pod_the_scheduler_cannot_place_is_told_after_a_while() -> None:
    now = at(100)
    job = make_job()
    fresh = observe("tiny-arith", [_pod("trainer", SCHEDULER, now - dt.timedelta(seconds=5))], now)
    assert fresh.pending == ()  # a short wait is normal (a node scaling up)
    late = observe("tiny-arith", [_pod("trainer", SCHEDULER, now - dt.timedelta(seconds=UNSCHEDULABLE_AFTER_S))], now)
    st = compute_status(job, late)
    running = _condition(st, "TrainerRunning")
    assert (running.status, running.reason) == ("False", "Unschedulable") and SCHEDULER in running.message
    assert "trainer pod tiny-arith-trainer-abc is Unschedulable: 0/3 nodes are available" in st.message


def test_a_pod_waiting_on_the_unbound_claim_is_left_to_the_claims_note() -> None:
    now = at(100)
    msg = "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims."
    obs = observe("tiny-arith", [_pod("inference", msg, now - dt.timedelta(seconds=60))], now)
    assert obs.pending == ()


def test_a_deployment_whose_pods_a_quota_refuses_is_quota_exceeded() -> None:
    quota = ('pods "tiny-arith-rollout-7d9-x" is forbidden: exceeded quota: team-a, requested: requests.cpu=2, '
             "used: requests.cpu=8, limited: requests.cpu=8")
    obs = observe("tiny-arith", [_deployment("rollout", quota), _deployment("inference", "admission webhook denied")],
                  at(0))
    assert [(p.role, p.reason) for p in obs.pending] == [("inference", "FailedCreate"), ("rollout", "QuotaExceeded")]
    st = compute_status(make_job(), obs)
    rollout = _condition(st, "RolloutReady")
    assert (rollout.status, rollout.reason) == ("False", "QuotaExceeded") and "exceeded quota: team-a" in rollout.message
    assert _condition(st, "InferenceReady").reason == "FailedCreate"
    assert "(and 1 more)" in st.message
