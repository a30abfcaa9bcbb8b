"""The operator against a real kube-apiserver (in-process operator, no kubelet: the tests write pod
status as a kubelet would, and the Deployment/ReplicaSet/Job controllers do the rest).

A job gets every child with its owner reference; status follows the children and the progress
ConfigMap through Provisioning → Running → Succeeded; suspend removes the workloads and keeps the
state; deletion cascades through the garbage collector; a failed trainer is restarted within
``restartLimit`` and the job fails beyond it.
"""
from __future__ import annotations

import json

import httpx
import pytest

from rft_api.job import parse_manifest
from rft_api.progress import Progress
from rft_operator import names
from rft_operator.builders import BuildContext, desired_children
from rft_operator.kube import Kube, KubeError
from tests.operator.cluster_support import (  # noqa: F401
    api,
    children,
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


def expected_keys(doc: dict, namespace: str, **flags) -> set[tuple[str, str]]:
    job = parse_manifest(doc)
    job.metadata.update(namespace=namespace, uid="x")
    return {(o["kind"], o["metadata"]["name"]) for o in desired_children(job, BuildContext(), **flags)}


def cond(obj: dict, ctype: str) -> dict:
    return next(c for c in obj["status"]["conditions"] if c["type"] == ctype)


def events_of(api: Kube, namespace: str, name: str) -> list[str]:
    return [e["reason"] for e in api.list("Event", namespace)
            if e["involvedObject"].get("kind") == "RFTJob" and e["involvedObject"]["name"] == name
            and e.get("source", {}).get("component") == "rft-operator"]


def run_to_running(api: Kube, namespace: str) -> dict:
    make_role_ready(api, namespace, JOB, "inference")
    make_role_ready(api, namespace, JOB, "rollout")
    make_role_ready(api, namespace, JOB, "trainer")
    return wait_phase(api, namespace, JOB, "Running")


def test_job_lifecycle_children_status_and_progress(cluster, api, operator, namespace, tmp_path) -> None:
    doc = job_manifest(JOB)
    job = create_job(api, namespace, doc)
    uid = job["metadata"]["uid"]
    want = expected_keys(doc, namespace)

    kids = wait_for("every child", lambda: (k := children(api, namespace, JOB)) and set(k) == want and k)
    for (kind, name), o in kids.items():
        refs = o["metadata"]["ownerReferences"]
        assert refs == [{"apiVersion": "rft.dev/v1alpha1", "kind": "RFTJob", "name": JOB, "uid": uid,
                         "controller": True, "blockOwnerDeletion": True}], f"{kind}/{name}"
    inf = kids[("Deployment", "tiny-arith-inference")]["spec"]
    assert inf["template"]["spec"]["containers"][0]["command"][:3] == ["rft", "serve", "--model"]
    assert inf["strategy"]["type"] == "Recreate"
    trainer = kids[("Job", "tiny-arith-trainer")]
    assert trainer["spec"]["backoffLimit"] == 0
    assert trainer["metadata"]["annotations"][names.ANNOTATION_ATTEMPT] == "0"
    assert kids[("PersistentVolumeClaim", "tiny-arith-checkpoints")]["spec"]["resources"]["requests"]["storage"] == "10Gi"
    config = json.loads(kids[("ConfigMap", "tiny-arith-config")]["data"]["config.json"])
    assert config["endpoints"]["coordinator"] == f"http://tiny-arith-trainer.{namespace}.svc:8100"
    assert "data" not in kids[("ConfigMap", "tiny-arith-progress")]

    wait_phase(api, namespace, JOB, "Provisioning")
    # observed once the Deployment controller has rolled out the workloads of this generation
    obj = wait_for("observedGeneration", lambda: (o := get_job(api, namespace, JOB))["status"].get(
        "observedGeneration") == o["metadata"]["generation"] and o)
    assert cond(obj, "InferenceReady")["status"] == "False"
    assert obj["status"]["startTime"]

    obj = run_to_running(api, namespace)
    assert cond(obj, "InferenceReady")["status"] == "True" and cond(obj, "TrainerRunning")["status"] == "True"
    assert obj["status"]["roles"]["inference"] == {"ready": 1, "desired": 1}

    # The trainer, with its own ServiceAccount's token, patches the progress ConfigMap ...
    trainer_api = Kube.from_kubeconfig(str(cluster.service_account_kubeconfig(
        namespace, names.trainer(JOB), tmp_path / "trainer.kubeconfig")))
    try:
        record = Progress.model_validate({
            "step": 10, "totalSteps": 30, "policyVersion": 10, "rewardMean": 0.625, "rewardStd": 0.25,
            "samplesScored": 1280, "errors": {"parseErrors": 40},
            "checkpoints": [{"step": 10, "path": "/checkpoints/step-000010", "time": "2025-01-01T00:00:00Z"}]})
        trainer_api.patch("ConfigMap", namespace, names.progress(JOB), {"data": record.to_data()})
        # ... and nothing else: not the config, not the job's status, not other ConfigMaps.
        for call in (lambda: trainer_api.patch("ConfigMap", namespace, names.config(JOB), {"data": {"x": "y"}}),
                     lambda: trainer_api.patch("RFTJob", namespace, JOB, {"status": {"step": 99}}, "status"),
                     lambda: trainer_api.list("ConfigMap", namespace)):
            with pytest.raises(KubeError) as e:
                call()
            assert e.value.status == 403
    finally:
        trainer_api.close()

    obj = wait_for("status.step 10", lambda: (o := get_job(api, namespace, JOB))["status"].get("step") == 10 and o)
    st = obj["status"]
    assert (st["policyVersion"], st["rewardMean"], st["rewardStd"]) == (10, 0.625, 0.25)
    assert st["lastCheckpoint"] == {"step": 10, "path": "/checkpoints/step-000010", "time": "2025-01-01T00:00:00Z"}
    assert st["errors"]["parseErrors"] == 40
    # The operator applies the progress ConfigMap with metadata only: the trainer's data survives resyncs.
    cm = api.get("ConfigMap", namespace, names.progress(JOB))
    assert json.loads(cm["data"]["progress.json"])["step"] == 10

    finish_trainer(api, namespace, JOB, succeeded=True, attempt=0)
    obj = wait_phase(api, namespace, JOB, "Succeeded")
    assert cond(obj, "Succeeded")["status"] == "True" and obj["status"]["completionTime"]
    wait_for("the Deployments to be removed", lambda: not children(api, namespace, JOB, ("Deployment",)))
    left = children(api, namespace, JOB)
    assert ("Job", "tiny-arith-trainer") in left and ("PersistentVolumeClaim", "tiny-arith-checkpoints") in left

    reasons = wait_for("events", lambda: (r := events_of(api, namespace, JOB)) and "Succeeded" in r and r)
    assert {"Provisioning", "Running", "Succeeded"} <= set(reasons)

    text = httpx.get(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=10).text
    assert 'rft_operator_reconciles_total{result="ok",rft_job="local",rft_namespace="local",rft_role="operator"}' in text
    wait_for("jobs gauge", lambda: 'phase="Succeeded",rft_job="local",rft_namespace="local",rft_role="operator"} 1.0' in httpx.get(
        f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=10).text)


def test_suspend_and_resume(api, operator, namespace) -> None:
    doc = job_manifest(JOB)
    create_job(api, namespace, doc)
    wait_for("every child", lambda: set(children(api, namespace, JOB)) == expected_keys(doc, namespace))
    run_to_running(api, namespace)
    pvc_uid = api.get("PersistentVolumeClaim", namespace, names.checkpoints(JOB))["metadata"]["uid"]

    api.patch("RFTJob", namespace, JOB, {"spec": {"suspend": True}})
    obj = wait_phase(api, namespace, JOB, "Suspended")
    kept = expected_keys(doc, namespace, deployments=False, trainer_job=False)
    wait_for("workloads removed", lambda: set(children(api, namespace, JOB)) == kept)
    assert api.get("PersistentVolumeClaim", namespace, names.checkpoints(JOB))["metadata"]["uid"] == pvc_uid
    assert cond(obj, "Suspended")["status"] == "True"
    wait_for("trainer pods gone", lambda: not pods_of(api, namespace, JOB, "trainer", live=False))

    api.patch("RFTJob", namespace, JOB, {"spec": {"suspend": False}})
    obj = wait_phase(api, namespace, JOB, "Provisioning")
    assert cond(obj, "Suspended")["reason"] == "Resumed"
    wait_for("workloads back", lambda: set(children(api, namespace, JOB)) == expected_keys(doc, namespace))
    assert api.get("PersistentVolumeClaim", namespace, names.checkpoints(JOB))["metadata"]["uid"] == pvc_uid
    run_to_running(api, namespace)
    assert {"Suspended", "Resumed"} <= set(events_of(api, namespace, JOB))


def test_deletion_cascades_through_the_garbage_collector(api, operator, namespace) -> None:
    doc = job_manifest(JOB)
    create_job(api, namespace, doc)
    wait_for("every child", lambda: set(children(api, namespace, JOB)) == expected_keys(doc, namespace))
    make_role_ready(api, namespace, JOB, "inference")
    assert api.delete("RFTJob", namespace, JOB)
    wait_for("the RFTJob to be gone", lambda: api.get("RFTJob", namespace, JOB) is None)
    wait_for("every child to be gone", lambda: not children(api, namespace, JOB), timeout=90)
    wait_for("every pod to be gone", lambda: not [p for role in ("inference", "rollout", "trainer")
                                                  for p in pods_of(api, namespace, JOB, role, live=False)],
             timeout=90)


def test_trainer_failure_restarts_then_fails_beyond_the_limit(api, operator, namespace) -> None:
    doc = job_manifest(JOB, restartLimit=1)
    create_job(api, namespace, doc)
    run_to_running(api, namespace)
    first_uid = api.get("Job", namespace, names.trainer(JOB))["metadata"]["uid"]

    finish_trainer(api, namespace, JOB, succeeded=False, attempt=0)
    obj = wait_for("restarts 1", lambda: (o := get_job(api, namespace, JOB))["status"].get("restarts") == 1 and o)
    assert obj["status"]["phase"] == "Running"
    second = wait_for("the attempt-1 trainer Job", lambda: (j := api.get("Job", namespace, names.trainer(JOB)))
                      and j["metadata"]["annotations"][names.ANNOTATION_ATTEMPT] == "1" and j)
    assert second["metadata"]["uid"] != first_uid
    env = {e["name"]: e.get("value") for e in second["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RFT_TRAINER_ATTEMPT"] == "1"
    assert "TrainerRestarted" in wait_for("restart event", lambda: (r := events_of(api, namespace, JOB))
                                          and "TrainerRestarted" in r and r)

    make_role_ready(api, namespace, JOB, "trainer")
    finish_trainer(api, namespace, JOB, succeeded=False, attempt=1)
    obj = wait_phase(api, namespace, JOB, "Failed")
    assert obj["status"]["restarts"] == 1
    f = cond(obj, "Failed")
    assert f["reason"] == "RestartLimitExceeded" and "restartLimit is 1" in f["message"]
    wait_for("the Deployments to be removed", lambda: not children(api, namespace, JOB, ("Deployment",)))
    assert api.get("Job", namespace, names.trainer(JOB))["metadata"]["uid"] == second["metadata"]["uid"]


def test_spec_edit_rolls_every_workload_and_recreates_the_trainer(api, operator, namespace) -> None:
    """An edit reaches the pods that read the config: the Deployments roll (new pod template hash),
    the trainer Job (immutable template) is recreated for the same attempt without using the restart
    budget, and observedGeneration advances only once no pod of the old config is left."""
    create_job(api, namespace, job_manifest(JOB))
    run_to_running(api, namespace)
    wait_for("observedGeneration 1", lambda: get_job(api, namespace, JOB)["status"].get("observedGeneration") == 1)
    old_trainer = api.get("Job", namespace, names.trainer(JOB))
    old_hash = old_trainer["spec"]["template"]["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH]

    api.patch("RFTJob", namespace, JOB, {"spec": {"trainer": {"maxSteps": 40}}})
    new = wait_for("a new trainer Job", lambda: (j := api.get("Job", namespace, names.trainer(JOB)))
                   and j["metadata"]["uid"] != old_trainer["metadata"]["uid"] and j, timeout=60)
    assert new["metadata"]["annotations"][names.ANNOTATION_ATTEMPT] == "0"
    new_hash = new["spec"]["template"]["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH]
    assert new_hash != old_hash
    for d in ("inference", "rollout"):
        dep = api.get("Deployment", namespace, f"{JOB}-{d}")
        assert dep["spec"]["template"]["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH] == new_hash
    obj = get_job(api, namespace, JOB)
    assert obj["metadata"]["generation"] == 2 and obj["status"]["restarts"] == 0

    def new_pods_ready() -> bool:
        for role in ("inference", "rollout", "trainer"):
            for p in pods_of(api, namespace, JOB, role):
                if (p["metadata"].get("annotations") or {}).get(names.ANNOTATION_CONFIG_HASH) == new_hash \
                        and (p.get("status") or {}).get("phase") != "Running":
                    set_pod_phase(api, p, "Running")
        return get_job(api, namespace, JOB)["status"].get("observedGeneration") == 2
    wait_for("observedGeneration 2 once the new pods run", new_pods_ready, timeout=90, interval=1.0)
    assert get_job(api, namespace, JOB)["status"]["restarts"] == 0
    # observed only once no pod of the old config is left
    assert not [p["metadata"]["name"] for role in ("inference", "rollout", "trainer")
                for p in pods_of(api, namespace, JOB, role)
                if (p["metadata"].get("annotations") or {}).get(names.ANNOTATION_CONFIG_HASH) == old_hash]
