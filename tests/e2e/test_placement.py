"""Placement on the real node (``spec.<role>.pod``): a job whose every role selects a node pool and
tolerates its taint waits, Unschedulable with the scheduler's words in its trainer condition, while no
node is in the pool; once the node joins the pool (labelled, still tainted) every role is scheduled
there and the job runs. The node's label and taint are removed afterwards, whatever happens."""
from __future__ import annotations

import json

import pytest

from tests.e2e.stack import EXAMPLES, JobDriver, example_job
from tests.support.polling import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

POOL_KEY, POOL = "rft.dev/e2e-pool", "placement"
START_S = 300.0


def _pod_overrides() -> dict:
    return {"nodeSelector": {POOL_KEY: POOL},
            "tolerations": [{"key": POOL_KEY, "operator": "Equal", "value": POOL, "effect": "NoSchedule"}]}


def _condition(status: dict, ctype: str) -> dict:
    return next((c for c in status.get("conditions") or [] if c["type"] == ctype), {})


@pytest.mark.timeout(900)
def test_a_job_placed_on_a_tainted_pool_waits_unschedulable_then_runs_there(driver: JobDriver) -> None:
    job = "placed"
    node = driver.cluster.kubectl("get", "nodes", "-o", "jsonpath={.items[0].metadata.name}").stdout.strip()
    pod = _pod_overrides()
    driver.cluster.kubectl("taint", "nodes", node, f"{POOL_KEY}={POOL}:NoSchedule", "--overwrite")
    try:
        driver.apply_docs(example_job(EXAMPLES / "01-tiny-arith.yaml", job, trainer={"maxSteps": 3, "pod": pod},
                                      inference={"pod": pod}, rollout={"pod": pod}))
        st = wait_for("the trainer Unschedulable in its condition", lambda: (
            s if _condition(s := driver.status(job), "TrainerRunning").get("reason") == "Unschedulable" else None),
            120, on_timeout=lambda: driver.diagnostics(job))
        cond = _condition(st, "TrainerRunning")
        assert "node(s) didn't match Pod's node affinity/selector" in cond["message"], cond
        assert "is Unschedulable" in st["message"] and st["phase"] in ("Pending", "Provisioning"), st
        driver.cluster.kubectl("label", "nodes", node, f"{POOL_KEY}={POOL}", "--overwrite")
        driver.wait_phase(job, "Running", START_S)
        for role in ("trainer", "inference", "rollout"):
            for p in driver.pods(job, role):
                assert p["spec"]["nodeName"] == node and p["spec"]["nodeSelector"][POOL_KEY] == POOL, role
                assert {"key": POOL_KEY, "operator": "Equal", "value": POOL, "effect": "NoSchedule"} in \
                    p["spec"]["tolerations"], json.dumps(p["spec"]["tolerations"])
        assert _condition(driver.status(job), "TrainerRunning").get("reason") != "Unschedulable"
    finally:
        driver.cluster.kubectl("taint", "nodes", node, f"{POOL_KEY}-", check=False)
        driver.cluster.kubectl("label", "nodes", node, f"{POOL_KEY}-", check=False)
        driver.kubectl("delete", "rftjob", job, "--wait=false", check=False)
