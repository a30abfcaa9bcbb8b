"""hf:// and s3:// inputs on a cluster: a fetch Job before any role, roles only once it completed, a
failed fetch fails the job without spending restarts, credentials by secretKeyRef only; and the
output push reported in status (pure: builders, policy, plan and status; no cluster)."""
from __future__ import annotations

import dataclasses
import json

import pytest

from rft_api.progress import OutputPush, Progress
from rft_operator import names
from rft_operator.builders import BuildContext, desired_children
from rft_operator.observe import Observed, observe
from rft_operator.plan import TrainerStep, make_plan
from rft_operator.policies import inputs
from rft_operator.status import compute_status
from tests.operator.support import T0, make_job, observed, trainer_obs

STORAGE = {"s3": {"endpoint": "http://10.0.0.5:8333", "accessKeyIdSecretRef": {"name": "s3-creds", "key": "id"},
                  "secretAccessKeySecretRef": {"name": "s3-creds", "key": "secret"}},
           "huggingFace": {"endpoint": "http://hub.local:8090", "tokenSecretRef": {"name": "hf", "key": "token"}}}


def s3_job(**over):
    return make_job(model={"base": "s3://models/smollm2"},
                    dataset={"train": {"uri": "s3://data/gsm8k/train.jsonl",
                                       "fields": {"prompt": "question", "groundTruth": "answer"}}},
                    storage=STORAGE, **over)


def _fetch(children):
    return [c for c in children if c["kind"] == "Job" and c["metadata"]["name"].startswith("tiny-arith-fetch-")]


