"""Fixtures for e2e tests: the real local node (``e2e/node.py``: kubelet, containerd, kube-proxy,
CoreDNS) on the session's control plane (``cluster`` fixture), and the project's images in it.

- ``real_node`` (session): a :class:`e2e.node.LocalNode` registered with the control plane, stopped
  at the end of the session (its stop raises when anything is left behind: process, mount, network
  namespace, interface, iptables rule, cgroup). With ``RFT_KUBECONFIG`` naming a ``make cluster-up``
  cluster whose node runs, that node is used and left running.
- ``on_real_node`` (module): the real node takes pods; every other node a shared cluster may have is
  cordoned for the module.
- ``node_images`` (session): ``hack/build-images.sh`` (the operator and runtime images, and the
  vLLM-on-CPU image when a collected test is marked ``vllm``; cached by input hash) and the archives
  imported into the node's containerd (once per node and archive).
- ``platform`` (module): the operator installed from the chart, running from its image.
- ``driver``: a :class:`tests.e2e.stack.JobDriver` for the test's namespace; prints its diagnostics
  when the test failed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.cluster import LocalCluster
from e2e.node import LocalNode, ensure_node_binaries
from tests.e2e.stack import (
    IMAGES,
    JobDriver,
    Platform,
    build_images,
    install_platform,
    load_images,
    uninstall_platform,
)
from tests.support import prereqs

ROOT = Path(__file__).resolve().parents[2]


_IMAGES = [IMAGES]
"""The images this session's tests need: the vLLM image only when a collected test is marked ``vllm``."""


def _builds_here() -> bool:
    return os.environ.get("RFT_SKIP_CLUSTER") != "1" and os.geteuid() == 0


# Cold, each takes longer than one test's timeout: built (or a background hack/prepare.sh waited for)
# before the first test that needs it, outside its timeout, once (tests.support.prereqs).
_NODE = prereqs.register(
    "node binaries (hack/build-node.sh)", rank=4,
    wanted=lambda item: _builds_here() and prereqs.uses_fixture("real_node", "on_real_node")(item),
    build=ensure_node_binaries)
_NODE_IMAGES = prereqs.register(
    "images (hack/build-images.sh)", rank=4,
    wanted=lambda item: _builds_here() and prereqs.uses_fixture("node_images")(item),
    build=lambda: build_images(_IMAGES[0]))


def pytest_collection_finish(session: pytest.Session) -> None:
    """The vLLM image is built only when a collected test is marked ``vllm``."""
    if not any(item.get_closest_marker("vllm") for item in session.items):
        _IMAGES[0] = " ".join(n for n in IMAGES.split() if n != "vllm")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


@pytest.fixture(scope="session")
def real_node(cluster: LocalCluster) -> Iterator[LocalNode]:
    if os.geteuid() != 0:
        pytest.skip("a real node needs root (network namespace, mounts, cgroups)")
    node = LocalNode(cluster, bin=_NODE.get())
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
        node.stop(delete_node=True, purge=True)


@pytest.fixture(scope="module")
def on_real_node(cluster: LocalCluster, real_node: LocalNode) -> Iterator[LocalNode]:
    """For one module: the real node takes pods, every other node does not."""
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


@pytest.fixture(scope="session")
def node_images(real_node: LocalNode) -> dict[str, Path]:
    """The operator and runtime images, and the vLLM image when a test needs it, built (cached by
    input hash) and imported into the node."""
    images = _NODE_IMAGES.get()
    load_images(real_node, images)
    return images


@pytest.fixture(scope="module")
def platform(cluster: LocalCluster, on_real_node: LocalNode, node_images: dict[str, Path]) -> Iterator[Platform]:
    """The operator installed from the chart into ``rft-system`` (resync 3 s), running from its image on
    the real node, Ready; uninstalled after the module (the CRD stays). Every role pod runs from the
    runtime image with the builders' securityContext, enforced."""
    p = install_platform(cluster, on_real_node, resync_seconds=3)
    try:
        yield p
    finally:
        uninstall_platform(p)


@pytest.fixture
def driver(platform: Platform, namespace: str, request: pytest.FixtureRequest,
           tmp_path: Path) -> Iterator[JobDriver]:
    """A :class:`JobDriver` for the test's namespace; prints its diagnostics when the test failed."""
    d = JobDriver(platform, namespace, tmp_path / "kept-logs")
    started = time.monotonic()
    try:
        yield d
    finally:
        d.close()
        rep = getattr(request.node, "rep_call", None)
        print(f"\n[e2e] {request.node.name}: {time.monotonic() - started:.1f}s in the test body and its waits")
        if rep is not None and rep.failed:
            print(f"\n===== e2e diagnostics ({namespace}) =====\n{d.diagnostics()}")
