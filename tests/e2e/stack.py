"""The e2e stack: the operator installed from its Helm chart, and helpers to drive RFTJobs through it.

Everything runs against the real local control plane (``cluster`` fixture) with pods run by the real
local node (``real_node`` fixture, ``e2e/node.py``); nothing here imitates the Kubernetes API.

- :func:`build_images` / :func:`load_images`: the project's images (``hack/build-images.sh``, cached by
  input hash) imported into the node's containerd.
- :func:`install_platform` renders ``charts/rft-operator`` with ``helm template --include-crds`` and
  applies it with ``kubectl apply --server-side``: the CRD, the chart's ServiceAccount, ClusterRole
  and binding, and its Deployment. The operator then runs FROM THAT DEPLOYMENT as a pod, from the
  operator image, with the chart's RBAC, not as admin.
- :class:`JobDriver` (one per test namespace): apply manifests with ``kubectl``, read the RFTJob, its
  progress ConfigMap, its pods and its checkpoint volume (the provisioned PV's host directory), wait
  with deadlines, inject faults (delete a pod, SIGKILL a container's process), and produce the
  diagnostics a failing test prints: container logs, ``kubectl get rft -o yaml``, pods, events.
- :class:`LogKeeper` (``JobDriver.keep_logs``): every container log of a role's pods streamed through
  the API into files, so a deleted pod's log (which the kubelet deletes with it) stays readable.
- :class:`StatusRecorder`: samples ``status`` in a background thread so a test can check what the
  status did over time (the step never went backwards, the phases it went through).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from e2e.cluster import LocalCluster
from e2e.node import LocalNode
from rft_api.layout import JOB_TOKEN_SECRET_KEY
from rft_operator import names
from rft_operator.kube import Kube, KubeError
from tests.support.polling import wait_for as poll
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rft-operator"
EXAMPLES = ROOT / "examples"
PLATFORM_NAMESPACE = "rft-system"
RELEASE = "rft-operator"
OPERATOR_DEPLOYMENT = "rft-operator"  # the chart's fullname for release "rft-operator"
ROLES = ("inference", "reward", "rollout", "trainer")
T = TypeVar("T")
Obj = dict[str, Any]


def wait_for(what: str, fn: Callable[[], T | None], timeout: float, interval: float = 1.0,
             on_timeout: Callable[[], str] | None = None) -> T:
    """:func:`tests.support.polling.wait_for`, where an API hiccup under load is not the answer (keep polling)."""
    return poll(what, fn, timeout, interval, on_timeout=on_timeout, retry_on=(KubeError,))


# ------------------------------------------------------------------------------------------ images

IMAGES = "operator runtime vllm"
"""What ``hack/build-images.sh`` builds: the operator, the runtime and vLLM on the CPU (scenario 02)."""
_IMAGE_REPOS = {"operator": "/rft-operator:", "runtime": "/rft-runtime:", "vllm": "/vllm-openai:"}


_BUILD_FAILURES: dict[str, str] = {}
"""Image name -> why ``hack/build-images.sh`` failed for it in this pytest process: a build that failed
fails once, and every later test that needs the image fails at once with the same message."""


def build_images(names: str = IMAGES) -> dict[str, Path]:
    """``hack/build-images.sh`` for ``names`` (of :data:`IMAGES`); image reference -> oci-archive."""
    failed = [n for n in names.split() if n in _BUILD_FAILURES]
    if failed:
        pytest.fail(f"not built again in this run: {_BUILD_FAILURES[failed[0]]}", pytrace=False)
    p = subprocess.run(["bash", str(ROOT / "hack" / "build-images.sh")], capture_output=True, text=True,
                       env={**os.environ, "RFT_IMAGES": names}, timeout=3600)
    if p.returncode != 0:
        why = f"hack/build-images.sh ({names}) failed ({p.returncode}):\n{p.stderr[-4000:]}"
        _BUILD_FAILURES.update(dict.fromkeys(names.split(), why))
        pytest.fail(why, pytrace=False)
    listing = Path(p.stdout.strip().splitlines()[-1])
    out = {}
    for line in listing.read_text().splitlines():
        ref, archive = line.split()
        if any(_IMAGE_REPOS[n] in ref for n in names.split()):  # the listing may name other images
            out[ref] = Path(archive)
    return out


def load_images(node: LocalNode, images: dict[str, Path]) -> None:
    """Import each archive unless this node already imported that very archive (same input hash)."""
    for archive in images.values():
        node.import_image(archive)


# ------------------------------------------------------------------------------------------ platform


@dataclass
class Platform:
    """The operator as installed from the chart."""

    cluster: LocalCluster
    node: LocalNode
    api: Kube
    namespace: str
    release: str
    resync_seconds: int
    manifests: str
    """The rendered chart, as applied."""

    @property
    def deployment(self) -> str:
        return OPERATOR_DEPLOYMENT

    def operator_pods(self) -> list[Obj]:
        """The operator's live pods (not terminating)."""
        pods = self.api.list("Pod", self.namespace, "app.kubernetes.io/name=rft-operator")
        return [p for p in pods if not p["metadata"].get("deletionTimestamp")]

    def operator_pod(self) -> Obj:
        pods = self.operator_pods()
        assert len(pods) == 1, f"expected one operator pod, found {[p['metadata']['name'] for p in pods]}"
        return pods[0]

    def operator_logs(self) -> str:
        out = [f"----- {label}\n{text[-6000:]}" for label, text in self.node.log_texts(self.namespace, "", "operator")]
        return "\n".join(out) or "(no operator logs)"

    def wait_ready(self, timeout: float = 120.0) -> Obj:
        """Wait until the operator Deployment has one available, ready replica (its pod Ready)."""
        def ready() -> Obj | None:
            d = self.api.get("Deployment", self.namespace, self.deployment) or {}
            st = d.get("status") or {}
            if st.get("readyReplicas", 0) >= 1 and st.get("updatedReplicas", 0) >= 1 \
                    and st.get("observedGeneration", 0) >= d["metadata"]["generation"]:
                pods = [p for p in self.operator_pods() if _pod_ready(p)]
                return pods[0] if len(pods) == 1 else None
            return None
        return wait_for("the operator Deployment (from the chart) to be Ready", ready, timeout,
                        on_timeout=self.operator_logs)