def test_a_job_with_uris_gets_a_fetch_job_with_credentials_by_reference_only():
    job = s3_job()
    (fetch,) = _fetch(desired_children(job, BuildContext(), fetch_job=True))
    pod = fetch["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["rft", "fetch", "--config", "/etc/rft/config.json"]
    env = {e["name"]: e for e in c["env"]}
    assert env["RFT_S3_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"] == {"name": "s3-creds", "key": "id"}
    assert env["RFT_S3_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "s3-creds", "key": "secret"}
    assert env["RFT_HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}
    assert env["HF_HUB_OFFLINE"]["value"] == "0" and env["HF_ENDPOINT"]["value"] == "http://hub.local:8090"
    assert len([e for e in c["env"] if e["name"] == "HF_HUB_OFFLINE"]) == 1
    assert {"name": "checkpoints", "mountPath": "/checkpoints"} in c["volumeMounts"]
    assert fetch["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"] == [2]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert all("value" not in e for e in c["env"] if e["name"].startswith("RFT_S3_") or e["name"] == "RFT_HF_TOKEN")


def test_the_fetch_job_is_the_same_across_config_edits_and_another_for_other_inputs():
    a = _fetch(desired_children(s3_job(), BuildContext(), fetch_job=True))[0]
    b = _fetch(desired_children(s3_job(trainer={"learningRate": 1e-4}), BuildContext(), fetch_job=True))[0]
    assert a["metadata"]["name"] == b["metadata"]["name"] and a["spec"] == b["spec"]
    other = make_job(model={"base": "hf://HuggingFaceTB/SmolLM2-135M-Instruct"}, storage=STORAGE)
    c = _fetch(desired_children(other, BuildContext(), fetch_job=True))[0]
    assert c["metadata"]["name"] != a["metadata"]["name"]


def test_a_job_without_uris_has_no_fetch_job_and_no_inputs_condition(tiny_job):
    assert _fetch(desired_children(tiny_job, BuildContext(), fetch_job=True)) == []
    st = inputs.state(tiny_job.spec, observed())
    assert st.ready and not st.wanted
    assert "InputsReady" not in [c.type for c in compute_status(tiny_job, observed()).conditions]


def _with_fetch(obs: Observed, *, complete=False, failed=False, reason="", failures=0, said=()) -> Observed:
    f = dataclasses.replace(trainer_obs(complete=complete, failed=failed), name="tiny-arith-fetch-abc",
                            reason=reason or ("BackoffLimitExceeded" if failed else ""), failed=failures)
    return dataclasses.replace(obs, fetch=f, fetch_messages=tuple(said))


def test_roles_wait_for_the_fetch_and_start_once_it_completed():
    job = s3_job()
    fetching = _with_fetch(observed())
    plan = make_plan(False, "Provisioning", fetching, 0, "", inputs.state(job.spec, fetching))
    assert plan.fetch and not plan.deployments and plan.trainer == TrainerStep.ABSENT
    kinds = {c["kind"] for c in desired_children(job, BuildContext(), deployments=plan.deployments,
                                                 trainer_job=False, fetch_job=plan.fetch)}
    assert "Deployment" not in kinds and "Job" in kinds
    done = _with_fetch(observed(), complete=True, said=["spec.model.base: s3://models/smollm2: 9 files, 538.0 MB fetched"])
    plan = make_plan(False, "Provisioning", done, 0, "", inputs.state(job.spec, done))
    assert plan.fetch and plan.deployments and plan.trainer == TrainerStep.APPLY
    cond = next(c for c in compute_status(job, done).conditions if c.type == "InputsReady")
    assert (cond.status, cond.reason) == ("True", "Fetched") and "538.0 MB" in cond.message


def test_a_refused_fetch_fails_the_job_at_once_naming_the_uri_without_restarts():
    job = s3_job()
    said = "error: s3://data/gsm8k/train.jsonl: spec.dataset.train.uri: access denied (Forbidden, HTTP 403)"
    obs = _with_fetch(observed(), failed=True, reason="PodFailurePolicy", failures=1, said=[said])
    st = compute_status(job, obs)
    assert st.phase == "Failed" and st.restarts == 0
    failed = next(c for c in st.conditions if c.type == "Failed")
    assert failed.reason == "FetchFailed" and "s3://data/gsm8k/train.jsonl" in failed.message and "403" in failed.message
    inputs_cond = next(c for c in st.conditions if c.type == "InputsReady")
    assert (inputs_cond.status, inputs_cond.reason) == ("False", "FetchFailed")
    plan = make_plan(False, st.phase, obs, 0, "", inputs.state(job.spec, obs))
    assert plan.fetch and not plan.deployments  # the failed Job is kept (its pods' logs), nothing else starts


def test_a_transient_failure_is_retried_and_said_while_fetching():
    job = s3_job()
    obs = _with_fetch(observed(), failures=1, said=["error: s3://data/gsm8k/train.jsonl: unreachable (Unreachable)"])
    st = inputs.state(job.spec, obs)
    assert not st.ready and st.failure is None and st.condition[1] == "Fetching" and "unreachable" in st.condition[2]


def test_observe_reads_the_fetch_job_and_its_pods_last_words():
    job_obj = {"kind": "Job", "metadata": {"name": f"{names.fetch_prefix('tiny-arith')}1234abcd",
                                           "labels": {names.LABEL_ROLE: "fetch"}},
               "spec": {"parallelism": 1},
               "status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}}
    pod = {"kind": "Pod", "metadata": {"name": "p1", "labels": {names.LABEL_ROLE: "fetch"}},
           "status": {"containerStatuses": [{"name": "fetch", "state": {"terminated": {
               "exitCode": 0, "finishedAt": "2025-01-01T12:00:00Z", "message": "fetched 2 inputs"}}}]}}
    obs = observe("tiny-arith", [job_obj, pod], T0)
    assert obs.fetch is not None and obs.fetch.complete and obs.fetch_messages == ("fetched 2 inputs",)


@pytest.mark.parametrize("role", ["rollout", "inference", "trainer"])
def test_every_role_reads_the_fetched_inputs_and_the_rollout_sees_nothing_else(role):
    children = desired_children(make_job(model={"base": "hf://org/model"}, dataset={"train": {
        "uri": "pvc://datasets/gsm8k/train.jsonl"}}), BuildContext())
    obj = next(c for c in children if c["metadata"]["name"] == f"tiny-arith-{role}" and c["kind"] in ("Deployment", "Job"))
    pod = obj["spec"]["template"]["spec"]
    mounts = pod["containers"][0]["volumeMounts"]
    claims = [v for v in pod["volumes"] if (v.get("persistentVolumeClaim") or {}).get("claimName") == "datasets"]
    assert claims and claims[0]["persistentVolumeClaim"]["readOnly"]
    assert any(m["mountPath"] == "/mnt/claims/datasets" and m["readOnly"] for m in mounts)
    if role == "rollout":  # the bundle's pods: the inputs folder only, read-only
        (m,) = [m for m in mounts if m["name"] == "checkpoints"]
        assert m == {"name": "checkpoints", "mountPath": "/checkpoints/inputs", "subPath": "inputs", "readOnly": True}
    config = next(c for c in children if c["kind"] == "ConfigMap" and c["metadata"]["name"] == "tiny-arith-config")
    paths = json.loads(config["data"]["config.json"])["paths"]
    assert paths["model"].startswith("/checkpoints/inputs/") and paths["inputs"] == "/checkpoints/inputs"
    assert paths["datasets"]["train"] == "/mnt/claims/datasets/gsm8k/train.jsonl"


def test_output_pushed_and_push_failure_in_status():
    job = make_job(output={"uri": "s3://out/runs/job-1"}, storage=STORAGE)
    ok = Progress(done=True, output=OutputPush(uri="s3://out/runs/job-1/final", files=9, bytes=538_000_000))
    st = compute_status(job, observed(trainer=trainer_obs(complete=True), progress=ok))
    assert st.output is not None and st.output.uri == "s3://out/runs/job-1/final" and st.output.files == 9
    cond = next(c for c in st.conditions if c.type == "OutputPushed")
    assert cond.status == "True" and "s3://out/runs/job-1/final" in cond.message
    bad = Progress(done=True, output=OutputPush(uri="s3://out/runs/job-1", error="s3://out/runs/job-1: access denied",
                                                reason="Forbidden"))
    st = compute_status(job, observed(trainer=trainer_obs(complete=True), progress=bad))
    cond = next(c for c in st.conditions if c.type == "OutputPushed")
    assert (cond.status, cond.reason) == ("False", "Forbidden") and "stays on the checkpoint claim" in cond.message
    assert st.output is None


def test_the_fetch_job_gets_the_trainers_cpu_and_memory_but_no_gpu():
    job = s3_job(trainer={"resources": {"requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
                                        "limits": {"memory": "16Gi", "nvidia.com/gpu": "1"}}})
    (fetch,) = _fetch(desired_children(job, BuildContext(), fetch_job=True))
    res = fetch["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert res["requests"]["cpu"] == "4" and res["requests"]["memory"] == "16Gi"
    assert res["limits"] == {"memory": "16Gi"}
    assert "nvidia.com/gpu" not in str(res)
