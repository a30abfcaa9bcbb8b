"""The process kubelet (e2e/kubelet.py) against the real local control plane, plus its pure parts.

Cluster tests create real workloads (Deployment, Service, Job, Pods) and check what the pods'
processes saw and what the controllers concluded from the status the kubelet reported.
"""

from __future__ import annotations

import json
import os
import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from e2e import podenv, podnet, podstatus
from e2e.kubelet import ProcessKubelet, default_image_map, image_entry, resolve_image
from tests.polling import wait_for as poll

T = TypeVar("T")
IMAGE = "ghcr.io/rft-dev/rft-runtime:0.1.0"


# ------------------------------------------------------------------------------------------ helpers


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 90.0, interval: float = 0.25) -> T:
    return poll(what, fn, timeout, interval)


def apply(cluster, namespace: str, *docs: dict) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs))


def get(cluster, namespace: str, kind: str, name: str) -> dict | None:
    p = cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    return json.loads(p.stdout) if p.returncode == 0 else None


def pod_of(cluster, namespace: str, selector: str) -> dict | None:
    items = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout)["items"]
    return items[0] if items else None


def phase_is(cluster, namespace: str, name: str, *phases: str) -> dict | None:
    pod = get(cluster, namespace, "pod", name)
    return pod if pod and pod.get("status", {}).get("phase") in phases else None


def pod(name: str, containers: list[dict], **spec: Any) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"test": name}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 30, **spec, "containers": containers}}


def python(script: str) -> list[str]:
    return ["python", "-c", textwrap.dedent(script)]


def marker_pids(marker: str) -> list[int]:
    """Live processes whose environment holds ``RFT_TEST_MARKER=<marker>``."""
    needle = f"RFT_TEST_MARKER={marker}".encode()
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if needle in Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0"):
                state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    out.append(int(entry.name))
        except OSError:
            continue
    return out


POD_IP_ENV = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


# ------------------------------------------------------------------------------------------ pure parts


@pytest.mark.parametrize("text,expected", [
    ("$(A)-$(B)", "a-b"), ("$$(A)", "$(A)"), ("$(MISSING)", "$(MISSING)"), ("$(A", "$(A"),
    ("a$", "a$"), ("$x$(A)", "$xa"), ("$$$$", "$$"), ("$(A)$(A)", "aa"), ("", ""),
])
def test_expansion_follows_kubernetes_rules(text: str, expected: str) -> None:
    assert podenv.expand(text, {"A": "a", "B": "b"}) == expected


def test_env_order_fieldrefs_and_resource_fields() -> None:
    pod_obj = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"x": "1"},
                            "annotations": {"a": "b"}},
               "spec": {"nodeName": "n", "serviceAccountName": "sa"}}
    container = {"name": "c", "resources": {"limits": {"memory": "1Gi"}, "requests": {"cpu": "250m"}},
                 "env": [{"name": "FIRST", "value": "$(LATER)"}, {"name": "LATER", "value": "x"},
                         {"name": "REF", "value": "$(FIRST)/$(LATER)/$(KUBERNETES_SERVICE_PORT)"},
                         {"name": "LBL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['x']"}}},
                         {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                         {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory",
                                                                            "divisor": "1Mi"}}},
                         {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu"}}},
                         {"name": "CPULIM", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}]}
    env = podenv.container_env(pod_obj, container, pod_ip="127.0.9.9", host_ip="127.0.0.1",
                               service_env=podenv.api_server_env("127.0.0.1", 6443), get_object=lambda *a: None,
                               allocatable={"cpu": "4"})
    assert env["FIRST"] == "$(LATER)"  # only variables defined earlier expand
    assert env["REF"] == "$(LATER)/x/6443"
    assert (env["LBL"], env["IP"], env["MEM"], env["CPU"], env["CPULIM"]) == ("1", "127.0.9.9", "1024", "1", "4")
    with pytest.raises(podenv.EnvError, match="env S: secret ns/missing not found"):
        podenv.container_env(pod_obj, {"env": [{"name": "S", "valueFrom": {"secretKeyRef": {
            "name": "missing", "key": "k"}}}]}, pod_ip=None, host_ip="h", service_env={},
            get_object=lambda *a: None, allocatable={})


