"""#55 against a real API server and the operator: the job's token Secret deleted while the job runs is
minted anew only together with a restart of every role (all pods share one token, the job does not
fail), and an operator restart never mints another token while the Secret exists; a retained claim
adopted by a job of the same name without retainOnDelete stays retained (deleting that job keeps it);
a rollout pod crash-looping is told in RolloutReady at once."""
from __future__ import annotations

import base64

import pytest

from rft_operator import names
from tests.operator.cluster_support import (  # noqa: F401
    OperatorThread,
    api,
    crd,
    create_job,
    get_job,
    job_manifest,
    make_role_ready,
    operator,
    pods_of,
    wait_phase,
)
from tests.support.polling import wait_for

pytestmark = pytest.mark.cluster
JOB = "tiny-arith"


def _digest(obj: dict) -> str:
    return obj["spec"]["template"]["metadata"]["annotations"].get(names.ANNOTATION_TOKEN_DIGEST, "")


def _events(api, namespace: str, reason: str) -> list[dict]:
    return [e for e in api.list("Event", namespace) if e.get("reason") == reason]


def _waiting(api, namespace: str, pod: dict, reason: str, message: str, restarts: int = 0, last: dict | None = None
             ) -> None:
    c = pod["spec"]["containers"][0]
    cs: dict = {"name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": restarts,
                "state": {"waiting": {"reason": reason, "message": message}}}
    if last:
        cs["lastState"] = {"terminated": last}
    api.patch("Pod", namespace, pod["metadata"]["name"], {"status": {"phase": "Pending", "containerStatuses": [cs]}},
              subresource="status")


def test_a_deleted_token_secret_is_minted_anew_with_every_role_restarted(cluster, api, operator, namespace) -> None:
    create_job(api, namespace, job_manifest(JOB))
    secret = wait_for("the token Secret", lambda: api.get("Secret", namespace, names.token(JOB)))
    digest = secret["metadata"]["annotations"][names.ANNOTATION_TOKEN_DIGEST]
    for role in ("inference", "rollout"):
        make_role_ready(api, namespace, JOB, role)
    make_role_ready(api, namespace, JOB, "trainer")
    wait_phase(api, namespace, JOB, "Running")
    for kind, name in (("Deployment", f"{JOB}-rollout"), ("Job", names.trainer(JOB))):
        assert _digest(api.get(kind, namespace, name)) == digest

    # an operator restart (new process state, same cluster) reads the Secret: no new token
    operator.stop()
    with OperatorThread(cluster.kubeconfig, namespace):
        wait_for("a resync", lambda: get_job(api, namespace, JOB)["status"]["phase"] == "Running")
        again = api.get("Secret", namespace, names.token(JOB))
        assert again["metadata"]["uid"] == secret["metadata"]["uid"]

        api.delete("Secret", namespace, names.token(JOB))
        (pod,) = pods_of(api, namespace, JOB, "rollout")
        _waiting(api, namespace, pod, "CreateContainerConfigError", f'secret "{names.token(JOB)}" not found')
        new = wait_for("a new token Secret", lambda: (s := api.get("Secret", namespace, names.token(JOB)))
                       and s["metadata"]["uid"] != secret["metadata"]["uid"] and s)
        fresh = new["metadata"]["annotations"][names.ANNOTATION_TOKEN_DIGEST]
        assert fresh != digest
        # every role's template carries the new digest: each restarts with the new token
        wait_for("every role rolled", lambda: all(
            (o := api.get(kind, namespace, name)) is not None and _digest(o) == fresh
            for kind, name in (("Deployment", f"{JOB}-rollout"), ("Deployment", f"{JOB}-inference"),
                               ("Job", names.trainer(JOB)))), timeout=90)
        assert get_job(api, namespace, JOB)["status"]["phase"] == "Running"
        assert wait_for("the TokenRecreated event", lambda: _events(api, namespace, "TokenRecreated"))
        token = base64.b64decode(api.get("Secret", namespace, names.token(JOB))["data"]["token"]).decode()
        said = str(get_job(api, namespace, JOB)["status"]) + str([e.get("message") for e in api.list("Event", namespace)])
        assert token not in said and fresh not in said  # neither the token nor its digest is told


def test_a_retained_claim_stays_retained_when_adopted_without_retain_on_delete(cluster, api, operator,
                                                                                namespace) -> None:
    first = create_job(api, namespace, job_manifest("keep", checkpoint={"retainOnDelete": True}))
    claim = names.checkpoints("keep")
    pvc = wait_for("the claim", lambda: api.get("PersistentVolumeClaim", namespace, claim))
    assert pvc["metadata"]["annotations"][names.ANNOTATION_RETAINED_FOR] == first["metadata"]["uid"]
    wait_for("the config", lambda: api.get("ConfigMap", namespace, names.config("keep")))
    api.delete("RFTJob", namespace, "keep")
    wait_for("owned children collected", lambda: api.get("ConfigMap", namespace, names.config("keep")) is None,
             timeout=90)

    second = create_job(api, namespace, job_manifest("keep"))  # no retainOnDelete
    uid = second["metadata"]["uid"]
    adopted = wait_for("the claim adopted", lambda: (p := api.get("PersistentVolumeClaim", namespace, claim))
                       and p["metadata"]["annotations"].get(names.ANNOTATION_RETAINED_FOR) == uid and p)
    assert adopted["metadata"]["uid"] == pvc["metadata"]["uid"]
    assert not adopted["metadata"].get("ownerReferences"), adopted["metadata"]
    assert wait_for("the ClaimAdopted event", lambda: _events(api, namespace, "ClaimAdopted"))
    wait_for("the trainer Job", lambda: api.get("Job", namespace, names.trainer("keep")))
    still = api.get("PersistentVolumeClaim", namespace, claim)
    assert not still["metadata"].get("ownerReferences")

    api.delete("RFTJob", namespace, "keep")
    wait_for("owned children collected", lambda: api.get("ConfigMap", namespace, names.config("keep")) is None,
             timeout=90)
    kept = api.get("PersistentVolumeClaim", namespace, claim)
    assert kept is not None and kept["metadata"]["uid"] == pvc["metadata"]["uid"]  # the first run's model stays


