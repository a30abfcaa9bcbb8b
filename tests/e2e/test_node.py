"""The real local node (e2e/node.py): Ready with containerd, pods isolated by their securityContext,
running their image's filesystem, cluster DNS, kubectl logs/exec, local-directory volumes (RWO, RWX)."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from e2e.cluster import LocalCluster
from e2e.node import LocalNode
from tests.e2e.stack import build_images, load_images

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

OPERATOR_IMAGE_NAME = "operator"


@pytest.fixture(scope="module")
def operator_image(on_real_node: LocalNode) -> str:
    images = build_images("operator")
    load_images(on_real_node, images)
    (ref,) = images
    return ref


def _pod(name: str, node: str, image: str, command: list[str], claim: str) -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "main", "image": image, "imagePullPolicy": "Never", "command": command,
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                    "readOnlyRootFilesystem": True},
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }


def _wait_ready(cluster: LocalCluster, ns: str, pod: str, timeout: int = 120) -> None:
    p = cluster.kubectl("wait", "-n", ns, "--for=condition=Ready", f"pod/{pod}", f"--timeout={timeout}s",
                        check=False, timeout=timeout + 10)
    if p.returncode != 0:
        desc = cluster.kubectl("describe", "pod", "-n", ns, pod, check=False).stdout
        pytest.fail(f"pod {ns}/{pod} not Ready: {p.stderr}\n{desc[-3000:]}")


def test_node_is_ready_with_containerd(cluster: LocalCluster, on_real_node: LocalNode) -> None:
    real_node = on_real_node
    out = cluster.kubectl("get", "nodes", "-o", "wide").stdout
    line = next(ln for ln in out.splitlines() if ln.startswith(real_node.name + " "))
    assert " Ready " in line and "containerd://" in line, out
    node = json.loads(cluster.kubectl("get", "node", real_node.name, "-o", "json").stdout)
    assert not node["spec"].get("taints") and not node["spec"].get("unschedulable"), node["spec"]
    addrs = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addrs["InternalIP"] == real_node.net.node_ip


def test_pod_runs_as_its_user_with_its_image_and_volumes(cluster: LocalCluster, on_real_node: LocalNode,
                                                         operator_image: str, namespace: str) -> None:
    real_node = on_real_node
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "shared"},
             "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}}
    script = ("import os, socket, time\n"
              "print('uid', os.getuid(), flush=True)\n"
              "print('dns', socket.gethostbyname('kubernetes.default.svc.cluster.local'), flush=True)\n"
              "open('/data/' + os.environ['HOSTNAME'], 'w').write('hello')\n"
              "time.sleep(3600)\n")
    pods = [_pod(n, real_node.name, operator_image, ["python", "-c", script], "shared") for n in ("a", "b")]
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all([claim, *pods]))
    for p in ("a", "b"):
        _wait_ready(cluster, namespace, p)

    def logs(pod: str) -> str:
        deadline = time.monotonic() + 30
        while True:
            out = cluster.kubectl("logs", "-n", namespace, pod, check=False).stdout
            if "dns" in out or time.monotonic() > deadline:
                return out
            time.sleep(0.5)

    for p in ("a", "b"):
        out = logs(p)
        assert "uid 1000" in out, out
        assert "dns 10.0.0.1" in out, out  # CoreDNS answers the Service's cluster IP
    ex = cluster.kubectl("exec", "-n", namespace, "a", "--", "python", "-c",
                         "import os, json; print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), "
                         "'venv': os.path.isdir('/opt/venv'), 'root': sorted(os.listdir('/')), "
                         "'data': sorted(os.listdir('/data')), "
                         "'status': [l for l in open('/proc/self/status') if l.startswith(('CapEff', 'Seccomp:'))]}))"
                         ).stdout
    got = json.loads(ex)
    assert got["uid"] == 1000 and got["gid"] == 1000
    assert got["venv"], "the image's /opt/venv is missing"
    assert "work" not in got["root"] and "root" in got["root"], got["root"]  # the image's tree, not the host's
    assert got["data"] == ["a", "b"], "both pods write to the one ReadWriteMany claim"
    assert "CapEff:\t0000000000000000\n" in got["status"] and "Seccomp:\t2\n" in got["status"], got["status"]
    ro = cluster.kubectl("exec", "-n", namespace, "a", "--", "python", "-c", "open('/x', 'w')", check=False)
    assert ro.returncode != 0 and "Read-only file system" in ro.stderr
