"""The operator works with exactly ``rft_operator.permissions.OPERATOR_RULES`` (a ServiceAccount token
bound to a ClusterRole with those rules), not as cluster admin: children, status, suspend, events;
and leader election with exactly ``LEADER_ELECTION_RULES`` in its namespace."""
from __future__ import annotations

import uuid

import pytest

from rft_operator import names
from rft_operator.kube import Kube, KubeError
from rft_operator.leader import LEASE_NAME
from rft_operator.permissions import LEADER_ELECTION_RULES, OPERATOR_RULES
from tests.operator.cluster_support import (  # noqa: F401
    OperatorThread,
    api,
    children,
    crd,
    create_job,
    job_manifest,
    wait_phase,
)
from tests.support.polling import wait_for

pytestmark = pytest.mark.cluster
JOB = "tiny-arith"


@pytest.fixture
def operator_identity(cluster, crd, api, namespace, tmp_path):
    """A ServiceAccount bound (cluster-wide) to a ClusterRole with the operator's rules; its kubeconfig."""
    role = f"rft-operator-test-{uuid.uuid4().hex[:8]}"
    api.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "rft-operator", "namespace": namespace}})
    api.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", body={
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role},
        "rules": OPERATOR_RULES})
    api.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", body={
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": "rft-operator", "namespace": namespace}]})
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    api.request("POST", f"{rbac}/roles", body={
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "leader-election"},
        "rules": LEADER_ELECTION_RULES})
    api.request("POST", f"{rbac}/rolebindings", body={
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "leader-election"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "leader-election"},
        "subjects": [{"kind": "ServiceAccount", "name": "rft-operator", "namespace": namespace}]})
    try:
        yield cluster.service_account_kubeconfig(namespace, "rft-operator", tmp_path / "operator.kubeconfig")
    finally:
        for kind in ("clusterrolebindings", "clusterroles"):
            api.request("DELETE", f"/apis/rbac.authorization.k8s.io/v1/{kind}/{role}")


def test_operator_runs_with_its_declared_permissions_only(cluster, api, namespace, operator_identity) -> None:
    restricted = Kube.from_kubeconfig(str(operator_identity))
    try:
        for method, path in (("GET", f"/api/v1/namespaces/{namespace}/secrets"),
                             ("POST", f"/api/v1/namespaces/{namespace}/pods"),
                             ("DELETE", f"/api/v1/namespaces/{namespace}/pods/x")):
            with pytest.raises(KubeError) as e:  # not an admin: no Secret listing, pods read only
                restricted.request(method, path, body={} if method == "POST" else None)
            assert e.value.status == 403
    finally:
        restricted.close()

    op = OperatorThread(operator_identity, namespace, leader_election=True).start()
    try:
        doc = job_manifest(JOB)
        create_job(api, namespace, doc)
        wait_for("children", lambda: len(children(api, namespace, JOB)) == 15)  # 12 + 3 NetworkPolicies
        wait_phase(api, namespace, JOB, "Provisioning")
        api.patch("RFTJob", namespace, JOB, {"spec": {"suspend": True}})
        wait_phase(api, namespace, JOB, "Suspended")
        wait_for("workloads removed", lambda: not children(api, namespace, JOB, ("Deployment", "Job")))
        events = [e["reason"] for e in api.list("Event", namespace) if e["involvedObject"]["name"] == JOB]
        assert {"Provisioning", "Suspended"} <= set(events)
        assert op.metrics.errors.labels(kind="unexpected")._value.get() == 0
        assert api.get("Role", namespace, names.trainer(JOB)) is not None
        assert api.get("Lease", namespace, LEASE_NAME)["spec"]["holderIdentity"]
    finally:
        op.stop()
    assert not api.get("Lease", namespace, LEASE_NAME)["spec"].get("holderIdentity")  # released