def _pod_ready(pod: Obj) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def render_chart(cluster: LocalCluster, namespace: str, release: str, values: dict[str, Any]) -> str:
    """``helm template <release> charts/rft-operator --namespace <ns> --include-crds --set ...`` (a list or a
    dict value with ``--set-json``)."""
    cmd = [cluster.binary("helm"), "template", release, str(CHART), "--namespace", namespace, "--include-crds"]
    for k, v in values.items():
        cmd += ["--set-json", f"{k}={json.dumps(v)}"] if isinstance(v, (list, dict)) else ["--set", f"{k}={v}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=cluster.env())
    if p.returncode != 0:
        raise AssertionError(f"helm template failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def install_platform(cluster: LocalCluster, node: LocalNode, *, namespace: str = PLATFORM_NAMESPACE,
                     release: str = RELEASE, resync_seconds: int = 3, timeout: float = 180.0,
                     values: dict[str, Any] | None = None) -> Platform:
    """Install the chart (CRD included) into ``namespace`` and wait for the operator pod to be Ready.
    ``values``: more ``--set`` values (``images.runtime``, ...).

    The metrics and health ports are free ports of this machine (any would do: the pod has its own
    network namespace).
    """
    api = Kube.from_kubeconfig(str(cluster.kubeconfig))
    # one replica (the chart's default is 2 with leader election): the harness drives "the" operator pod
    chart_values = {"resyncSeconds": resync_seconds, "metrics.port": free_port(), "healthPort": free_port(),
                    "logLevel": "info", "replicas": 1, **(values or {})}
    rendered = render_chart(cluster, namespace, release, chart_values)
    cluster.kubectl("create", "namespace", namespace, check=False)
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=rendered, timeout=120)
    cluster.kubectl("wait", "--for=condition=Established", "crd/rftjobs.rft.dev", "--timeout=60s", timeout=90)
    platform = Platform(cluster, node, api, namespace, release, resync_seconds, rendered)
    platform.wait_ready(timeout)
    return platform