def test_quantities() -> None:
    assert podenv.parse_quantity("500m") * 2 == 1
    assert podenv.parse_quantity("2Gi") == 2 * 1024**3
    assert podenv.parse_quantity("1e3") == 1000
    with pytest.raises(ValueError, match="not a resource quantity"):
        podenv.parse_quantity("12 apples")


def test_image_resolution_by_exact_repository_and_prefix(tmp_path: Path) -> None:
    a, b, c = (image_entry(tmp_path / n / "bin") for n in "abc")
    m = {"ghcr.io/rft-dev/rft-runtime": a, "ghcr.io/rft-dev": b, "vllm/vllm-openai": c}
    assert resolve_image(m, "ghcr.io/rft-dev/rft-runtime:0.1.0") is a
    assert resolve_image(m, "ghcr.io/rft-dev/rft-runtime@sha256:abc") is a
    assert resolve_image(m, "ghcr.io/rft-dev/other:1") is b
    assert resolve_image(m, "docker.io/vllm/vllm-openai:v0.11.0") is c
    assert resolve_image(m, "ghcr.io/rft-devil/x:1") is None
    assert resolve_image(m, "busybox") is None
    assert Path(default_image_map()["ghcr.io/rft-dev/rft-operator"].bin_dir) == \
        Path(__file__).resolve().parents[2] / ".venv" / "bin"


def test_service_resolution_prefers_ready_and_keeps_choice() -> None:
    svc = {"metadata": {"namespace": "ns", "name": "web"}, "spec": {"selector": {"app": "web"}}}
    a = podnet.PodEndpoint("ns", "a", "127.0.1.2", {"app": "web"}, ready=False, running=True)
    b = podnet.PodEndpoint("ns", "b", "127.0.1.3", {"app": "web"}, ready=True, running=True)
    c = podnet.PodEndpoint("ns", "c", "127.0.1.4", {"app": "web"}, ready=True, running=True)
    assert podnet.resolve_services([svc], [a, b, c]) == {("ns", "web"): "127.0.1.3"}
    assert podnet.resolve_services([svc], [a, b, c], {("ns", "web"): "127.0.1.4"}) == {("ns", "web"): "127.0.1.4"}
    not_ready_ok = {**svc, "spec": {**svc["spec"], "publishNotReadyAddresses": True}}
    assert podnet.resolve_services([not_ready_ok], [a]) == {("ns", "web"): "127.0.1.2"}
    hosts = podnet.render_hosts(podnet.PodEndpoint("other", "client", "127.0.1.9"), {("ns", "web"): "127.0.1.3"})
    assert "127.0.1.3\tweb.ns.svc.cluster.local web.ns.svc web.ns\n" in hosts  # no bare name across namespaces


def test_pod_ips_are_exclusive_across_allocators(tmp_path: Path) -> None:
    first, second = podnet.IpAllocator(tmp_path), podnet.IpAllocator(tmp_path)  # two "sessions"
    start = second._cursor = first._cursor  # both try the same addresses first
    a = [first.allocate(f"a{i}") for i in range(5)]
    b = [second.allocate(f"b{i}") for i in range(5)]
    assert not set(a) & set(b) and all(ip.startswith("127.0.") and ip != "127.0.0.1" for ip in a + b)
    first.release(a[0])
    second._cursor = start
    assert second.allocate("again") == a[0]  # a released address is free again
    first.release_all()
    second.release_all()


def test_phase_rules() -> None:
    view = podstatus.PodView(restart_policy="Never")
    ok = podstatus.ContainerRecord("a", "i", state="terminated", exit_code=0, done=True, ever_ran=True)
    bad = podstatus.ContainerRecord("b", "i", state="terminated", exit_code=3, done=True, ever_ran=True)
    running = podstatus.ContainerRecord("c", "i", state="running", ever_ran=True)
    waiting_init = podstatus.ContainerRecord("i", "i", init=True)
    assert podstatus.phase([], [ok], view) == "Succeeded"
    assert podstatus.phase([], [ok, bad], view) == "Failed"
    assert podstatus.phase([], [ok, running], view) == "Running"
    assert podstatus.phase([waiting_init], [running], view) == "Pending"
    assert podstatus.phase([], [podstatus.ContainerRecord("w", "i")], view) == "Pending"


