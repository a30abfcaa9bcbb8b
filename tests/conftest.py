"""Session-wide fixtures for tests that need the real local Kubernetes control plane.

Mark such tests ``@pytest.mark.cluster`` and use the fixtures:

- ``cluster``: the :class:`e2e.cluster.LocalCluster` (session scope). With ``RFT_KUBECONFIG`` set to
  a running cluster's admin kubeconfig (``make cluster-up`` writes ``.cluster/kubeconfig``) it is
  reused and left running; otherwise one is started in a temporary directory and stopped at the end.
- ``kube``: a ``kubernetes.client.ApiClient`` authenticated as the cluster admin (session scope).
- ``namespace``: a fresh namespace for one test, deleted afterwards.

When the control-plane binaries are missing they are built (or a background ``hack/prepare.sh`` is
waited for) once, before the first test that needs them, outside its timeout (see
:mod:`tests.support.prereqs`, which also orders the tests: those needing nothing first, e2e last). A
build failure FAILS every test that needs the cluster, with the build's error, without building again;
``RFT_SKIP_CLUSTER=1`` skips them instead.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.cluster import LocalCluster, ensure_binaries
from tests.support import prereqs

# Servers the tests start (coordinator, reward, inference) listen where the runtime contract says:
# $RFT_BIND_HOST; for tests that is loopback.
os.environ.setdefault("RFT_BIND_HOST", "127.0.0.1")
# eval_protocol imports LiteLLM, which would fetch a price list from the internet on import; the
# runtime sets this before its own import (rft_runtime.rewards.eval_protocol), the tests from the start.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _skip_cluster() -> bool:
    return os.environ.get("RFT_SKIP_CLUSTER") == "1"


_CONTROL_PLANE = prereqs.register(
    "control plane (hack/build-control-plane.sh)", rank=2,
    wanted=lambda item: (item.get_closest_marker("cluster") is not None and not _skip_cluster()
                         and not os.environ.get("RFT_KUBECONFIG")),
    build=ensure_binaries)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Before the first test that needs a prerequisite, build it or wait for its build: outside the
    test's timeout (this wrapper runs outside pytest-timeout's)."""
    prereqs.before(item)
    yield


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The running local control plane (see the module docstring)."""
    if _skip_cluster():
        pytest.skip("RFT_SKIP_CLUSTER=1: tests needing the local control plane are skipped")
    kubeconfig = os.environ.get("RFT_KUBECONFIG")
    if kubeconfig:
        c = LocalCluster.attach(Path(kubeconfig))
        if not c.ready():
            pytest.fail(f"RFT_KUBECONFIG={kubeconfig}: the API server at {c.server} is not ready",
                        pytrace=False)
        yield c
        return
    bin_path = _CONTROL_PLANE.get()
    c = LocalCluster(tmp_path_factory.mktemp("cluster"), bin=bin_path, die_with_parent=True)
    c.start(timeout=300)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def kube(cluster: LocalCluster) -> Iterator["kubernetes.client.ApiClient"]:  # noqa: F821
    """A ``kubernetes.client.ApiClient`` for the admin kubeconfig."""
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def namespace(kube: "kubernetes.client.ApiClient") -> Iterator[str]:  # noqa: F821
    """A new namespace ``t-<8 hex>`` with its ``default`` ServiceAccount; deleted (without waiting for finalisation) afterwards."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(kube)
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        # Pods are refused until the controller-manager has created the namespace's `default` SA.
        deadline = time.monotonic() + 60
        while True:
            try:
                core.read_namespaced_service_account("default", name)
                break
            except ApiException as e:
                if e.status != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)
        yield name
    finally:
        try:
            core.delete_namespace(name)
        except ApiException as e:
            if e.status != 404:
                raise


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    """Run e2e tests last: their real node (``e2e/node.py``) registers a Node for the rest of the
    session, and the integration tier assumes a control plane with no kubelet (its tests write pod status
    themselves, and some expect pods to stay unscheduled). Before that, the tests needing nothing built
    first, then by when what they need is ready (:func:`tests.support.prereqs.order`)."""
    prereqs.order(items)
    items.sort(key=lambda item: item.get_closest_marker("e2e") is not None)
