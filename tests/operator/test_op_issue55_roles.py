"""#55, seen through pure observation and policies: a Deployment role's container crash-looping is
told at once in its role's condition and fails the job (RoleCrashLooping) past its grace; a pod that
cannot start because the job's token Secret is missing is not PodCannotStart (the reconcile mints a
new token and restarts every role)."""
from __future__ import annotations

import pytest

from rft_operator import names
from rft_operator import observe as observe_mod
from rft_operator.observe import observe
from rft_operator.status import compute_status
from tests.operator.support import at, make_job


def _rollout_deployment() -> dict:
    return {"kind": "Deployment", "metadata": {"name": "tiny-arith-rollout", "generation": 1,
                                               "labels": {names.LABEL_ROLE: "rollout"}},
            "spec": {"replicas": 1}, "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1}}


def _looping_pod(restarts: int, not_ready_since: str = "2025-01-01T12:00:00Z") -> dict:
    return {"kind": "Pod", "metadata": {"name": "tiny-arith-rollout-abc", "labels": {names.LABEL_ROLE: "rollout"}},
            "status": {"conditions": [{"type": "ContainersReady", "status": "False",
                                       "lastTransitionTime": not_ready_since}],
                       "containerStatuses": [{
                           "name": "rollout", "restartCount": restarts,
                           "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
                           "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                                        "message": "Traceback ...\nKeyError: 'prompt'\n"}}}]}}


def _cond(status, ctype):
    return next(c for c in status.conditions if c.type == ctype)


def test_a_crash_looping_rollout_pod_is_told_at_once_in_its_condition() -> None:
    job = make_job()
    s = compute_status(job, observe("tiny-arith", [_rollout_deployment(), _looping_pod(2)], at(60)))
    c = _cond(s, "RolloutReady")
    assert s.phase != "Failed"
    assert c.status == "False" and c.reason == "CrashLoopBackOff"
    assert "tiny-arith-rollout-abc" in c.message and "container rollout" in c.message
    assert "KeyError: 'prompt'" in c.message and "2 restarts" in c.message
    assert "CrashLoopBackOff" in s.message


@pytest.mark.parametrize("restarts, seconds", [(observe_mod.CRASHLOOP_RESTART_LIMIT, 60),
                                               (1, observe_mod.CRASHLOOP_GRACE_S)])
def test_a_role_crash_looping_past_its_grace_fails_the_job(restarts: int, seconds: float) -> None:
    job = make_job()
    s = compute_status(job, observe("tiny-arith", [_rollout_deployment(), _looping_pod(restarts)], at(seconds)))
    failed = _cond(s, "Failed")
    assert s.phase == "Failed" and failed.reason == "RoleCrashLooping"
    assert "tiny-arith-rollout-abc" in failed.message and "KeyError: 'prompt'" in failed.message


def test_a_crash_looping_trainer_pod_is_not_a_role_crash_loop() -> None:
    pod = _looping_pod(9)
    pod["metadata"]["labels"][names.LABEL_ROLE] = "trainer"
    assert observe("tiny-arith", [pod], at(0)).crashloops == ()


def test_a_missing_token_secret_is_not_a_pod_that_cannot_start() -> None:
    pod = {"kind": "Pod", "metadata": {"name": "tiny-arith-rollout-abc", "labels": {names.LABEL_ROLE: "rollout"}},
           "status": {"containerStatuses": [{"name": "rollout", "state": {"waiting": {
               "reason": "CreateContainerConfigError", "message": 'secret "tiny-arith-token" not found'}}}]}}
    obs = observe("tiny-arith", [_rollout_deployment(), pod], at(0))
    assert obs.token_missing and obs.pod_problems == ()
    assert compute_status(make_job(), obs).phase != "Failed"
    other = {**pod, "status": {"containerStatuses": [{"name": "rollout", "state": {"waiting": {
        "reason": "CreateContainerConfigError", "message": 'secret "someone-else" not found'}}}]}}
    obs = observe("tiny-arith", [other], at(0))
    assert not obs.token_missing and obs.pod_problems[0].reason == "CreateContainerConfigError"


def test_an_existing_claim_is_held_only_by_a_live_job() -> None:
    from rft_operator.policies import claim

    pvc = {"metadata": {"name": "shared", "resourceVersion": "7",
                        "annotations": {names.ANNOTATION_USED_BY: claim.mark("first", "u1")}}}
    assert claim.holder(pvc) == ("first", "u1") and claim.holder({"metadata": {}}) is None
    running = {"metadata": {"name": "first", "uid": "u1"}, "status": {"phase": "Running"}}
    assert claim.live(running, "u1")
    assert not claim.live(running, "u2")  # a new job of the same name is not the holder
    assert not claim.live({**running, "status": {"phase": "Succeeded"}}, "u1")
    assert not claim.live(None, "u1")
    assert not claim.live({"metadata": {"name": "first", "uid": "u1", "deletionTimestamp": "x"}}, "u1")
    assert claim.mark_patch(pvc, None) == {"metadata": {"resourceVersion": "7",
                                                        "annotations": {names.ANNOTATION_USED_BY: None}}}
    assert "RFTJob first" in claim.in_use("shared", "first").message


def _claim(annotations: dict | None = None) -> dict:
    return {"kind": "PersistentVolumeClaim",
            "metadata": {"name": names.checkpoints("tiny-arith"), "creationTimestamp": "2025-01-01T12:00:00Z",
                         "annotations": annotations or {}, "labels": {names.LABEL_ROLE: "checkpoints"}},
            "status": {"phase": "Pending"}}


def _unschedulable_trainer() -> dict:
    return {"kind": "Pod", "metadata": {"name": "tiny-arith-trainer-0-x", "labels": {names.LABEL_ROLE: "trainer"}},
            "status": {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims."}]}}


def test_an_unbound_claim_is_named_then_fails_the_job_past_its_grace() -> None:
    job = make_job()
    s = compute_status(job, observe("tiny-arith", [_claim(), _unschedulable_trainer()], at(60)))
    assert s.phase != "Failed" and names.checkpoints("tiny-arith") in s.message and "unbound immediate" in s.message
    s = compute_status(job, observe("tiny-arith", [_claim(), _unschedulable_trainer()],
                                    at(observe_mod.CLAIM_BIND_GRACE_S)))
    failed = _cond(s, "Failed")
    assert s.phase == "Failed" and failed.reason == "ClaimNotBound" and names.checkpoints("tiny-arith") in failed.message
    # WaitForFirstConsumer: a node was selected and the provisioner still failed
    s = compute_status(job, observe("tiny-arith", [_claim({observe_mod.SELECTED_NODE: "n1"})],
                                    at(observe_mod.CLAIM_BIND_GRACE_S)))
    assert s.phase == "Failed" and _cond(s, "Failed").reason == "ClaimNotBound"


def test_a_claim_waiting_for_its_first_consumer_is_not_a_failure() -> None:
    s = compute_status(make_job(), observe("tiny-arith", [_claim()], at(10 * observe_mod.CLAIM_BIND_GRACE_S)))
    assert s.phase != "Failed" and "not bound" not in s.message
    bound = {**_claim(), "status": {"phase": "Bound"}}
    assert observe("tiny-arith", [bound, _unschedulable_trainer()], at(10 * observe_mod.CLAIM_BIND_GRACE_S)).claim is None