# ------------------------------------------------------------------------------------------ cluster


@pytest.mark.e2e
@pytest.mark.cluster
def test_deployment_becomes_ready_and_is_reachable_by_service_name(cluster, kubelet: ProcessKubelet,
                                                                   namespace: str) -> None:
    # The client starts first and retries: the name appears in its (already mounted) hosts file only
    # once the server's readiness probe passed, so the in-place rewrite is what it sees.
    client = pod("client", [{
        "name": "client", "image": IMAGE, "env": [{"name": "NS", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.namespace"}}}],
        "command": python("""
            import os, socket, sys, time, urllib.request
            deadline = time.time() + 120
            while True:
                try:
                    addr = socket.gethostbyname("web")
                    break
                except OSError:
                    if time.time() > deadline: sys.exit("web never resolved")
                    time.sleep(0.2)
            for host in ("web", f"web.{os.environ['NS']}", f"web.{os.environ['NS']}.svc.cluster.local"):
                with urllib.request.urlopen(f"http://{host}:8000/", timeout=10) as r:
                    print("GET", host, r.status, addr, flush=True)
        """)}])
    apply(cluster, namespace, client)
    server = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {
        "replicas": 1, "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{
            "name": "web", "image": IMAGE, "env": [POD_IP_ENV],
            "command": ["python", "-m", "http.server", "--bind", "$(POD_IP)", "8000"],
            "readinessProbe": {"httpGet": {"path": "/", "port": 8000}, "periodSeconds": 1}}]}}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
               "spec": {"selector": {"app": "web"}, "ports": [{"port": 8000, "targetPort": 8000}]}}
    apply(cluster, namespace, server, service)

    dep = wait_for("Deployment web available", lambda: (d := get(cluster, namespace, "deployment", "web"))
                   and d.get("status", {}).get("readyReplicas") == 1 and d)
    assert dep["status"]["availableReplicas"] == 1
    web = pod_of(cluster, namespace, "app=web")
    st = web["status"]
    assert st["podIP"].startswith("127.0.") and st["podIP"] != "127.0.0.1" and st["hostIP"] == "127.0.0.1"
    assert {c["type"]: c["status"] for c in st["conditions"]}["Ready"] == "True"
    assert st["containerStatuses"][0]["ready"] is True and st["containerStatuses"][0]["started"] is True

    done = wait_for("client pod Succeeded", lambda: phase_is(cluster, namespace, "client", "Succeeded", "Failed"))
    out = kubelet.logs(namespace, "client", "client")
    assert done["status"]["phase"] == "Succeeded", out
    assert out.count(" 200 ") == 3 and f" 200 {st['podIP']}" in out


