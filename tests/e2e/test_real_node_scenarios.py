"""The e2e scenarios on the real node (``e2e/node.py``): the operator from the chart running from its
image, every role from the runtime image with the securityContext the builders declare, enforced by
runc (non-root uid, no capabilities, RuntimeDefault seccomp, read-only root file system)."""

from __future__ import annotations

import json

import pytest

from rft_operator.builders.common import RUN_AS
from tests.e2e.stack import EXAMPLES, JobDriver, _pod_ready, driver, example_job  # noqa: F401 (fixtures)
from tests.e2e.test_scenarios import (  # noqa: F401 (collected here too, on the real node)
    test_code_sandbox_evaluator_in_the_reward_role,
    test_custom_evaluator_file_from_configmap,
    test_tiny_arith_example_trains_to_succeeded,
)

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]


@pytest.fixture(scope="module")
def platform(real_platform):
    """The scenarios' ``platform``, on the real node."""
    return real_platform


@pytest.mark.timeout(900)
def test_rollout_pod_runs_as_the_builders_uid_from_the_runtime_image(driver: JobDriver) -> None:
    """``kubectl exec`` into a running rollout pod of scenario 01: ``id -u`` is the builders' uid (not
    0); the file system is the runtime image's (its venv, its prebuilt models), not this checkout."""
    job = "tiny-arith-exec"
    driver.apply_docs(example_job(EXAMPLES / "01-tiny-arith.yaml", job, trainer={"maxSteps": 200}))
    driver.wait_step(job, 1, 600)
    ready = [p for p in driver.pods(job, "rollout") if _pod_ready(p)]
    assert ready, driver.diagnostics(job)
    name = ready[0]["metadata"]["name"]
    uid = driver.kubectl("exec", name, "--", "id", "-u").stdout.strip()
    assert uid == str(RUN_AS) != "0"
    probe = driver.kubectl("exec", name, "--", "python", "-c",
                           "import os, json, sys; print(json.dumps({'exe': sys.executable, "
                           "'models': os.listdir('/opt/rft/models'), 'root': sorted(os.listdir('/')), "
                           "'caps': [l for l in open('/proc/self/status') if l.startswith(('CapEff', 'Seccomp:'))]}))"
                           ).stdout
    got = json.loads(probe)
    assert got["exe"].startswith("/opt/venv/"), got
    assert got["models"], "the runtime image's prebuilt models are missing"
    assert "work" not in got["root"], got["root"]
    assert "CapEff:\t0000000000000000\n" in got["caps"] and "Seccomp:\t2\n" in got["caps"], got["caps"]
    ro = driver.kubectl("exec", name, "--", "touch", "/opt/x", check=False)
    assert ro.returncode != 0
    driver.kubectl("delete", "rftjob", job, "--wait=false")


@pytest.mark.timeout(2400)
def test_model_from_volume_example(driver: JobDriver) -> None:
    """``examples/05-model-from-volume.yaml``: a Job writes a Hugging Face-format tiny model into a claim
    (``rft make-tiny-model``); the RFTJob names it (not ``builtin:*``); inference, rollout and trainer
    read it from the claim, and the job reaches Succeeded."""
    from tests.e2e.stack import load_docs

    docs = load_docs(EXAMPLES / "05-model-from-volume.yaml")
    driver.apply_docs([d for d in docs if d["kind"] != "RFTJob"])
    made = driver.kubectl("wait", "--for=condition=Complete", "job/make-tiny-model", "--timeout=900s",
                          timeout=960, check=False)
    assert made.returncode == 0, f"the model Job did not complete: {made.stderr}\n{driver.diagnostics()}"
    (job_doc,) = [d for d in docs if d["kind"] == "RFTJob"]
    job = job_doc["metadata"]["name"]
    driver.apply_docs([job_doc])
    wait = driver.kubectl("wait", "--for=condition=Succeeded", f"rftjob/{job}", "--timeout=1200s", timeout=1260,
                          check=False)
    assert wait.returncode == 0, f"kubectl wait failed: {wait.stderr}\n{driver.diagnostics(job)}"
    st = driver.status(job)
    assert st["phase"] == "Succeeded" and st["step"] == job_doc["spec"]["trainer"]["maxSteps"], st
    rows = driver.metrics_rows(job)
    assert [r["step"] for r in rows] == list(range(1, st["step"] + 1))
