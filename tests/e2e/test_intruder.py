"""Pods of the job's own namespace that are not the job's attack its data plane on the real node,
whose network enforces NetworkPolicies (kube-router, ``e2e/node.py``). Each resolves the job's
Services through the cluster DNS and sends what a rollout worker or the trainer would send —
completions, a weight reload pointing at its own directory, a lease, forged episodes, the
coordinator's status with its tasks — without a token and with a wrong one:

- an unlabelled pod is stopped by the network: none of its connections gets an HTTP answer (the job's
  ingress policies admit only the job's own pods), though its DNS lookups of the Services work;
- a pod carrying the job's rollout labels (anyone who may create pods in the namespace can do that)
  passes the network rules once the network has programmed them for the new pod (it waits for that,
  as the job's own clients do by retrying) and meets the second boundary: every call is answered 401 by the servers
  themselves, while ``/health`` stays open.

The job trains on to the end unharmed: its policy version never moved off the trainer's.
"""

from __future__ import annotations

import json

import pytest

from rft_operator import names
from rft_operator.builders.common import DEFAULT_RUNTIME_IMAGE, RUN_AS
from tests.e2e.stack import EXAMPLES, JobDriver, example_job, paced_docs, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

ATTACK = r"""
import json, os, socket, time, urllib.parse, httpx
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
out = {"resolved": {}}
for url in (inf, trainer):
    host = urllib.parse.urlsplit(url).hostname
    out["resolved"][host] = sorted({a[4][0] for a in socket.getaddrinfo(host, None, socket.AF_INET)})
def call(method, url, body, headers):
    try:
        return httpx.request(method, url, json=body, headers=headers, timeout=httpx.Timeout(30, connect=5)).status_code
    except httpx.HTTPError as e:
        return f"{type(e).__name__}: {e}"
if os.environ.get("WAIT_ADMITTED"):
    # a new pod is admitted once the network has programmed its rules (a second or so): wait for an
    # HTTP answer from both servers, as the job's own clients do by retrying
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(isinstance(call("GET", u + "/health", None, {}), int)
                                                  for u in (inf, trainer)):
        time.sleep(0.5)
for name, method, url, body in attempts:
    for label, headers in (("none", {}), ("wrong", {"Authorization": "Bearer not-the-token"})):
        out[f"{name}/{label}"] = call(method, url, body, headers)
out["health"] = call("GET", inf + "/health", None, {})
print("RESULT " + json.dumps(out), flush=True)
"""


def _intruder(name: str, job: str, endpoints: dict, labels: dict[str, str], wait_admitted: bool) -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
        "spec": {
            "restartPolicy": "Never", "automountServiceAccountToken": False, "enableServiceLinks": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "attack", "image": DEFAULT_RUNTIME_IMAGE, "imagePullPolicy": "Never",
                "command": ["python", "-c", ATTACK],
                "env": [{"name": "JOB", "value": job}, {"name": "INFERENCE_URL", "value": endpoints["inference"][0]},
                        {"name": "COORDINATOR_URL", "value": endpoints["coordinator"]},
                        *([{"name": "WAIT_ADMITTED", "value": "1"}] if wait_admitted else [])],
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }


@pytest.mark.timeout(1800)
def test_pods_that_are_not_the_jobs_are_stopped_by_the_network_or_refused_by_the_token(driver: JobDriver) -> None:
    # long enough that the servers are still up when the intruder pods run (they start in ~30 s): 200
    # steps of at least 0.25 s each (a paced evaluator), 50 s or more however fast the machine
    job, steps = "intruded", 200
    driver.apply_docs(paced_docs(example_job(EXAMPLES / "01-tiny-arith.yaml", job, trainer={"maxSteps": steps},
                                             rollout={"promptsPerStep": 4, "samplesPerPrompt": 4},
                                             checkpoint={"everySteps": 50})))
    driver.wait_step(job, 1, 600)
    # the Service URLs the job's own pods use, from the runtime config the operator wrote
    config = driver.api.get("ConfigMap", driver.namespace, names.config(job))
    assert config is not None
    endpoints = json.loads(config["data"][names.CONFIG_KEY])["endpoints"]
    policies = driver.api.list("NetworkPolicy", driver.namespace, names.job_selector(job))
    assert {p["metadata"]["name"] for p in policies} == {names.inference(job), names.trainer(job), names.rollout(job)}
    driver.apply_docs([_intruder("outsider", job, endpoints, {"app": "outsider"}, wait_admitted=False),
                       _intruder("impostor", job, endpoints, names.selector(job, "rollout"), wait_admitted=True)])

    def result(pod_name: str):
        def get() -> dict | None:
            got = driver.api.get("Pod", driver.namespace, pod_name)
            if got is None or (got.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                return None
            logs = driver.logs(got)
            line = next((ln for ln in logs.splitlines() if ln.startswith("RESULT ")), None)
            assert line, f"the {pod_name} pod ended without a result:\n{logs[-3000:]}"
            return json.loads(line.removeprefix("RESULT "))
        return wait_for(f"the {pod_name} pod's result", get, 300, interval=1.0,
                        on_timeout=lambda: driver.diagnostics(job))

    outsider, impostor = result("outsider"), result("impostor")
    assert driver.progress(job)["step"] < steps, "the job ended before the intruders were done: nothing was attacked"
    for who, out in (("outsider", outsider), ("impostor", impostor)):
        assert len(out["resolved"]) == 2 and all(out["resolved"].values()), \
            f"the {who} pod could not resolve the job's Services: {out['resolved']}"
    # the network: not one HTTP answer to the unlabelled pod, /health included (connections refused)
    calls = {k: v for k, v in outsider.items() if k != "resolved"}
    if not (len(calls) == 15 and all(isinstance(v, str) and v.startswith(("ConnectError", "ConnectTimeout"))
                                     for v in calls.values())):
        pytest.fail("the job's NetworkPolicies must keep a pod that is not the job's from connecting at all: "
                    + json.dumps(outsider, indent=1))
    # the token: the pod with the job's labels is let through the network and refused by every server
    refused = {k: v for k, v in impostor.items() if k not in ("resolved", "health")}
    if not (len(refused) == 14 and all(v == 401 for v in refused.values()) and impostor["health"] == 200):
        pytest.fail("every data-plane call without the job token must get 401, /health 200: "
                    + json.dumps(impostor, indent=1))

    st = driver.wait_phase(job, "Succeeded", 900)
    assert st["step"] == steps and st["policyVersion"] == steps, st
    assert [r["step"] for r in driver.metrics_rows(job)] == list(range(1, steps + 1))