@pytest.mark.e2e
@pytest.mark.cluster
def test_job_exit_codes_reach_pod_and_job_status(cluster, kubelet: ProcessKubelet, namespace: str) -> None:
    def job(name: str, code: int) -> dict:
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": {
            "backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": IMAGE,
                "command": ["python", "-c", f"print('bye'); raise SystemExit({code})"]}]}}}}

    apply(cluster, namespace, job("fails", 3), job("works", 0))

    def condition(name: str, ctype: str) -> dict | None:
        j = get(cluster, namespace, "job", name)
        conds = {c["type"]: c for c in (j or {}).get("status", {}).get("conditions") or []}
        return j if conds.get(ctype, {}).get("status") == "True" else None

    wait_for("Job works Complete", lambda: condition("works", "Complete"))
    wait_for("Job fails Failed", lambda: condition("fails", "Failed"))
    failed = pod_of(cluster, namespace, "job-name=fails")
    assert failed["status"]["phase"] == "Failed"
    term = failed["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (3, "Error")
    ok = pod_of(cluster, namespace, "job-name=works")
    assert ok["status"]["phase"] == "Succeeded"
    term = ok["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (0, "Completed")
    assert kubelet.logs(namespace, ok["metadata"]["name"], "main") == "bye\n"
    # kubectl logs goes through the API server to the kubelet's endpoint
    assert cluster.kubectl("logs", "-n", namespace, failed["metadata"]["name"]).stdout == "bye\n"


@pytest.mark.e2e
@pytest.mark.cluster
def test_env_and_volumes_are_visible_in_the_pod(cluster, kubelet: ProcessKubelet, namespace: str) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
          "data": {"app.conf": "color=blue\n", "other": "x", "LEVEL": "debug"}}
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sec"}, "stringData": {"password": "hunter2"}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data"},
           "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}
    mounts = [{"name": "cfg", "mountPath": "/rft-e2e/etc/cfg"},
              {"name": "cfg", "mountPath": "/rft-e2e/etc/app.conf", "subPath": "app.conf"},
              {"name": "sec", "mountPath": "/rft-e2e/etc/sec"},
              {"name": "data", "mountPath": "/rft-e2e/data"},
              {"name": "data", "mountPath": "/rft-e2e/data-ro", "readOnly": True},
              {"name": "scratch", "mountPath": "/rft-e2e/scratch"},
              {"name": "info", "mountPath": "/rft-e2e/etc/info"},
              {"name": "scratch", "mountPath": "/rft-e2e/etc/cfg/nested"}]  # inside a read-only volume
    script = python("""
        import json, os, stat
        def read(p): return open(p).read()
        out = {"env": {k: os.environ.get(k) for k in ("POD_NAME", "POD_NS", "POD_UID", "LABEL", "PASSWORD",
               "LEVEL", "CFG_LEVEL", "MEM_MI", "EXPANDED", "ESCAPED", "KUBERNETES_SERVICE_HOST",
               "KUBERNETES_SERVICE_PORT", "HOSTNAME")},
               "cwd": os.getcwd(),
               "cfg": read("/rft-e2e/etc/cfg/renamed.conf"), "cfg_keys": sorted(os.listdir("/rft-e2e/etc/cfg")),
               "subpath": read("/rft-e2e/etc/app.conf"),
               "secret": read("/rft-e2e/etc/sec/password"),
               "secret_mode": oct(stat.S_IMODE(os.stat("/rft-e2e/etc/sec/password").st_mode)),
               "from_init": read("/rft-e2e/scratch/init.txt"), "pvc_init": read("/rft-e2e/data/init.txt"),
               "nested": read("/rft-e2e/etc/cfg/nested/init.txt"),
               "labels": read("/rft-e2e/etc/info/labels")}
        try:
            open("/rft-e2e/data-ro/x", "w"); out["ro"] = "writable"
        except OSError as e:
            out["ro"] = e.errno
        try:
            open("/rft-e2e/etc/cfg/new", "w"); out["cfg_ro"] = "writable"
        except OSError as e:
            out["cfg_ro"] = e.errno
        try:
            open("/rft-e2e/root-write", "w"); out["root_ro"] = "writable"
        except OSError as e:
            out["root_ro"] = e.errno
        open("/rft-e2e/data/main.txt", "w").write("from main")
        print(json.dumps(out))
    """)
    spec = pod("vols", [{
        "name": "main", "image": IMAGE, "command": script, "workingDir": "/rft-e2e/scratch", "volumeMounts": mounts,
        "resources": {"limits": {"memory": "256Mi"}}, "securityContext": {"readOnlyRootFilesystem": True},
        "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                {"name": "LABEL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['test']"}}},
                {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "password"}}},
                {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "LEVEL"}}},
                {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                {"name": "EXPANDED", "value": "$(POD_NAME).$(POD_NS)"},
                {"name": "ESCAPED", "value": "$$(POD_NAME)"}]}],
        initContainers=[{"name": "init", "image": IMAGE, "volumeMounts": mounts[3:6],
                         "command": ["sh", "-c", "echo -n from-init > /rft-e2e/scratch/init.txt && "
                                                 "echo -n pvc > /rft-e2e/data/init.txt"]}],
        volumes=[{"name": "cfg", "configMap": {"name": "cfg", "items": [
                     {"key": "app.conf", "path": "renamed.conf"}, {"key": "app.conf", "path": "app.conf"}]}},
                 {"name": "sec", "secret": {"secretName": "sec", "defaultMode": 0o400}},
                 {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                 {"name": "scratch", "emptyDir": {}},
                 {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {
                     "fieldPath": "metadata.labels"}}]}}])
    apply(cluster, namespace, cm, secret, pvc, spec)

    done = wait_for("pod vols finished", lambda: phase_is(cluster, namespace, "vols", "Succeeded", "Failed"), 120)
    logs = kubelet.logs(namespace, "vols", "main")
    assert done["status"]["phase"] == "Succeeded", logs + kubelet.logs(namespace, "vols", "init")
    seen = json.loads(logs.strip().splitlines()[-1])
    env = seen["env"]
    assert (env["POD_NAME"], env["POD_NS"], env["POD_UID"]) == ("vols", namespace, done["metadata"]["uid"])
    assert (env["LABEL"], env["PASSWORD"], env["LEVEL"], env["CFG_LEVEL"]) == ("vols", "hunter2", "debug", "debug")
    assert env["MEM_MI"] == "256" and env["EXPANDED"] == f"vols.{namespace}" and env["ESCAPED"] == "$(POD_NAME)"
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1" and env["KUBERNETES_SERVICE_PORT"] == str(kubelet.api_port)
    assert env["HOSTNAME"] == "vols" and seen["cwd"] == "/rft-e2e/scratch"
    assert seen["cfg"] == "color=blue\n" and seen["cfg_keys"] == ["app.conf", "nested", "renamed.conf"]
    assert seen["subpath"] == "color=blue\n"
    assert seen["secret"] == "hunter2" and seen["secret_mode"] == "0o400"
    assert seen["from_init"] == seen["nested"] == "from-init" and seen["pvc_init"] == "pvc"
    assert seen["labels"] == 'test="vols"'
    # EROFS: a readOnly mount, configMap volumes (always read-only), readOnlyRootFilesystem
    assert (seen["ro"], seen["cfg_ro"], seen["root_ro"]) == (30, 30, 30)
    assert not Path("/rft-e2e/root-write").exists()
    claim = get(cluster, namespace, "pvc", "data")
    assert claim["status"]["phase"] == "Bound"
    pv = json.loads(cluster.kubectl("get", "pv", claim["spec"]["volumeName"], "-o", "json").stdout)
    assert pv["spec"]["claimRef"]["name"] == "data" and pv["spec"].get("storageClassName", "") == ""
    assert Path(pv["spec"]["hostPath"]["path"], "main.txt").read_text() == "from main"
    assert not Path("/rft-e2e/data/main.txt").exists()  # the mount stayed in the pod's mount namespace


