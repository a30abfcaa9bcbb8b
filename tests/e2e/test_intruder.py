"""A pod of the job's own namespace that is not the job's (no job token) attacks its data plane on the
real node: it resolves the job's Services through the cluster DNS and sends what a rollout worker or
the trainer would send — completions, a weight reload pointing at its own directory, a lease, forged
episodes, the coordinator's status with its tasks — without a token and with a wrong one. Every one
is refused with 401 by the servers themselves (this node's CNI enforces no NetworkPolicy, so the
job token is the boundary tested here), while ``/health`` stays open for the kubelet, and the job
trains on to the end unharmed: its policy version never moved off the trainer's.
"""

from __future__ import annotations

import json

import pytest

from rft_api.constants import DEFAULT_RUNTIME_IMAGE
from rft_operator import names
from rft_operator.builders.common import RUN_AS
from tests.e2e.stack import EXAMPLES, JobDriver, example_job, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

ATTACK = r"""
import json, os, httpx
job, inf, trainer = os.environ["JOB"], os.environ["INFERENCE_URL"], os.environ["COORDINATOR_URL"]
forged = {"id": "t0:0", "task_id": "t0", "rollout_idx": 0, "trajectories": [{"name": "default", "reward": 1.0,
          "steps": [{"prompt_ids": [1], "response_ids": [2], "logprobs": [-0.1], "response_mask": [1],
                     "finish_reason": "stop", "policy_version": 0}]}]}
attempts = [
    ("completions", "POST", inf + "/v1/completions", {"model": job, "prompt": [1, 2, 3], "max_tokens": 2}),
    ("tokenize", "POST", inf + "/tokenize", {"model": job, "prompt": "hi"}),
    ("reload", "POST", inf + "/update_weights_from_disk", {"model_path": "/tmp/evil", "policy_version": 999}),
    ("version", "GET", inf + "/get_policy_version", None),
    ("lease", "POST", trainer + "/v1/lease", {"worker_id": "intruder", "max_tasks": 4}),
    ("episodes", "POST", trainer + "/v1/episodes", {"worker_id": "intruder", "episodes": [forged]}),
    ("status", "GET", trainer + "/v1/status", None),
]
out = {}
for name, method, url, body in attempts:
    for label, headers in (("none", {}), ("wrong", {"Authorization": "Bearer not-the-token"})):
        try:
            r = httpx.request(method, url, json=body, headers=headers, timeout=30)
            out[f"{name}/{label}"] = r.status_code
        except httpx.HTTPError as e:
            out[f"{name}/{label}"] = f"{type(e).__name__}: {e}"
out["health"] = httpx.get(inf + "/health", timeout=60).status_code
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.mark.timeout(1800)
def test_a_pod_without_the_job_token_is_refused_by_every_data_plane_server(driver: JobDriver) -> None:
    # long enough that the servers are still up when the intruder pod runs (it starts in ~30 s; a step
    # of 4 prompts takes well under a second on an idle machine)
    job, steps = "intruded", 200
    driver.apply_docs(example_job(EXAMPLES / "01-tiny-arith.yaml", job, trainer={"maxSteps": steps},
                                  rollout={"promptsPerStep": 4, "samplesPerPrompt": 4},
                                  checkpoint={"everySteps": 50}))
    driver.wait_step(job, 1, 600)
    # the Service URLs the job's own pods use, from the runtime config the operator wrote
    config = driver.api.get("ConfigMap", driver.namespace, names.config(job))
    assert config is not None
    endpoints = json.loads(config["data"][names.CONFIG_KEY])["endpoints"]
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "intruder"},
        "spec": {
            "restartPolicy": "Never", "automountServiceAccountToken": False, "enableServiceLinks": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "attack", "image": DEFAULT_RUNTIME_IMAGE, "imagePullPolicy": "Never",
                "command": ["python", "-c", ATTACK],
                "env": [{"name": "JOB", "value": job}, {"name": "INFERENCE_URL", "value": endpoints["inference"][0]},
                        {"name": "COORDINATOR_URL", "value": endpoints["coordinator"]}],
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }
    driver.apply_docs([pod])

    def result() -> dict | None:
        got = driver.api.get("Pod", driver.namespace, "intruder")
        if got is None or (got.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            return None
        logs = driver.logs(got)
        line = next((ln for ln in logs.splitlines() if ln.startswith("RESULT ")), None)
        assert line, f"the intruder pod ended without a result:\n{logs[-3000:]}"
        return json.loads(line.removeprefix("RESULT "))
    out = wait_for("the intruder pod's result", result, 300, interval=1.0, on_timeout=lambda: driver.diagnostics(job))
    assert driver.progress(job)["step"] < steps, "the job ended before the intruder was done: nothing was attacked"
    refused = {k: v for k, v in out.items() if k != "health"}
    if not (len(refused) == 14 and all(v == 401 for v in refused.values()) and out["health"] == 200):
        pytest.fail("every data-plane call without the job token must get 401, /health 200: "
                    + json.dumps(out, indent=1))

    st = driver.wait_phase(job, "Succeeded", 900)
    assert st["step"] == steps and st["policyVersion"] == steps, st
    assert [r["step"] for r in driver.metrics_rows(job)] == list(range(1, steps + 1))
