"""The operator with least privilege, against the real kube-apiserver: a namespaced Role with exactly
``OPERATOR_RULES`` (what the chart renders when ``watchNamespaces`` is set), no ClusterRole.

Attacks, each failing the test if it succeeds: the operator's identity listing Secrets or reading
one outside its namespace; the job token leaking into the RFTJob (status), its Events, the runtime
config or any other child; a re-reconcile, an edit or an operator restart rotating the token; a
Secret planted under the token's name before the job exists being adopted.
"""
from __future__ import annotations

import base64
import json
import subprocess
import uuid

import pytest
import yaml

from rft_api.job import parse_manifest
from rft_operator import names
from rft_operator.builders import BuildContext
from rft_operator.builders import network as network_builder
from rft_operator.kube import Kube, KubeError
from rft_operator.permissions import OPERATOR_RULES
from rft_operator.reconcile import reconcile
from tests.operator.cluster_support import (  # noqa: F401
    ROOT,
    OperatorThread,
    api,
    crd,
    create_job,
    job_manifest,
)
from tests.support.polling import wait_for

pytestmark = pytest.mark.cluster
JOB = "tiny-arith"
RBAC = "/apis/rbac.authorization.k8s.io/v1"


@pytest.fixture
def namespaced_operator(cluster, crd, api, namespace, tmp_path):
    """A ServiceAccount bound to a Role with the operator's rules in ``namespace`` only; its kubeconfig."""
    api.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "rft-operator", "namespace": namespace}})
    api.request("POST", f"{RBAC}/namespaces/{namespace}/roles", body={
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "rft-operator"},
        "rules": OPERATOR_RULES})
    api.request("POST", f"{RBAC}/namespaces/{namespace}/rolebindings", body={
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "rft-operator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "rft-operator"},
        "subjects": [{"kind": "ServiceAccount", "name": "rft-operator", "namespace": namespace}]})
    return cluster.service_account_kubeconfig(namespace, "rft-operator", tmp_path / "operator.kubeconfig")


def _token(api: Kube, namespace: str) -> tuple[str, dict]:
    secret = api.get("Secret", namespace, names.token(JOB))
    assert secret is not None
    return base64.b64decode(secret["data"]["token"]).decode(), secret


def _can(restricted: Kube, namespace: str, verb: str, resource: str, subresource: str = "",
         group: str = "rft.dev") -> bool:
    review = restricted.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body={
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"namespace": namespace, "verb": verb, "group": group,
                                        "resource": resource, "subresource": subresource}}})
    return bool((review or {}).get("status", {}).get("allowed"))


def test_the_operators_identity_cannot_enumerate_or_read_other_secrets(api, namespace, namespaced_operator) -> None:
    restricted = Kube.from_kubeconfig(str(namespaced_operator))
    try:
        for method, path in (("GET", f"/api/v1/namespaces/{namespace}/secrets"),  # list
                             ("GET", "/api/v1/secrets"),  # list everywhere
                             ("GET", "/api/v1/namespaces/kube-system/secrets/anything"),  # another namespace
                             ("GET", "/apis/rft.dev/v1alpha1/rftjobs"),  # jobs of every namespace
                             ("POST", f"/api/v1/namespaces/{namespace}/pods")):
            with pytest.raises(KubeError) as e:
                restricted.request(method, path, body={} if method == "POST" else None)
            assert e.value.status == 403, (method, path)
        for verb in ("update", "patch", "delete", "watch"):
            assert not _can(restricted, namespace, verb, "secrets", group=""), verb
        # owner references with blockOwnerDeletion under OwnerReferencesPermissionEnforcement
        assert _can(restricted, namespace, "update", "rftjobs", "finalizers")
        assert not _can(restricted, "default", "update", "rftjobs", "finalizers")
    finally:
        restricted.close()


