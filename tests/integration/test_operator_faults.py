"""Errors that a retry cannot fix fail the job at once, naming the cause, without using the restart
budget: a trainer exiting with the terminal status (the Job's pod failure policy), and a pod whose
image does not exist. A pull error a retry may cure (a registry answering 429) fails the job only after
the pull grace."""
from __future__ import annotations

import time

import pytest

from rft_operator import names
from rft_operator.observe import PULL_ERROR_GRACE_S
from tests.operator.cluster_support import (  # noqa: F401
    api,
    crd,
    create_job,
    finish_trainer,
    get_job,
    job_manifest,
    make_role_ready,
    operator,
    pods_of,
    set_pod_phase,
    wait_phase,
)
from tests.support.polling import wait_for

pytestmark = pytest.mark.cluster
JOB = "tiny-arith"


def cond(obj: dict, ctype: str) -> dict:
    return next(c for c in obj["status"]["conditions"] if c["type"] == ctype)


def test_trainer_terminal_exit_fails_without_the_restart_budget(api, operator, namespace) -> None:
    create_job(api, namespace, job_manifest(JOB, restartLimit=3))
    make_role_ready(api, namespace, JOB, "trainer")
    (pod,) = wait_for("the trainer pod", lambda: pods_of(api, namespace, JOB, "trainer"))
    set_pod_phase(api, pod, "Failed", exit_code=2)
    obj = wait_phase(api, namespace, JOB, "Failed", timeout=60)
    f = cond(obj, "Failed")
    assert f["reason"] == "TrainerTerminalError" and obj["status"]["restarts"] == 0, f
    assert "exit code 2" in f["message"], f


def _pull_error(api, namespace: str, pod: dict, reason: str, message: str, not_ready_since: str = "") -> None:
    """Write the status a kubelet writes for a container whose image pull failed (``not_ready_since``:
    when its containers stopped being ready, the start of the pull grace)."""
    c = pod["spec"]["containers"][0]
    status: dict = {"phase": "Pending", "containerStatuses": [{
        "name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 0,
        "state": {"waiting": {"reason": reason, "message": message}}}]}
    if not_ready_since:
        status["conditions"] = [{"type": "ContainersReady", "status": "False", "lastTransitionTime": not_ready_since}]
    api.patch("Pod", namespace, pod["metadata"]["name"], {"status": status}, subresource="status")


def test_a_pod_whose_image_does_not_exist_fails_the_job_at_once(api, operator, namespace) -> None:
    create_job(api, namespace, job_manifest(JOB))
    (pod,) = wait_for("an inference pod", lambda: pods_of(api, namespace, JOB, "inference"))
    image = pod["spec"]["containers"][0]["image"]
    _pull_error(api, namespace, pod, "ErrImagePull",
                f'failed to pull and unpack image "{image}": failed to resolve reference "{image}": {image}: not found')
    obj = wait_phase(api, namespace, JOB, "Failed", timeout=60)
    f = cond(obj, "Failed")
    assert f["reason"] == "PodCannotStart" and obj["status"]["restarts"] == 0, f
    assert "ErrImagePull" in f["message"] and f"{image}: not found" in f["message"], f
    assert names.inference(JOB) in f["message"]


def test_a_rate_limited_pull_waits_and_fails_only_after_the_pull_grace(api, operator, namespace) -> None:
    """Issue #55: a registry answering 429 does not end the run; the job says it waits on the pull. The
    same error that outlasted the grace (``PULL_ERROR_GRACE_S``, here backdated) fails it as PodCannotStart."""
    create_job(api, namespace, job_manifest(JOB))
    (pod,) = wait_for("an inference pod", lambda: pods_of(api, namespace, JOB, "inference"))
    msg = "failed to copy: httpReadSeeker: failed open: unexpected status code: 429 Too Many Requests"
    _pull_error(api, namespace, pod, "ErrImagePull", msg)

    def waiting() -> dict | None:
        obj = get_job(api, namespace, JOB)
        return obj if "waiting on an image pull" in (obj.get("status") or {}).get("message", "") else None

    obj = wait_for("the job's message to name the pull", waiting, 60)
    assert obj["status"]["phase"] != "Failed" and msg in obj["status"]["message"], obj["status"]
    time.sleep(3)  # a few reconciles later, still waiting
    assert get_job(api, namespace, JOB)["status"]["phase"] != "Failed"
    past = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - PULL_ERROR_GRACE_S - 60))
    image = pod["spec"]["containers"][0]["image"]
    _pull_error(api, namespace, pod, "ImagePullBackOff", f'Back-off pulling image "{image}"', not_ready_since=past)
    obj = wait_phase(api, namespace, JOB, "Failed", timeout=60)
    f = cond(obj, "Failed")
    assert f["reason"] == "PodCannotStart" and "ImagePullBackOff" in f["message"] and obj["status"]["restarts"] == 0, f


def test_a_preempted_trainer_rank_does_not_spend_a_restart(api, operator, namespace) -> None:
    """Issue #55: with two trainer nodes, rank 1 is preempted (``DisruptionTarget``: the Job's pod failure
    policy ignores it) and rank 0 then fails on its collective, failing the Job: the operator recreates the
    trainer Job, same attempt, and ``status.restarts`` stays 0."""
    doc = job_manifest(JOB, restartLimit=3)
    doc["spec"]["trainer"]["nodes"] = 2
    create_job(api, namespace, doc)
    make_role_ready(api, namespace, JOB, "trainer", want=2)
    first = {p["metadata"]["uid"] for p in pods_of(api, namespace, JOB, "trainer")}
    rank0, rank1 = sorted(pods_of(api, namespace, JOB, "trainer"), key=lambda p: p["metadata"]["name"])
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    c = rank1["spec"]["containers"][0]
    api.patch("Pod", namespace, rank1["metadata"]["name"], {"status": {  # one write, as the kubelet's
        "phase": "Failed", "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
             "message": "Preempted in order to admit critical pod", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "False", "lastTransitionTime": now},
            {"type": "Ready", "status": "False", "lastTransitionTime": now}],
        "containerStatuses": [{"name": c["name"], "image": c["image"], "imageID": "", "ready": False,
                               "restartCount": 0, "state": {"terminated": {
                                   "exitCode": 143, "reason": "Error", "startedAt": now, "finishedAt": now}}}]}},
        subresource="status")
    time.sleep(2)  # the Job controller has ignored rank 1 before rank 0 fails
    set_pod_phase(api, rank0, "Failed", exit_code=1)

    def recreated() -> list[dict]:
        pods = pods_of(api, namespace, JOB, "trainer")
        return [p for p in pods if p["metadata"]["uid"] not in first
                and p["metadata"].get("annotations", {}).get(names.ANNOTATION_ATTEMPT) == "0"] if pods else []

    wait_for("the trainer Job of attempt 0 recreated", lambda: len(recreated()) == 2 and recreated(), 90)
    obj = get_job(api, namespace, JOB)
    assert obj["status"]["restarts"] == 0 and obj["status"]["phase"] != "Failed", obj["status"]