@pytest.mark.e2e
@pytest.mark.cluster
def test_service_account_token_gives_the_pod_its_rbac(cluster, kubelet: ProcessKubelet, namespace: str) -> None:
    rbac = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "pod-reader"},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "reader"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
         "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]},
    ]
    script = python("""
        import os
        from kubernetes import client, config
        from kubernetes.client.exceptions import ApiException
        sa = "/var/run/secrets/kubernetes.io/serviceaccount"
        print("files", sorted(f for f in os.listdir(sa) if not f.startswith(".")))
        print("namespace", open(f"{sa}/namespace").read())
        config.load_incluster_config()
        core = client.CoreV1Api()
        me = core.read_namespaced_pod(os.environ["POD_NAME"], os.environ["POD_NS"])
        print("self", me.metadata.name, me.spec.service_account_name)
        try:
            core.list_namespaced_secret(os.environ["POD_NS"])
            print("secrets listed")
        except ApiException as e:
            print("secrets", e.status)
    """)
    spec = pod("sa", [{"name": "main", "image": IMAGE, "command": script, "env": [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]}],
        serviceAccountName="reader")
    apply(cluster, namespace, *rbac)
    wait_for("kube-root-ca.crt published", lambda: get(cluster, namespace, "configmap", "kube-root-ca.crt"))
    apply(cluster, namespace, spec)
    done = wait_for("pod sa finished", lambda: phase_is(cluster, namespace, "sa", "Succeeded", "Failed"), 120)
    out = kubelet.logs(namespace, "sa", "main")
    assert done["status"]["phase"] == "Succeeded", out
    assert "files ['ca.crt', 'namespace', 'token']" in out
    assert f"namespace {namespace}" in out
    assert "self sa reader" in out
    assert "secrets 403" in out