def test_the_operator_creates_one_token_and_the_policies_and_never_leaks_or_rotates_it(
        cluster, api, namespace, namespaced_operator) -> None:
    op = OperatorThread(namespaced_operator, namespace, resync_seconds=0.5).start()
    try:
        create_job(api, namespace, job_manifest(JOB))
        wait_for("token Secret", lambda: api.get("Secret", namespace, names.token(JOB)))
        token, secret = _token(api, namespace)
        job_obj = wait_for("status", lambda: (o := api.get("RFTJob", namespace, JOB)).get("status") and o)
        assert len(token) >= 40 and secret["immutable"] is True and secret["type"] == "Opaque"
        (ref,) = secret["metadata"]["ownerReferences"]
        assert ref["uid"] == job_obj["metadata"]["uid"] and ref["controller"] and ref["blockOwnerDeletion"]

        # the policies, as the pure builder renders them
        job = parse_manifest(job_obj)
        want = {p["metadata"]["name"]: p["spec"] for p in network_builder.policies(job, BuildContext())}
        got = wait_for("NetworkPolicies", lambda: (p := {o["metadata"]["name"]: o["spec"] for o in
                                                      api.list("NetworkPolicy", namespace, names.job_selector(JOB))})
                       and len(p) == len(want) and p)
        assert got == want and len(want) >= 3

        # every pod template takes it by reference; no child holds its value
        workloads = wait_for("workloads", lambda: (w := api.list("Deployment", namespace, names.job_selector(JOB))
                                                   + api.list("Job", namespace, names.job_selector(JOB)))
                             and len(w) >= 3 and w)
        for w in workloads:
            for c in w["spec"]["template"]["spec"]["containers"]:
                env = {e["name"]: e for e in c.get("env", [])}
                assert env["RFT_JOB_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": names.token(JOB), "key": "token"}
        for kind in ("ConfigMap", "Service", "Deployment", "Job", "NetworkPolicy", "Role", "RoleBinding"):
            for o in api.list(kind, namespace, names.job_selector(JOB)):
                assert token not in json.dumps(o), f"{kind}/{o['metadata']['name']} holds the token"

        # an edit and many resyncs later: the same Secret, the same token
        api.patch("RFTJob", namespace, JOB, {"spec": {"rollout": {"replicas": 2}}})
        wait_for("the edit applied", lambda: api.get("Deployment", namespace, names.rollout(JOB))["spec"]["replicas"] == 2)
        wait_for("resyncs", lambda: op.metrics.reconciles.labels(result="ok")._value.get() >= 10, timeout=60)
        again, secret2 = _token(api, namespace)
        assert again == token and secret2["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"]
    finally:
        op.stop()
    # a restarted operator (empty cache) finds the Secret and keeps it
    op = OperatorThread(namespaced_operator, namespace, resync_seconds=0.5).start()
    try:
        wait_for("resyncs after restart", lambda: op.metrics.reconciles.labels(result="ok")._value.get() >= 3)
        assert _token(api, namespace)[0] == token
    finally:
        op.stop()
    # nowhere in what users and other tenants read about the job
    assert token not in json.dumps(api.get("RFTJob", namespace, JOB))
    for ev in api.list("Event", namespace):
        assert token not in json.dumps(ev)


def test_a_planted_token_secret_is_not_adopted(crd, api, namespace) -> None:
    planted = "attacker-chosen-" + uuid.uuid4().hex
    api.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": names.token(JOB), "namespace": namespace},
                "stringData": {"token": planted}})
    stored = create_job(api, namespace, job_manifest(JOB))
    out = reconcile(api, stored)
    assert any("not controlled by this RFTJob" in e for e in out.errors), out.errors
    assert not [k for k in out.applied if k[0] in ("Deployment", "Job")]  # no pod would read the planted token
    assert not api.list("Deployment", namespace, names.job_selector(JOB)) and not api.list("Job", namespace, names.job_selector(JOB))
    status = api.get("RFTJob", namespace, JOB)["status"]
    assert names.token(JOB) in status["message"] and planted not in json.dumps(status)
    for ev in api.list("Event", namespace):
        assert planted not in json.dumps(ev)


def test_the_chart_grants_a_namespaced_role_per_watched_namespace(cluster) -> None:
    chart = str(ROOT / "charts" / "rft-operator")
    rendered = subprocess.run([cluster.binary("helm"), "template", "rft", chart, "-n", "ops",
                               "--set", "watchNamespaces={team-a,team-b}"],
                              capture_output=True, text=True, check=True).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    roles = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "Role" and "leader" not in d["metadata"]["name"]}
    assert set(roles) == {"team-a", "team-b"} and all(r["rules"] == OPERATOR_RULES for r in roles.values())
    bindings = {d["metadata"]["namespace"]: d for d in docs
                if d["kind"] == "RoleBinding" and "leader" not in d["metadata"]["name"]}
    assert set(bindings) == {"team-a", "team-b"}
    for b in bindings.values():
        assert b["roleRef"]["kind"] == "Role" and b["subjects"][0]["namespace"] == "ops"
    deploy = next(d for d in docs if d["kind"] == "Deployment")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args and "--all-namespaces" not in args
    # the rules: exactly what the operator needs; Secrets get/create only
    secrets_rule = next(r for r in OPERATOR_RULES if r["resources"] == ["secrets"])
    assert secrets_rule["verbs"] == ["get", "create"]
    assert {"apiGroups": ["rft.dev"], "resources": ["rftjobs/finalizers"], "verbs": ["update"]} in OPERATOR_RULES


def test_a_namespace_with_a_resource_quota_admits_every_pod_of_the_job(crd, api, namespace) -> None:
    """ResourceQuota admission refuses a pod any of whose containers lacks a request the quota limits;
    the Deployment, ReplicaSet and Job controllers would then retry forever with no pod."""
    api.request("POST", f"/api/v1/namespaces/{namespace}/resourcequotas", body={
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "team-quota"},
        "spec": {"hard": {"requests.cpu": "64", "requests.memory": "256Gi"}}})
    stored = create_job(api, namespace, job_manifest(JOB))
    out = reconcile(api, stored)
    assert not out.errors, out.errors

    def roles_with_pods() -> set[str]:
        return {p["metadata"]["labels"].get(names.LABEL_ROLE) for p in api.list("Pod", namespace, names.job_selector(JOB))}
    wait_for("a pod of every role", lambda: roles_with_pods() >= {"inference", "rollout", "trainer"}, timeout=90)
