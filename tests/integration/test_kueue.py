"""Kueue gang admission against a real kube-apiserver serving Kueue's real CRDs (``shared/kueue-crds/``
beside the checkout, pinned by hash in :mod:`tests.support.shared`).

Kueue's controller cannot run here (see shared/kueue-crds/README.md). **The test stands in for
Kueue's admission**: it writes the Workload status as Kueue's scheduler and controllers document it
(``QuotaReserved``/``Admitted`` with ``status.admission``; ``Evicted`` with reason ``Preempted``;
``QuotaReserved`` False with Kueue's "insufficient quota" message). Everything the operator writes
(the Workload, its status patches) is validated by the API server against Kueue's schema. There is no
kubelet: the test marks pods Running as a kubelet would (``make_role_ready``).
"""
from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
import yaml

from rft_operator import names
from rft_operator.kube import Kube
from tests.operator.cluster_support import (  # noqa: F401
    OperatorThread,
    api,
    children,
    crd,
    create_job,
    finish_trainer,
    get_job,
    job_manifest,
    make_role_ready,
    pods_of,
    wait_phase,
)
from tests.support.polling import wait_for
from tests.support.shared import kueue_crds

pytestmark = pytest.mark.cluster
QUEUE = "team-a"
FLAVOR = "pool-a"
INSUFFICIENT = ("couldn't assign flavors to pod set trainer: insufficient quota for cpu in flavor pool-a, "
                "request > maximum capacity (4 > 2)")


@pytest.fixture(scope="module")
def kueue_api(cluster, crd):
    """Kueue's CRDs installed and Established, and the cluster-scoped objects jobs refer to: a
    ResourceFlavor with node labels and a toleration, a WorkloadPriorityClass, a ClusterQueue with
    quota for one job and its LocalQueue (created once; the LocalQueue per namespace)."""
    for f in kueue_crds():
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(f))
    k = Kube.from_kubeconfig(str(cluster.kubeconfig))

    def established(plural: str):
        def check() -> bool:
            obj = k.get("CustomResourceDefinition", None, f"{plural}.kueue.x-k8s.io") or {}
            return any(c.get("type") == "Established" and c.get("status") == "True"
                       for c in (obj.get("status") or {}).get("conditions") or [])
        return check
    for plural in ("workloads", "resourceflavors", "workloadpriorityclasses", "clusterqueues", "localqueues"):
        wait_for(f"CRD {plural}.kueue.x-k8s.io Established", established(plural), timeout=60)
    k.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": FLAVOR},
             "spec": {"nodeLabels": {"example.com/pool": "a"},
                      "tolerations": [{"key": "example.com/pool", "operator": "Equal", "value": "a",
                                       "effect": "NoSchedule"}]}})
    k.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
             "metadata": {"name": "high"}, "value": 1000, "description": "tests"})
    try:
        yield k
    finally:
        k.close()


def workload_of(api: Kube, namespace: str, job: str) -> dict:
    wls = [w for w in api.list("Workload", namespace, names.job_selector(job))]
    assert len(wls) <= 1, [w["metadata"]["name"] for w in wls]
    return wls[0] if wls else {}


def kueue_writes_status(api: Kube, wl: dict, status: dict) -> dict:
    """STAND-IN for Kueue's controllers: write the Workload's status as Kueue does."""
    return api.patch("Workload", wl["metadata"]["namespace"], wl["metadata"]["name"], {"status": status},
                     subresource="status")


