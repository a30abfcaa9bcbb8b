"""Fixtures for tests on the real local node (``e2e/node.py``): kubelet, containerd, kube-proxy, CoreDNS.

- ``real_node`` (module scope): a :class:`e2e.node.LocalNode` registered with the session's control
  plane (``cluster`` fixture), stopped at the end of the module; its teardown fails the module's last
  test when anything is left behind (process, mount, network namespace, interface, iptables rule,
  cgroup). With ``RFT_KUBECONFIG`` naming a ``make cluster-up`` cluster whose node runs, that node is
  used and left running.
- ``node_images`` (module scope): ``hack/build-images.sh`` (cached by input hash) and the archives
  imported into the node's containerd; a dict image name -> reference.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.cluster import LocalCluster
from e2e.node import LocalNode, NodeError, ensure_node_binaries

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def real_node(cluster: LocalCluster) -> Iterator[LocalNode]:
    if os.geteuid() != 0:
        pytest.skip("a real node needs root (network namespace, mounts, cgroups)")
    try:
        node = LocalNode(cluster, bin=ensure_node_binaries())
    except NodeError as e:
        pytest.fail(str(e), pytrace=False)
    if os.environ.get("RFT_KUBECONFIG") and node.running() and node.ready():
        yield node
        return
    node = LocalNode(cluster, name=f"rft-node-{os.getpid()}", bin=node.bin, die_with_parent=True)
    node.start(timeout=300)
    try:
        yield node
    finally:
        node.stop(delete_node=True)


def build_images(names: str = "operator runtime") -> dict[str, Path]:
    """``hack/build-images.sh`` for ``names``; image reference -> oci-archive."""
    p = subprocess.run(["bash", str(ROOT / "hack" / "build-images.sh")], capture_output=True, text=True,
                       env={**os.environ, "RFT_IMAGES": names}, timeout=3600)
    if p.returncode != 0:
        pytest.fail(f"hack/build-images.sh failed ({p.returncode}):\n{p.stderr[-4000:]}", pytrace=False)
    listing = Path(p.stdout.strip().splitlines()[-1])
    out = {}
    for line in listing.read_text().splitlines():
        ref, archive = line.split()
        out[ref] = Path(archive)
    return out


def load_images(node: LocalNode, images: dict[str, Path]) -> None:
    for archive in images.values():
        node.import_image(archive)


@pytest.fixture(scope="module")
def node_images(real_node: LocalNode) -> dict[str, Path]:
    """The operator and runtime images, built (cached by input hash) and imported into the node."""
    images = build_images("operator runtime")
    if not (os.environ.get("RFT_KUBECONFIG") and _has_images(real_node, images)):
        load_images(real_node, images)
    return images


def _has_images(node: LocalNode, images: dict[str, Path]) -> bool:
    listed = node._ctr("images", "ls", "-q", check=False).stdout.split()
    return all(ref in listed for ref in images)


@pytest.fixture(scope="module")
def real_platform(cluster: LocalCluster, real_node: LocalNode, node_images: dict[str, Path]) -> Iterator["Platform"]:
    """The operator installed from the chart, running from its image on the real node; every role
    pod runs from the runtime image with the builders' securityContext, enforced."""
    from tests.e2e.stack import install_platform, uninstall_platform

    # Other nodes of the session (the process kubelet's) take no pods meanwhile.
    others = [n for n in cluster.kubectl("get", "nodes", "-o", "name").stdout.split()
              if n != f"node/{real_node.name}"]
    for n in others:
        cluster.kubectl("cordon", n, check=False)
    p = install_platform(cluster, real_node, resync_seconds=3)
    try:
        yield p
    finally:
        try:
            uninstall_platform(p)
        finally:
            for n in others:
                cluster.kubectl("uncordon", n, check=False)
