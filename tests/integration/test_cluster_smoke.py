"""The local control plane is a real one: kubectl, garbage collection, controllers, scheduler, RBAC.

Also the harness's own pieces that need no cluster: both PKI backends and process-group shutdown.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from e2e.cluster import LocalCluster, generate_pki
from e2e.common import group_members, stop_process_group
from tests.support.polling import wait_for

CONTROLLERS_S = 90.0
"""How long the controllers and the scheduler get to act before a test fails."""


# ---------------------------------------------------------------------------------------- cluster


@pytest.mark.cluster
def test_kubectl_talks_to_a_1_34_api_server(cluster: LocalCluster) -> None:
    out = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert out["serverVersion"]["major"] == "1"
    assert out["serverVersion"]["gitVersion"].startswith("v1.")
    if cluster.bin is not None:  # started by the fixture from our binaries, not an attached one
        assert out["serverVersion"]["gitVersion"].startswith("v1.34.")
    assert cluster.kubectl("get", "namespace", "default", "-o", "name").stdout.strip() == "namespace/default"
    assert cluster.kubectl("auth", "can-i", "*", "*", "--all-namespaces").stdout.strip() == "yes"
    assert LocalCluster.attach(cluster.kubeconfig).ready()


@pytest.mark.cluster
def test_garbage_collector_deletes_owned_configmap(kube, namespace: str) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(kube)
    owner = core.create_namespaced_config_map(namespace, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="owner"), data={"role": "owner"}))
    ref = client.V1OwnerReference(api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid)
    core.create_namespaced_config_map(namespace, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="child", owner_references=[ref]), data={"role": "child"}))
    assert core.read_namespaced_config_map("child", namespace).data == {"role": "child"}

    core.delete_namespaced_config_map("owner", namespace,
                                      body=client.V1DeleteOptions(propagation_policy="Background"))

    def child_gone() -> bool:
        try:
            core.read_namespaced_config_map("child", namespace)
        except ApiException as e:
            if e.status == 404:
                return True
            raise
        return False

    wait_for("the garbage collector to delete configmap/child", child_gone, CONTROLLERS_S)


@pytest.mark.cluster
def test_deployment_gets_replicaset_and_pod_is_seen_by_scheduler(kube, namespace: str) -> None:
    from kubernetes import client

    apps, core = client.AppsV1Api(kube), client.CoreV1Api(kube)
    labels = {"app": "smoke"}
    dep = apps.create_namespaced_deployment(namespace, client.V1Deployment(
        metadata=client.V1ObjectMeta(name="smoke"),
        spec=client.V1DeploymentSpec(
            replicas=1,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="example.invalid/none")])),
        )))

    def owned_replicaset():
        for rs in apps.list_namespaced_replica_set(namespace).items:
            if any(r.uid == dep.metadata.uid and r.controller for r in rs.metadata.owner_references or []):
                return rs
        return None

    rs = wait_for("the deployment controller to create a ReplicaSet", owned_replicaset, CONTROLLERS_S)
    assert rs.spec.replicas == 1

    def owned_pod():
        for pod in core.list_namespaced_pod(namespace).items:
            if any(r.uid == rs.metadata.uid for r in pod.metadata.owner_references or []):
                return pod
        return None

    pod = wait_for("the replicaset controller to create a Pod", owned_pod, CONTROLLERS_S)
    # The pod got the namespace's default ServiceAccount (admission + serviceaccount controller) ...
    assert pod.spec.service_account_name == "default"

    # ... and the scheduler looked at it: no node exists, so it is marked Unschedulable.
    def unschedulable():
        p = core.read_namespaced_pod(pod.metadata.name, namespace)
        return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
                   for c in p.status.conditions or [])

    wait_for("the scheduler to mark the pod Unschedulable", unschedulable, CONTROLLERS_S)


@pytest.mark.cluster
def test_service_account_kubeconfig_has_only_its_rbac(cluster: LocalCluster, kube, namespace: str,
                                                      tmp_path: Path) -> None:
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    core, rbac = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube)
    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name="limited")))
    rbac.create_namespaced_role(namespace, client.V1Role(
        metadata=client.V1ObjectMeta(name="read-configmaps"),
        rules=[client.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["get", "list"])]))
    rbac.create_namespaced_role_binding(namespace, client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name="limited-read-configmaps"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="read-configmaps"),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name="limited", namespace=namespace)]))

    kc = cluster.service_account_kubeconfig(namespace, "limited", tmp_path / "limited.kubeconfig")

    who = json.loads(cluster.kubectl("auth", "whoami", "-o", "json", kubeconfig=kc).stdout)
    assert who["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:limited"

    sa_api = config.new_client_from_config(config_file=str(kc))
    try:
        sa_core = client.CoreV1Api(sa_api)
        # Authenticated (not 401) and granted what its Role grants ...
        assert sa_core.list_namespaced_config_map(namespace).items is not None
        # ... and forbidden (403) everything else, e.g. secrets cluster-wide.
        with pytest.raises(ApiException) as err:
            sa_core.list_secret_for_all_namespaces()
        assert err.value.status == 403
    finally:
        sa_api.close()

    denied = cluster.kubectl("get", "secrets", "--all-namespaces", kubeconfig=kc, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()
    # The admin may.
    assert core.list_secret_for_all_namespaces().items is not None
    assert cluster.kubectl("get", "secrets", "--all-namespaces").returncode == 0


# ---------------------------------------------------------------------------- harness, no cluster


@pytest.mark.parametrize("backend", ["cryptography", "openssl"])
def test_pki_serving_cert_chains_to_ca_with_loopback_san(backend: str, tmp_path: Path) -> None:
    if backend == "cryptography":
        pytest.importorskip("cryptography")
    if shutil.which("openssl") is None:
        pytest.skip("openssl command not available")
    generate_pki(tmp_path, backend=backend)
    verify = subprocess.run(["openssl", "verify", "-CAfile", "ca.crt", "serving.crt"],
                            cwd=tmp_path, capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr
    text = subprocess.run(["openssl", "x509", "-in", "serving.crt", "-noout", "-text"],
                          cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert "IP Address:127.0.0.1" in text and "DNS:kubernetes.default.svc" in text
    assert "TLS Web Server Authentication" in text
    pub = subprocess.run(["openssl", "rsa", "-in", "sa.key", "-pubout"], cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout
    assert pub.split() == (tmp_path / "sa.pub").read_text().split()
    assert (tmp_path / "ca.key").stat().st_mode & 0o077 == 0


def test_stop_process_group_kills_leader_and_children() -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 300 & sleep 300 & wait"], start_new_session=True)
    wait_for("the group's children to start", lambda: len(group_members(proc.pid)) >= 3, 10)
    stop_process_group(proc.pid, None, timeout=5)
    assert group_members(proc.pid) == []
    assert proc.wait(timeout=5) is not None