def uninstall_platform(platform: Platform, timeout: float = 120.0) -> None:
    """Delete what the chart installed except the CRD (jobs of other modules may still be there),
    and wait until the operator pod is gone."""
    docs = [d for d in yaml.safe_load_all(platform.manifests)
            if d and d.get("kind") != "CustomResourceDefinition"]
    platform.cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-",
                             input=yaml.safe_dump_all(docs), check=False, timeout=120)
    try:
        wait_for("the operator pod to be gone", lambda: not platform.api.list(
            "Pod", platform.namespace, "app.kubernetes.io/name=rft-operator"), timeout)
    finally:
        platform.api.close()


# ------------------------------------------------------------------------------------------ jobs


def load_docs(path: Path) -> list[Obj]:
    """The YAML documents of a manifest file."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def example_job(path: Path, name: str | None = None, **spec_overrides: Any) -> list[Obj]:
    """The documents of an example, its RFTJob renamed and its spec deep-merged with ``spec_overrides``
    (keys are the CRD's camelCase; a dict merges, anything else replaces)."""
    docs = copy.deepcopy(load_docs(path))
    for d in docs:
        if d.get("kind") == "RFTJob":
            if name:
                d["metadata"]["name"] = name
            deep_merge(d["spec"], spec_overrides)
    return docs


PACED_EVALUATOR = '''\
"""Exact-answer reward that takes a quarter of a second a sample, as a real slow evaluator does (a
compiler, a test suite): a step lasts at least that long however fast the machine is."""
import asyncio
import re


async def score(sample, item):
    await asyncio.sleep(0.25)
    numbers = re.findall(r"-?\\d+", sample.text)
    return 1.0 if numbers and int(numbers[-1]) == int(str(item.ground_truth).strip()) else 0.0
'''
"""For a test whose fault must land while the job still trains (an operator restarted twice, a pod
deleted and replaced, intruder pods that must find the servers up): a number of steps is no clock, a
faster machine finishes them sooner (300 steps of the scaled-down job once took 30 s, and the run
ended before the second of two operator restarts), but ``steps × 0.25 s`` is a floor on any machine.
The rollout pod keeps ``rollout.concurrency`` (32) samples in flight: a step of 4 prompts × 4 samples
waits at least 0.25 s, one of 32 prompts × 4 at least 1 s."""


def with_file_evaluator(docs: list[Obj], configmap: str, source: str, timeout_s: float = 2) -> list[Obj]:
    """``docs`` with the RFTJob's evaluator replaced by ``source``'s ``score``, shipped in a new
    ConfigMap ``configmap`` (applied first)."""
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": configmap}, "data": {"evaluator.py": source}}
    evaluator = {"file": {"configMapKeyRef": {"name": configmap, "key": "evaluator.py"}}, "timeoutSeconds": timeout_s}
    docs = copy.deepcopy(docs)
    for d in docs:
        if d.get("kind") == "RFTJob":
            d["spec"]["evaluator"] = evaluator
    return [cm, *docs]


def paced_docs(docs: list[Obj]) -> list[Obj]:
    """``docs`` scored by :data:`PACED_EVALUATOR` (its ConfigMap ``paced-evaluator`` applied first)."""
    return with_file_evaluator(docs, "paced-evaluator", PACED_EVALUATOR)


def deep_merge(base: dict, patch: dict) -> None:
    """Merge ``patch`` into ``base`` in place: dicts merge key by key, anything else replaces."""
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            deep_merge(base[k], v)
        else:
            base[k] = copy.deepcopy(v)


@dataclass
class JobDriver:
    """Drives RFTJobs in one namespace through ``kubectl`` and reads what they did."""

    platform: Platform
    namespace: str
    keep_dir: Path
    """Where :meth:`keep_logs` writes the container logs it keeps."""
    recorders: list[StatusRecorder] = field(default_factory=list)
    keepers: list[LogKeeper] = field(default_factory=list)

    @property
    def cluster(self) -> LocalCluster:
        return self.platform.cluster

    @property
    def api(self) -> Kube:
        return self.platform.api

    @property
    def node(self) -> LocalNode:
        return self.platform.node

    # ---- kubectl ---------------------------------------------------------------------------

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """kubectl in this namespace, as the cluster admin (a user of the product)."""
        return self.cluster.kubectl("-n", self.namespace, *args, input=input, check=check, timeout=timeout)

    def enforce_pod_security(self, level: str = "restricted") -> None:
        """Label this namespace so that the API server's Pod Security admission refuses any pod that does
        not meet ``level`` (a platform's tenant namespaces commonly enforce ``restricted``)."""
        self.cluster.kubectl("label", "--overwrite", "namespace", self.namespace,
                             f"pod-security.kubernetes.io/enforce={level}",
                             "pod-security.kubernetes.io/enforce-version=latest")

    def apply_file(self, path: Path) -> str:
        """``kubectl apply -f <path>`` (the example exactly as shipped)."""
        return self.kubectl("apply", "-f", str(path)).stdout

    def apply_docs(self, docs: Iterable[Obj]) -> str:
        return self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(list(docs))).stdout

    # ---- reading ---------------------------------------------------------------------------

    def job(self, name: str) -> Obj:
        obj = self.api.get("RFTJob", self.namespace, name)
        assert obj is not None, f"RFTJob {self.namespace}/{name} does not exist"
        return obj

    def status(self, name: str) -> Obj:
        return self.job(name).get("status") or {}

    def condition(self, name: str, ctype: str) -> Obj:
        for c in self.status(name).get("conditions") or []:
            if c.get("type") == ctype:
                return c
        return {}

    def job_token(self, name: str) -> str:
        """The job's data-plane token (Secret ``<job>-token``, read with the test's admin identity):
        the job's servers refuse a call without it."""
        import base64

        secret = self.api.get("Secret", self.namespace, names.token(name))
        assert secret is not None, f"Secret {names.token(name)} does not exist"
        return base64.b64decode(secret["data"][JOB_TOKEN_SECRET_KEY]).decode()

    def get_json(self, name: str, url: str, timeout: float = 10) -> Any:
        """GET ``url`` of one of the job's servers with its token, from the node (the job's
        NetworkPolicies admit no one else; raises OSError when it does not answer)."""
        return json.loads(self.node.request(url, {"Authorization": f"Bearer {self.job_token(name)}"}, timeout))

    def progress(self, name: str) -> Obj:
        """The trainer's progress record (``<job>-progress``), ``{}`` before its first write."""
        cm = self.api.get("ConfigMap", self.namespace, names.progress(name)) or {}
        raw = (cm.get("data") or {}).get(names.PROGRESS_KEY)
        return json.loads(raw) if raw else {}

    def pods(self, name: str, role: str, live: bool = True) -> list[Obj]:
        """The role's pods (``live``: not terminating, not finished)."""
        pods = self.api.list("Pod", self.namespace, f"{names.LABEL_INSTANCE}={name},{names.LABEL_ROLE}={role}")
        if live:
            pods = [p for p in pods if not p["metadata"].get("deletionTimestamp")
                    and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
        return pods

    def ready_pod(self, name: str, role: str) -> Obj | None:
        pods = [p for p in self.pods(name, role) if _pod_ready(p)]
        return pods[0] if len(pods) == 1 else None

    def children(self, name: str) -> dict[tuple[str, str], Obj]:
        """The job's children by (kind, name); a duplicate name fails the test."""
        out: dict[tuple[str, str], Obj] = {}
        for kind in ("ServiceAccount", "Role", "RoleBinding", "ConfigMap", "PersistentVolumeClaim", "Service",
                     "Deployment", "Job"):
            for o in self.api.list(kind, self.namespace, names.job_selector(name)):
                key = (kind, o["metadata"]["name"])
                assert key not in out, f"two {kind}s named {key[1]}"
                out[key] = o
        return out

    def checkpoint_dir(self, name: str) -> Path:
        """The host directory behind the job's checkpoint claim (the provisioned hostPath PV)."""
        pvc = self.api.get("PersistentVolumeClaim", self.namespace, names.checkpoints(name))
        assert pvc is not None, f"PVC {names.checkpoints(name)} does not exist"
        volume = (pvc.get("spec") or {}).get("volumeName")
        assert volume, f"PVC {names.checkpoints(name)} is not bound"
        pv = self.api.request("GET", f"/api/v1/persistentvolumes/{volume}") or {}
        return Path(pv["spec"]["hostPath"]["path"])

    def metrics_rows(self, name: str) -> list[Obj]:
        """The trainer's ``metrics.jsonl`` on the checkpoint volume (one row per completed step)."""
        path = self.checkpoint_dir(name) / "metrics" / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def checkpoint_steps(self, name: str) -> list[int]:
        """Steps of the complete checkpoint directories on the volume."""
        root = self.checkpoint_dir(name)
        out = []
        for d in root.glob("step-*"):
            if (d / "COMPLETE").exists():
                out.append(int(d.name.split("-", 1)[1]))
        return sorted(out)

    def logs(self, pod: Obj, container: str | None = None) -> str:
        c = container or pod["spec"]["containers"][0]["name"]
        return self.node.logs(self.namespace, pod["metadata"]["name"], c)

    def role_logs(self, name: str, role: str) -> str:
        """Every container log of the role's pods still on the node (restarts too), concatenated
        (a deleted pod's logs go with it: :meth:`keep_logs` keeps them)."""
        return "\n".join(f"----- {label}\n{text}" for label, text in
                         self.node.log_texts(self.namespace, f"{name}-{role}-"))

    # ---- waiting ---------------------------------------------------------------------------

    def wait_job(self, name: str, what: str, pred: Callable[[Obj], bool], timeout: float,
                 interval: float = 1.0) -> Obj:
        """Wait until ``pred(status)`` holds; a terminal phase that does not satisfy it fails at once."""
        def check() -> Obj | None:
            st = self.status(name)
            if pred(st):
                return st
            if st.get("phase") in ("Failed", "ValidationFailed") or (
                    st.get("phase") == "Succeeded" and not pred(st)):
                raise AssertionError(f"{name} reached terminal phase {st.get('phase')} while waiting for {what}: "
                                     f"{st.get('message')}\n{self.diagnostics(name)}")
            return None
        return wait_for(f"{name}: {what}", check, timeout, interval, on_timeout=lambda: self.diagnostics(name))

    def wait_phase(self, name: str, phase: str, timeout: float) -> Obj:
        if phase in ("Failed", "ValidationFailed"):
            return wait_for(f"{name} to reach phase {phase}", lambda: (
                st if (st := self.status(name)).get("phase") == phase else None), timeout,
                on_timeout=lambda: self.diagnostics(name))
        return self.wait_job(name, f"phase {phase}", lambda st: st.get("phase") == phase, timeout)

    def wait_step(self, name: str, step: int, timeout: float) -> Obj:
        return self.wait_job(name, f"status.step >= {step}", lambda st: st.get("step", 0) >= step, timeout)

    def wait_pods_gone(self, name: str, roles: Iterable[str], timeout: float) -> None:
        roles = tuple(roles)
        wait_for(f"{name}: no pods of {roles}", lambda: not any(
            self.api.list("Pod", self.namespace, f"{names.LABEL_INSTANCE}={name},{names.LABEL_ROLE}={r}")
            for r in roles), timeout, on_timeout=lambda: self.diagnostics(name))

    # ---- faults ----------------------------------------------------------------------------

    def delete_pod(self, pod: Obj, wait: bool = True, timeout: float = 60.0) -> None:
        """``kubectl delete pod`` (graceful: SIGTERM, SIGKILL after the grace period)."""
        self.kubectl("delete", "pod", pod["metadata"]["name"], f"--wait={'true' if wait else 'false'}",
                     f"--timeout={int(timeout)}s", timeout=timeout + 30)

    # ---- records ---------------------------------------------------------------------------

    def record(self, name: str, interval: float = 0.5) -> StatusRecorder:
        """Start sampling the job's status in the background (stopped at teardown)."""
        r = StatusRecorder(self.api, self.namespace, name, interval).start()
        self.recorders.append(r)
        return r

    def diagnostics(self, name: str | None = None) -> str:
        """What a failing test prints: RFTJobs as YAML, pods, recent events, every container log."""
        parts = []
        for args in (("get", "rft", "-o", "yaml"), ("get", "rft"),
                     ("get", "pods,deployments,jobs,pvc", "-o", "wide"),
                     ("get", "events", "--sort-by=.lastTimestamp")):
            p = self.kubectl(*args, check=False, timeout=60)
            out = p.stdout if p.returncode == 0 else p.stderr
            if args[1] == "events":
                out = "\n".join(out.splitlines()[-40:])
            parts.append(f"===== kubectl -n {self.namespace} {' '.join(args)}\n{out}")
        if name:
            prog = self.progress(name)
            parts.append(f"===== progress record\n{json.dumps(prog, indent=1)[:3000]}")
        parts.append(f"===== container logs ({self.namespace})\n{self.node.dump_logs(self.namespace, 6000)}")
        parts.append(f"===== operator logs\n{self.platform.operator_logs()}")
        return "\n".join(parts)

    def keep_logs(self, name: str, role: str, timestamps: bool = False) -> LogKeeper:
        """Start keeping every container log of the role's pods (every attempt, every restart) through
        the API, from the moment each container runs: a kubelet deletes a deleted pod's logs with it.
        Call it before the pods start (stopped at teardown). ``timestamps``: each line starts with the
        time the kubelet read it (RFC 3339, UTC; ``kubectl logs --timestamps``)."""
        k = LogKeeper(self.cluster, self.api, self.namespace,
                      f"{names.LABEL_INSTANCE}={name},{names.LABEL_ROLE}={role}",
                      self.keep_dir / f"{name}-{role}", timestamps=timestamps).start()
        self.keepers.append(k)
        return k

    def close(self) -> None:
        for r in self.recorders:
            r.stop()
        for k in self.keepers:
            k.stop()


def pod_processes(pod: Obj) -> list[int]:
    """Live processes of a pod's containers, found by the environment the kubelet gave them:
    ``HOSTNAME`` (the pod's ``spec.hostname`` or name) and, where the pod sets it from the downward
    API, ``POD_NAME``. Children inherit that environment, so they are included."""
    meta = pod["metadata"]
    hostname = ((pod.get("spec") or {}).get("hostname") or meta["name"])[:63]
    want_host, want_name = f"HOSTNAME={hostname}".encode(), f"POD_NAME={meta['name']}".encode()
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            env = set(Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if want_host in env and (want_name in env or not any(e.startswith(b"POD_NAME=") for e in env)):
            out.append(int(entry.name))
    return sorted(out)


def kill_pod_processes(pod: Obj) -> list[int]:
    """SIGKILL every process of the pod's containers (as a crash or the OOM killer would); the kubelet
    reports exit code 137 and applies the pod's restart policy. Returns the pids killed."""
    pids = pod_processes(pod)
    assert pids, f"no process of pod {pod['metadata']['namespace']}/{pod['metadata']['name']} found"
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


# ------------------------------------------------------------------------------------------ logs


@dataclass
class KeptLog:
    """One container instance's log, as :class:`LogKeeper` streamed it into ``path``."""

    pod: str
    created: str
    """The pod's ``creationTimestamp`` (orders the attempts)."""
    container: str
    restart: int
    path: Path
    follower: subprocess.Popen[bytes]

    def text(self) -> str:
        return self.path.read_text(errors="replace")


class LogKeeper:
    """Streams the log of every container of the pods matching ``selector`` into files, through the
    Kubernetes API (``kubectl logs --follow``, one per container instance, started as soon as the
    container runs or has run): the kept log outlives the pod, which a kubelet deletes with its logs."""

    def __init__(self, cluster: LocalCluster, api: Kube, namespace: str, selector: str, out: Path,
                 interval: float = 0.5, timestamps: bool = False) -> None:
        self.cluster, self.api, self.namespace, self.selector, self.interval = cluster, api, namespace, selector, interval
        self.timestamps = timestamps
        self.out = out
        self.out.mkdir(parents=True, exist_ok=True)
        self.kept: dict[tuple[str, str, int], KeptLog] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"logs-{selector}", daemon=True)

    def start(self) -> LogKeeper:
        self._thread.start()
        return self

    def _scan(self) -> None:
        for pod in self.api.list("Pod", self.namespace, self.selector):
            meta = pod["metadata"]
            for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                state = cs.get("state") or {}
                if not ("running" in state or "terminated" in state):
                    continue
                key = (meta["uid"], cs["name"], int(cs.get("restartCount") or 0))
                if key in self.kept:
                    continue
                path = self.out / f"{meta['name']}_{cs['name']}_{key[2]}.log"
                with open(path, "wb") as f:
                    follower = subprocess.Popen(
                        [self.cluster.binary("kubectl"), f"--kubeconfig={self.cluster.kubeconfig}", "-n",
                         self.namespace, "logs", "--follow", *(["--timestamps"] if self.timestamps else []),
                         meta["name"], "-c", cs["name"]],
                        stdout=f, stderr=subprocess.STDOUT, env=self.cluster.env())
                self.kept[key] = KeptLog(meta["name"], meta.get("creationTimestamp", ""), cs["name"], key[2],
                                         path, follower)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._scan()
            except KubeError:
                pass  # an API hiccup under load: the next scan catches up
            self._stop.wait(self.interval)

    def logs(self, container: str | None = None, settle_s: float = 30.0) -> list[str]:
        """The kept logs (of ``container``), oldest pod first and restarts in order; waits up to
        ``settle_s`` for the followers of containers that ended to finish writing."""
        self._scan()
        deadline = time.monotonic() + settle_s
        kept = sorted((k for k in self.kept.values() if container in (None, k.container)),
                      key=lambda k: (k.created, k.pod, k.restart))
        for k in kept:
            with contextlib.suppress(subprocess.TimeoutExpired):
                k.follower.wait(max(0.0, deadline - time.monotonic()))
        return [k.text() for k in kept]

    def pod_text(self, pod: str) -> str:
        """What has been kept of ``pod``'s logs so far (its containers and restarts in order), without
        waiting for anything."""
        return "".join(k.text() for k in sorted((k for k in self.kept.values() if k.pod == pod),
                                                 key=lambda k: (k.container, k.restart)))

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        for k in self.kept.values():
            if k.follower.poll() is None:
                k.follower.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                k.follower.wait(10)
            if k.follower.poll() is None:
                k.follower.kill()
                k.follower.wait()


# ------------------------------------------------------------------------------------------ recorder


@dataclass
class Sample:
    t: float
    phase: str
    step: int
    policy_version: int
    restarts: int
    reward_mean: float | None


class StatusRecorder:
    """Samples an RFTJob's status every ``interval`` seconds in a daemon thread."""

    def __init__(self, api: Kube, namespace: str, name: str, interval: float = 0.5) -> None:
        self.api, self.namespace, self.name, self.interval = api, namespace, name, interval
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"status-{name}", daemon=True)

    def start(self) -> StatusRecorder:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling, after one last sample (so the record ends with the status as it is now)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self._sample()

    def _sample(self) -> None:
        try:
            obj = self.api.get("RFTJob", self.namespace, self.name)
        except KubeError:
            return
        if obj is not None:
            st = obj.get("status") or {}
            self.samples.append(Sample(time.monotonic(), st.get("phase", ""), st.get("step", 0),
                                       st.get("policyVersion", 0), st.get("restarts", 0), st.get("rewardMean")))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def steps(self) -> list[int]:
        return [s.step for s in self.samples]

    def phases(self) -> list[str]:
        """The distinct phases in the order they were seen."""
        out: list[str] = []
        for s in self.samples:
            if not out or out[-1] != s.phase:
                out.append(s.phase)
        return out
