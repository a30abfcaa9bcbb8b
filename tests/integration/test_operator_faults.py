"""Errors that a retry cannot fix fail the job at once, naming the cause, without using the restart
budget: a trainer exiting with the terminal status (the Job's pod failure policy), and a pod whose
image cannot be pulled."""
from __future__ import annotations

import pytest

from rft_operator import names
from tests.operator.cluster_support import (  # noqa: F401
    api,
    crd,
    create_job,
    finish_trainer,
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


def test_a_pod_that_cannot_pull_its_image_fails_the_job(api, operator, namespace) -> None:
    create_job(api, namespace, job_manifest(JOB))
    (pod,) = wait_for("an inference pod", lambda: pods_of(api, namespace, JOB, "inference"))
    c = pod["spec"]["containers"][0]
    api.patch("Pod", namespace, pod["metadata"]["name"], {"status": {"phase": "Pending", "containerStatuses": [{
        "name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 0,
        "state": {"waiting": {"reason": "ImagePullBackOff",
                              "message": f'Back-off pulling image "{c["image"]}"'}}}]}}, subresource="status")
    obj = wait_phase(api, namespace, JOB, "Failed", timeout=60)
    f = cond(obj, "Failed")
    assert f["reason"] == "PodCannotStart" and obj["status"]["restarts"] == 0, f
    assert "ImagePullBackOff" in f["message"] and c["image"] in f["message"], f
    assert names.inference(JOB) in f["message"]
