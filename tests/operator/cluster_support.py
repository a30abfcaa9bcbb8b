"""Helpers for the operator's integration tests against the real local control plane.

- ``crd``: installs ``crds/rftjob.yaml`` (server-side apply) and waits until it is Established.
- :class:`OperatorThread`: the operator in-process (``rft_operator.app.run`` in a thread with its own
  event loop), stopped through kopf's stop flag.
- Pod status patches standing in for the kubelet, which this tier does not have: the Deployment,
  ReplicaSet and Job controllers then compute the workloads' status from the pods, as they would on a
  real cluster.
"""
from __future__ import annotations

import asyncio
import copy
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

from rft_operator import names
from rft_operator.app import OperatorConfig, run
from rft_operator.controller import Controller
from rft_operator.kube import Kube
from rft_operator.metrics import Metrics
from tests.support.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "rftjob.yaml"
EXAMPLE = ROOT / "examples" / "01-tiny-arith.yaml"


@pytest.fixture(scope="session")
def crd(cluster) -> Any:
    """The RFTJob CRD installed from ``crds/rftjob.yaml`` and Established."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    k = Kube.from_kubeconfig(str(cluster.kubeconfig))
    try:
        def established() -> bool:
            obj = k.get("CustomResourceDefinition", None, "rftjobs.rft.dev") or {}
            return any(c.get("type") == "Established" and c.get("status") == "True"
                       for c in (obj.get("status") or {}).get("conditions") or [])
        wait_for("CRD rftjobs.rft.dev to be Established", established, timeout=60)
    finally:
        k.close()
    return cluster


@pytest.fixture
def api(cluster) -> Any:
    k = Kube.from_kubeconfig(str(cluster.kubeconfig))
    try:
        yield k
    finally:
        k.close()


def job_manifest(name: str = "tiny-arith", path: Path = EXAMPLE, **spec_patch: Any) -> dict:
    doc = yaml.safe_load(path.read_text())
    doc = copy.deepcopy(doc)
    doc["metadata"] = {"name": name}
    doc["spec"].update(spec_patch)
    return doc


def create_job(api: Kube, namespace: str, doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    doc["metadata"]["namespace"] = namespace
    return api.create(doc)


def get_job(api: Kube, namespace: str, name: str) -> dict:
    obj = api.get("RFTJob", namespace, name)
    assert obj is not None, f"RFTJob {namespace}/{name} is gone"
    return obj


def phase_of(api: Kube, namespace: str, name: str) -> str:
    return (get_job(api, namespace, name).get("status") or {}).get("phase", "")


def wait_phase(api: Kube, namespace: str, name: str, phase: str, timeout: float = 60.0) -> dict:
    def check():
        obj = get_job(api, namespace, name)
        return obj if (obj.get("status") or {}).get("phase") == phase else None
    return wait_for(f"{name} to reach phase {phase} (now {phase_of(api, namespace, name)!r})", check, timeout)


def children(api: Kube, namespace: str, job: str, kinds: tuple[str, ...] = (
        "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "PersistentVolumeClaim", "Service", "NetworkPolicy",
        "Deployment", "Job")) -> dict[tuple[str, str], dict]:
    out = {}
    for kind in kinds:
        for o in api.list(kind, namespace, names.job_selector(job)):
            key = (kind, o["metadata"]["name"])
            assert key not in out
            out[key] = o
    return out


# -------------------------------------------------------------------------------- kubelet stand-in
def pods_of(api: Kube, namespace: str, job: str, role: str, live: bool = True) -> list[dict]:
    """The role's pods (``live``: only those not terminating and not finished)."""
    sel = f"{names.LABEL_INSTANCE}={job},{names.LABEL_ROLE}={role}"
    pods = api.list("Pod", namespace, sel)
    if live:
        pods = [p for p in pods if not p["metadata"].get("deletionTimestamp")
                and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    return pods


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def set_pod_phase(api: Kube, pod: dict, phase: str, exit_code: int = 0) -> None:
    """Write the status a kubelet would write: Running+Ready, Succeeded or Failed."""
    now = _now()
    ready = "True" if phase == "Running" else "False"
    conditions = [{"type": t, "status": s, "lastTransitionTime": now} for t, s in (
        ("PodScheduled", "True"), ("Initialized", "True"), ("ContainersReady", ready), ("Ready", ready))]
    containers = []
    for c in pod["spec"]["containers"]:
        if phase == "Running":
            state = {"running": {"startedAt": now}}
        else:
            state = {"terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                                    "startedAt": now, "finishedAt": now}}
        containers.append({"name": c["name"], "image": c["image"], "imageID": "", "ready": phase == "Running",
                           "restartCount": 0, "started": phase == "Running", "state": state})
    status = {"phase": phase, "conditions": conditions, "containerStatuses": containers, "startTime": now}
    api.patch("Pod", pod["metadata"]["namespace"], pod["metadata"]["name"], {"status": status}, subresource="status")


def make_role_ready(api: Kube, namespace: str, job: str, role: str, want: int = 1, timeout: float = 60.0) -> None:
    """Mark the role's pods Running and Ready once the controllers have created them."""
    pods = wait_for(f"{want} {role} pod(s) of {job}", lambda: (p := pods_of(api, namespace, job, role))
                    and len(p) >= want and p, timeout)
    for p in pods:
        set_pod_phase(api, p, "Running")


def finish_trainer(api: Kube, namespace: str, job: str, succeeded: bool, attempt: int) -> None:
    """End the trainer pod(s) of ``attempt``: exit 0 (Succeeded) or 1 (Failed)."""
    def current():
        return [p for p in pods_of(api, namespace, job, "trainer")
                if p["metadata"].get("annotations", {}).get(names.ANNOTATION_ATTEMPT) == str(attempt)]
    pods = wait_for(f"trainer pod of attempt {attempt}", current)
    for p in pods:
        set_pod_phase(api, p, "Succeeded" if succeeded else "Failed", exit_code=0 if succeeded else 1)


# -------------------------------------------------------------------------------- the operator
class OperatorThread:
    """The operator in-process, in a background thread; ``stop()`` sets kopf's stop flag."""

    def __init__(self, kubeconfig: Path, namespace: str, resync_seconds: float = 1.0,
                 leader_election: bool = False, kueue: bool = False):
        self.config = OperatorConfig(kubeconfig=str(kubeconfig), namespaces=(namespace,), metrics_port=0,
                                     metrics_addr="127.0.0.1", resync_seconds=resync_seconds,
                                     leader_election_namespace=namespace if leader_election else None,
                                     kueue=kueue)
        self.stop_flag = threading.Event()
        self.ready_flag = threading.Event()
        self.error: Optional[BaseException] = None
        self.controller: Optional[Controller] = None
        self.metrics: Optional[Metrics] = None
        self.metrics_port: Optional[int] = None
        self._thread = threading.Thread(target=self._main, name="rft-operator", daemon=True)

    def _started(self, controller: Controller, metrics: Metrics, port: Optional[int]) -> None:
        self.controller, self.metrics, self.metrics_port = controller, metrics, port

    def _main(self) -> None:
        try:
            asyncio.run(run(self.config, stop_flag=self.stop_flag, ready_flag=self.ready_flag,
                            on_started=self._started))
        except BaseException as e:  # surfaced by start()/stop()
            self.error = e

    def start(self, timeout: float = 60.0) -> "OperatorThread":
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.ready_flag.wait(0.2):
            if self.error is not None or not self._thread.is_alive():
                raise RuntimeError(f"the operator exited while starting: {self.error!r}")
            if time.monotonic() > deadline:
                raise RuntimeError("the operator did not become ready")
        return self

    def stop(self, timeout: float = 60.0) -> None:
        self.stop_flag.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the operator did not stop"
        if self.error is not None and not isinstance(self.error, (SystemExit, KeyboardInterrupt)):
            raise self.error

    def __enter__(self) -> "OperatorThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture
def operator(cluster, crd, namespace) -> Any:
    """The operator, watching only this test's namespace."""
    op = OperatorThread(cluster.kubeconfig, namespace).start()
    try:
        yield op
    finally:
        op.stop()


def run_operator_process(kubeconfig: Path, namespace: str, env: dict[str, str], timeout: float = 120.0
                         ) -> subprocess.CompletedProcess:
    """The operator as a separate process (to kill it for real): ``tests.operator.crashing_operator``,
    which is ``rft_operator.main`` that exits mid-reconcile when ``$CRASH_AFTER_APPLIES`` is set."""
    import os
    import sys

    return subprocess.run(
        [sys.executable, "-m", "tests.operator.crashing_operator", "--kubeconfig", str(kubeconfig), "-n", namespace,
         "--metrics-port", "-1", "--resync-seconds", "1"],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
