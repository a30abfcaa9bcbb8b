"""Fixtures for e2e tests: the process kubelet on the local control plane.

- ``kubelet`` (session): an :class:`e2e.kubelet.ProcessKubelet` registered as Node
  ``rft-e2e-<pid>`` on the ``cluster`` fixture's control plane, with :func:`default_image_map`
  (the project's images → this checkout's ``.venv/bin``, ``vllm/vllm-openai`` → ``$RFT_VLLM_VENV``)
  and termination grace capped at 5 s. Stopped at the end of the session (every process it started
  is killed and checked gone; the Node is deleted).
- When a test that uses ``kubelet`` fails, the tails of its namespace's container logs are printed
  (pytest shows them under "Captured stdout teardown").
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from e2e.kubelet import ProcessKubelet, default_image_map, delete_stale_nodes
from tests.e2e.node_fixtures import node_images, on_real_node, real_node, real_platform  # noqa: F401 (fixtures)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the node's binaries and the project's images before any test when a collected test runs
    on the real node: cold, they take longer than one test's timeout (failures then fail those tests)."""
    if os.environ.get("RFT_SKIP_CLUSTER") == "1" or os.geteuid() != 0 or session.config.option.collectonly:
        return
    wants = {f for item in session.items for f in getattr(item, "fixturenames", ())}
    if "real_node" in wants or "on_real_node" in wants:
        from e2e.node import NodeError, ensure_node_binaries
        try:
            ensure_node_binaries()
        except NodeError:
            return  # the real_node fixture reports it
    if "node_images" in wants:
        import subprocess
        from pathlib import Path
        subprocess.run(["bash", str(Path(__file__).resolve().parents[2] / "hack" / "build-images.sh")],
                       capture_output=True, timeout=3600, check=False)  # node_images reports a failure


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


@pytest.fixture(scope="session")
def kubelet(cluster, kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessKubelet]:
    """The session's process kubelet (see the module docstring)."""
    delete_stale_nodes(kube)  # nodes of dead sessions on a shared (RFT_KUBECONFIG) cluster
    k = ProcessKubelet(kube, f"rft-e2e-{os.getpid()}", tmp_path_factory.mktemp("kubelet"), default_image_map(),
                       grace_cap_s=5.0)
    k.start(timeout=120)
    try:
        yield k
    finally:
        k.stop(delete_node=True)


@pytest.fixture(autouse=True)
def _kubelet_logs_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    rep = getattr(request.node, "rep_call", None)
    k = request.node.funcargs.get("kubelet") if hasattr(request.node, "funcargs") else None
    if rep is None or not rep.failed or not isinstance(k, ProcessKubelet):
        return
    ns = request.node.funcargs.get("namespace")
    print(f"\n===== process kubelet container logs ({ns or 'all namespaces'}) =====\n{k.dump_logs(ns)}")