def _cond(ctype: str, status: str, reason: str, message: str) -> dict:
    return {"type": ctype, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def admit(api: Kube, wl: dict) -> dict:
    """STAND-IN: Kueue's scheduler reserves quota in flavor pool-a for every pod set, and (no
    admission checks) admits the Workload; a previous eviction is cleared as Kueue clears it."""
    assignments = [{"name": ps["name"], "count": ps["count"], "flavors": {"cpu": FLAVOR, "memory": FLAVOR}}
                   for ps in wl["spec"]["podSets"]]
    conds = [_cond("QuotaReserved", "True", "QuotaReserved", "Quota reserved in ClusterQueue cq"),
             _cond("Admitted", "True", "Admitted", "The workload is admitted")]
    if any(c["type"] == "Evicted" for c in (wl.get("status") or {}).get("conditions") or []):
        conds.append(_cond("Evicted", "False", "QuotaReserved", "Previously: Preempted"))
    return kueue_writes_status(api, wl, {"admission": {"clusterQueue": "cq", "podSetAssignments": assignments},
                                         "conditions": conds})


def roles_of(api: Kube, namespace: str, job: str) -> set[tuple[str, str]]:
    return {k for k in children(api, namespace, job) if k[0] in ("Deployment", "Job")}


def test_gang_admission_quota_preemption_and_readmission(cluster, kueue_api, namespace, tmp_path) -> None:
    api = kueue_api
    lq = tmp_path / "localqueue.yaml"
    lq.write_text(yaml.safe_dump({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                                  "metadata": {"name": QUEUE, "namespace": namespace},
                                  "spec": {"clusterQueue": "cq"}}))
    cluster.kubectl("apply", "-f", str(lq))  # validated by Kueue's LocalQueue schema
    first = job_manifest("first")
    first["metadata"]["labels"] = {names.LABEL_QUEUE_NAME: QUEUE}
    first["spec"]["trainer"]["resources"] = {"requests": {"cpu": "2", "memory": "2Gi"}}
    second = copy.deepcopy(first)
    second["metadata"] = {"name": "second", "labels": {names.LABEL_QUEUE_NAME: QUEUE,
                                                        names.LABEL_PRIORITY_CLASS: "high"}}
    with OperatorThread(cluster.kubeconfig, namespace, kueue=True):
        create_job(api, namespace, first)
        create_job(api, namespace, second)

        # One Workload per job, accepted by Kueue's schema: a pod set per role, counts from the spec.
        wl1 = wait_for("first's Workload", lambda: workload_of(api, namespace, "first"))
        wl2 = wait_for("second's Workload", lambda: workload_of(api, namespace, "second"))
        job1 = get_job(api, namespace, "first")
        spec = job1["spec"]
        counts = {ps["name"]: ps["count"] for ps in wl1["spec"]["podSets"]}
        assert counts["inference"] == spec["inference"].get("replicas", 1)
        assert counts["rollout"] == spec["rollout"].get("replicas", 1)
        assert counts["trainer"] == spec["trainer"].get("nodes", 1)
        assert wl1["spec"]["queueName"] == QUEUE and "priorityClassRef" not in wl1["spec"]
        assert wl1["metadata"]["ownerReferences"][0]["uid"] == job1["metadata"]["uid"]
        trainer_set = next(ps for ps in wl1["spec"]["podSets"] if ps["name"] == "trainer")
        # quota is counted from the roles' requests
        assert trainer_set["template"]["spec"]["containers"][0]["resources"]["requests"] == {"cpu": "2", "memory": "2Gi"}
        assert wl2["spec"]["priorityClassRef"] == {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass",
                                                   "name": "high"}
        assert wl2["spec"]["priority"] == 1000

        # Not admitted: no role pods, the job is held and says so.
        held = wait_phase(api, namespace, "first", "Suspended")
        susp = next(c for c in held["status"]["conditions"] if c["type"] == "Suspended")
        assert susp["status"] == "True" and susp["reason"] == "QueuedForAdmission"
        assert roles_of(api, namespace, "first") == set() and roles_of(api, namespace, "second") == set()
        assert ("PersistentVolumeClaim", "first-checkpoints") in children(api, namespace, "first")

        # Quota for one: Kueue admits the first and tells the second why it waits.
        admit(api, wl1)
        kueue_writes_status(api, wl2, {"conditions": [_cond("QuotaReserved", "False", "Pending", INSUFFICIENT)]})
        wait_for("first's role workloads", lambda: len(roles_of(api, namespace, "first")) >= 3)
        dep = api.get("Deployment", namespace, "first-rollout")
        pod = dep["spec"]["template"]["spec"]
        assert pod["nodeSelector"]["example.com/pool"] == "a"  # the admitted flavor's node labels
        assert {"key": "example.com/pool", "operator": "Equal", "value": "a", "effect": "NoSchedule"} in pod["tolerations"]
        trainer = wait_for("first's trainer Job", lambda: api.get("Job", namespace, "first-trainer"))
        assert trainer["spec"]["template"]["spec"]["nodeSelector"]["example.com/pool"] == "a"
        wait_for("second's status to say why it waits", lambda: INSUFFICIENT in
                 (get_job(api, namespace, "second").get("status") or {}).get("message", ""))
        assert roles_of(api, namespace, "second") == set()
        for role in ("inference", "rollout", "trainer"):
            make_role_ready(api, namespace, "first", role)
        wait_phase(api, namespace, "first", "Running")

        # Preemption: Kueue evicts the first; the operator stops its pods, keeps its state, then
        # releases the quota reservation so Kueue can requeue it.
        wl1 = workload_of(api, namespace, "first")
        kueue_writes_status(api, wl1, {"conditions": [
            *wl1["status"]["conditions"],
            _cond("Evicted", "True", "Preempted", "Preempted to accommodate a workload (UID: x) due to "
                                                  "prioritization in the ClusterQueue")]})
        evicted = wait_phase(api, namespace, "first", "Suspended")
        susp = next(c for c in evicted["status"]["conditions"] if c["type"] == "Suspended")
        assert susp["reason"] == "Evicted" and "Preempted" in susp["message"]
        wait_for("first's role workloads gone", lambda: roles_of(api, namespace, "first") == set())
        released = wait_for("the reservation released", lambda: (w := workload_of(api, namespace, "first"))
                            and not (w.get("status") or {}).get("admission") and w)
        qr = next(c for c in released["status"]["conditions"] if c["type"] == "QuotaReserved")
        assert qr["status"] == "False" and "Preempted" in qr["message"]
        kids = children(api, namespace, "first")
        assert ("PersistentVolumeClaim", "first-checkpoints") in kids and ("ConfigMap", "first-progress") in kids

        # Re-admission resumes it: a new trainer Job on the same checkpoint claim.
        admit(api, released)
        trainer = wait_for("first's trainer Job again", lambda: api.get("Job", namespace, "first-trainer"))
        claims = [v["persistentVolumeClaim"]["claimName"] for v in trainer["spec"]["template"]["spec"]["volumes"]
                  if "persistentVolumeClaim" in v]
        assert "first-checkpoints" in claims
        resumed = next(c for c in get_job(api, namespace, "first")["status"]["conditions"] if c["type"] == "Suspended")
        assert resumed["status"] == "False"
        for role in ("inference", "rollout"):
            make_role_ready(api, namespace, "first", role)
        attempt = int(trainer["metadata"]["annotations"][names.ANNOTATION_ATTEMPT])
        make_role_ready(api, namespace, "first", "trainer")
        wait_phase(api, namespace, "first", "Running")

        # A finished job returns its quota: its Workload is marked Finished.
        finish_trainer(api, namespace, "first", succeeded=True, attempt=attempt)
        wait_phase(api, namespace, "first", "Succeeded")
        done = wait_for("Workload Finished", lambda: any(
            c["type"] == "Finished" and c["status"] == "True"
            for c in (workload_of(api, namespace, "first").get("status") or {}).get("conditions") or []))
        assert done
        assert pods_of(api, namespace, "second", "trainer") == []


def test_queued_job_waits_when_the_operator_has_no_kueue_integration(cluster, kueue_api, namespace) -> None:
    api = kueue_api
    doc = job_manifest("queued")
    doc["metadata"]["labels"] = {names.LABEL_QUEUE_NAME: QUEUE}
    with OperatorThread(cluster.kubeconfig, namespace, kueue=False):
        create_job(api, namespace, doc)
        held = wait_phase(api, namespace, "queued", "Suspended")
        assert "kueue.enabled" in held["status"]["message"] and names.LABEL_QUEUE_NAME in held["status"]["message"]
        time.sleep(2)  # several resyncs (1 s): still nothing runs and no Workload is written
        assert roles_of(api, namespace, "queued") == set()
        assert api.list("Workload", namespace) == []


def test_chart_with_kueue_grants_exactly_the_kueue_rules_and_passes_the_flag(cluster) -> None:
    import subprocess

    from rft_operator.main import parse_args
    from rft_operator.permissions import KUEUE_CLUSTER_RULES, KUEUE_RULES, OPERATOR_RULES

    chart = Path(__file__).resolve().parents[2] / "charts" / "rft-operator"
    rendered = subprocess.run([cluster.binary("helm"), "template", "rft", str(chart), "-n", "ops",
                               "--set", "kueue.enabled=true"], capture_output=True, text=True, check=True).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    roles = {d["metadata"]["name"]: d["rules"] for d in docs if d["kind"] == "ClusterRole"}
    assert roles == {"rft-rft-operator": OPERATOR_RULES + KUEUE_RULES, "rft-rft-operator-kueue": KUEUE_CLUSTER_RULES}
    # namespaced operator: the Workload rules in each watched namespace, the cluster-scoped reads still cluster-wide
    rendered = subprocess.run([cluster.binary("helm"), "template", "rft", str(chart), "-n", "ops", "--set",
                               "kueue.enabled=true", "--set", "watchNamespaces={team-a}"],
                              capture_output=True, text=True, check=True).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    assert [d["rules"] for d in docs if d["kind"] == "Role" and d["metadata"]["namespace"] == "team-a"] == \
        [OPERATOR_RULES + KUEUE_RULES]
    assert [d["rules"] for d in docs if d["kind"] == "ClusterRole"] == [KUEUE_CLUSTER_RULES]
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--kueue" in args and parse_args(args).kueue