def test_a_crash_looping_rollout_pod_is_told_at_once(api, operator, namespace) -> None:
    create_job(api, namespace, job_manifest(JOB))
    (pod,) = wait_for("the rollout pod", lambda: pods_of(api, namespace, JOB, "rollout"))
    _waiting(api, namespace, pod, "CrashLoopBackOff", "back-off 20s restarting failed container", restarts=2,
             last={"exitCode": 1, "reason": "Error", "message": "KeyError: 'prompt'",
                   "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:01Z"})

    def told():
        st = (get_job(api, namespace, JOB).get("status") or {})
        c = next((c for c in st.get("conditions") or [] if c["type"] == "RolloutReady"), None)
        return c if c and c["reason"] == "CrashLoopBackOff" else None
    c = wait_for("RolloutReady CrashLoopBackOff", told)
    assert pod["metadata"]["name"] in c["message"] and "KeyError: 'prompt'" in c["message"]
    _waiting(api, namespace, pod, "CrashLoopBackOff", "back-off 5m0s restarting failed container", restarts=5,
             last={"exitCode": 1, "reason": "Error", "message": "KeyError: 'prompt'",
                   "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:01Z"})
    obj = wait_phase(api, namespace, JOB, "Failed")
    f = next(c for c in obj["status"]["conditions"] if c["type"] == "Failed")
    assert f["reason"] == "RoleCrashLooping" and pod["metadata"]["name"] in f["message"]


def test_two_jobs_naming_one_existing_claim_take_turns(api, operator, namespace) -> None:
    api.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "shared", "namespace": namespace},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    first = create_job(api, namespace, job_manifest("first", checkpoint={"existingClaim": "shared"}))
    wait_for("the claim marked by the first job", lambda: (api.get("PersistentVolumeClaim", namespace, "shared")
                                                           ["metadata"].get("annotations") or {})
             .get(names.ANNOTATION_USED_BY) == f"first/{first['metadata']['uid']}")
    second = create_job(api, namespace, job_manifest("second", checkpoint={"existingClaim": "shared"}))
    held = wait_phase(api, namespace, "second", "Suspended")
    s = next(c for c in held["status"]["conditions"] if c["type"] == "Suspended")
    assert s["reason"] == "ClaimInUse" and "RFTJob first" in s["message"] and "shared" in s["message"], s
    assert api.get("Job", namespace, names.trainer("second")) is None  # no pod of the second job writes into it
    assert wait_phase(api, namespace, "first", "Provisioning")

    api.delete("RFTJob", namespace, "first")
    wait_for("the claim marked by the second job", lambda: (api.get("PersistentVolumeClaim", namespace, "shared")
                                                            ["metadata"].get("annotations") or {})
             .get(names.ANNOTATION_USED_BY) == f"second/{second['metadata']['uid']}", timeout=90)
    wait_for("the second job's trainer Job", lambda: api.get("Job", namespace, names.trainer("second")))
    assert get_job(api, namespace, "second")["status"]["phase"] != "Failed"


def test_an_unbound_checkpoint_claim_is_named_in_the_jobs_message(api, operator, namespace) -> None:
    create_job(api, namespace, job_manifest(JOB, checkpoint={"storageClassName": "no-such-class"}))
    (pod,) = wait_for("the trainer pod", lambda: pods_of(api, namespace, JOB, "trainer"))
    why = "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/1 nodes"

    def named() -> dict | None:
        """The job's status once it names the claim. The control plane's real kube-scheduler (no node here)
        may write its own PodScheduled condition over the one this test plays, so that is re-applied."""
        live = api.get("Pod", namespace, pod["metadata"]["name"])
        cond = next((c for c in (live.get("status") or {}).get("conditions") or [] if c["type"] == "PodScheduled"), {})
        if cond.get("message") != why:
            api.patch("Pod", namespace, pod["metadata"]["name"], {"status": {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why,
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}, subresource="status")
        s = get_job(api, namespace, JOB).get("status") or {}
        return s if names.checkpoints(JOB) in s.get("message", "") else None

    st = wait_for("the claim named", named, timeout=120, interval=1.0)
    assert "unbound immediate PersistentVolumeClaims" in st["message"] and st["phase"] != "Failed", st["message"]
