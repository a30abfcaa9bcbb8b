"""Fixtures for tests on the real local node (``e2e/node.py``): kubelet, containerd, kube-proxy, CoreDNS.

- ``real_node`` (session scope): a :class:`e2e.node.LocalNode` registered with the session's control
  plane (``cluster`` fixture), stopped at the end of the session (its stop raises when anything is
  left behind: process, mount, network namespace, interface, iptables rule, cgroup). With
  ``RFT_KUBECONFIG`` naming a ``make cluster-up`` cluster whose node runs, that node is used and left
  running. Outside the modules that use it (fixture ``on_real_node``), it is cordoned, so the
  process kubelet's tests never get pods there; inside them, every other node is cordoned.
- ``node_images`` (session scope): ``hack/build-images.sh`` (cached by input hash) and the archives
  imported into the node's containerd (once per node and archive).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from e2e.cluster import LocalCluster
from e2e.node import LocalNode, NodeError, ensure_node_binaries

if TYPE_CHECKING:
    from tests.e2e.stack import Platform

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def real_node(cluster: LocalCluster) -> Iterator[LocalNode]:
    if os.geteuid() != 0:
        pytest.skip("a real node needs root (network namespace, mounts, cgroups)")
    try:
        node = LocalNode(cluster, bin=ensure_node_binaries())
    except NodeError as e:
        pytest.fail(str(e), pytrace=False)
    if os.environ.get("RFT_KUBECONFIG") and node.running() and node.ready():
        node.reused = True  # a `make cluster-up` node: left as it was found (schedulable)
        yield node
        return
    node = LocalNode(cluster, name=f"rft-node-{os.getpid()}", bin=node.bin, die_with_parent=True)
    node.start(timeout=300)
    cluster.kubectl("cordon", f"node/{node.name}")
    try:
        yield node
    finally:
        node.stop(delete_node=True)


@pytest.fixture(scope="module")
def on_real_node(cluster: LocalCluster, real_node: LocalNode) -> Iterator[LocalNode]:
    """For one module: the real node takes pods, every other node (the process kubelet's) does not."""
    others = [n for n in cluster.kubectl("get", "nodes", "-o", "name").stdout.split()
              if n != f"node/{real_node.name}"]
    for n in others:
        cluster.kubectl("cordon", n, check=False)
    cluster.kubectl("uncordon", f"node/{real_node.name}")
    try:
        yield real_node
    finally:
        if not getattr(real_node, "reused", False):
            cluster.kubectl("cordon", f"node/{real_node.name}", check=False)
        for n in others:
            cluster.kubectl("uncordon", n, check=False)


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
        if any(f"/rft-{n}:" in ref for n in names.split()):  # the listing also names other images
            out[ref] = Path(archive)
    return out


def load_images(node: LocalNode, images: dict[str, Path]) -> None:
    """Import each archive unless this node already imported that very archive (same input hash)."""
    for archive in images.values():
        node.import_image(archive)


@pytest.fixture(scope="session")
def node_images(real_node: LocalNode) -> dict[str, Path]:
    """The operator and runtime images, built (cached by input hash) and imported into the node."""
    images = build_images("operator runtime")
    load_images(real_node, images)
    return images


@pytest.fixture(scope="module")
def real_platform(cluster: LocalCluster, on_real_node: LocalNode, node_images: dict[str, Path]) -> Iterator["Platform"]:
    """The operator installed from the chart, running from its image on the real node; every role
    pod runs from the runtime image with the builders' securityContext, enforced."""
    from tests.e2e.stack import install_platform, uninstall_platform

    p = install_platform(cluster, on_real_node, resync_seconds=3)
    try:
        yield p
    finally:
        uninstall_platform(p)