@pytest.mark.e2e
@pytest.mark.cluster
def test_liveness_failure_restarts_the_container(cluster, kubelet: ProcessKubelet, namespace: str) -> None:
    spec = pod("live", [{
        "name": "main", "image": IMAGE, "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "command": ["sh", "-c", "echo start; touch /tmp/alive; sleep 2; rm /tmp/alive; sleep 600"],
        "livenessProbe": {"exec": {"command": ["test", "-f", "/tmp/alive"]}, "periodSeconds": 1,
                          "failureThreshold": 2}}],
        restartPolicy="Always", terminationGracePeriodSeconds=1, volumes=[{"name": "tmp", "emptyDir": {}}])
    apply(cluster, namespace, spec)

    def restarted() -> dict | None:
        p = get(cluster, namespace, "pod", "live")
        cs = ((p or {}).get("status", {}).get("containerStatuses") or [{}])[0]
        return cs if cs.get("restartCount", 0) >= 1 and cs.get("lastState", {}).get("terminated") else None

    cs = wait_for("container restarted after liveness failures", restarted, 90)
    assert cs["lastState"]["terminated"]["exitCode"] in (137, 143)
    assert "liveness" in cs["lastState"]["terminated"].get("message", "")
    # the restarted process writes its line soon after the status reports the restart, not before it
    wait_for("the restarted container's first line", lambda: kubelet.logs(namespace, "live", "main").count("start\n") >= 2,
             30)
    events = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)["items"]
    assert any(e["reason"] == "Unhealthy" and "Liveness" in e["message"] for e in events)


@pytest.mark.e2e
@pytest.mark.cluster
def test_unmapped_image_waits_with_a_clear_reason(cluster, kubelet: ProcessKubelet, namespace: str) -> None:
    apply(cluster, namespace, pod("nope", [{"name": "main", "image": "example.com/not/mapped:1", "command": ["true"]}]))

    def waiting() -> dict | None:
        p = get(cluster, namespace, "pod", "nope")
        cs = ((p or {}).get("status", {}).get("containerStatuses") or [{}])[0]
        return cs.get("state", {}).get("waiting") if cs.get("state", {}).get("waiting", {}).get(
            "reason") == "ImageNotMapped" else None

    w = wait_for("ImageNotMapped", waiting)
    assert "example.com/not/mapped:1" in w["message"]
    assert get(cluster, namespace, "pod", "nope")["status"]["phase"] == "Pending"


def _sleepers(marker: str) -> dict:
    """A container leaving processes behind in three ways: a background child, a grandchild in its
    own session (escapes the process group), and one that ignores SIGTERM (4 processes with sh)."""
    return {"name": "main", "image": IMAGE, "env": [{"name": "RFT_TEST_MARKER", "value": marker}],
            "command": ["sh", "-c", "sleep 600 & setsid sleep 600 & (trap '' TERM; sleep 600) & echo started; wait"]}


@pytest.mark.e2e
@pytest.mark.cluster
def test_deleting_a_pod_kills_its_processes(cluster, kubelet: ProcessKubelet, namespace: str) -> None:
    marker = uuid.uuid4().hex
    apply(cluster, namespace, pod("doomed", [_sleepers(marker)]))
    wait_for("pod doomed Running", lambda: phase_is(cluster, namespace, "doomed", "Running"))
    wait_for("its processes", lambda: len(marker_pids(marker)) >= 4)
    cluster.kubectl("delete", "pod", "doomed", "-n", namespace, "--wait=false")
    wait_for("pod object removed by the kubelet", lambda: get(cluster, namespace, "pod", "doomed") is None, 60)
    assert marker_pids(marker) == []


@pytest.mark.e2e
@pytest.mark.cluster
def test_stop_leaves_no_process_behind(cluster, kube, namespace: str, tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    node = f"rft-stop-{uuid.uuid4().hex[:6]}"
    k = ProcessKubelet(kube, node, tmp_path / "kubelet", default_image_map(), grace_cap_s=1.0).start()
    try:
        spec = pod("leftover", [_sleepers(marker)], nodeName=node)
        apply(cluster, namespace, spec)
        wait_for("pod leftover Running", lambda: phase_is(cluster, namespace, "leftover", "Running"))
        wait_for("its processes", lambda: len(marker_pids(marker)) >= 4)
        assert set(marker_pids(marker)) <= set(k.pids())
    finally:
        k.stop(delete_node=True)
    assert marker_pids(marker) == []
    assert k.pids() == []
    assert get(cluster, "default", "node", node) is None
