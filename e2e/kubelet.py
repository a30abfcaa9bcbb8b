"""A kubelet stand-in that runs pods' containers as local processes — TEST INFRASTRUCTURE ONLY.

No container engine exists on our machines. :class:`ProcessKubelet` registers a Node on a real
control plane (``e2e.cluster``), keeps it Ready, and runs every container of every pod bound to it
as a local process of a mapped "image" (a venv's ``bin`` directory first on PATH), giving what a
kubelet gives: downward-API env and ``$(VAR)`` expansion, ConfigMap/Secret/emptyDir/downwardAPI/
projected/PVC volumes at their mount paths in a private mount namespace, the service-account token
at the standard path, a loopback pod IP and a hosts file resolving Service names, probes, restart
policy with back-off, truthful status and exit codes, graceful deletion. See docs/e2e-harness.md.

Usage::

    kubelet = ProcessKubelet(api_client, "rft-node", workdir, default_image_map()).start()
    ...
    kubelet.stop()                                 # every process it started is gone afterwards

CLI (with ``make cluster-up``)::

    python -m e2e.kubelet --kubeconfig .cluster/kubeconfig --dir .cluster/kubelet [--node rft-node]
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from . import proctree
from .cluster import generate_pki
from .informer import Informer
from .kubeapi import ApiError, KubeApi
from .kubeletserver import KubeletServer
from .nodeagent import NodeAgent
from .podlaunch import ImageEntry
from .podnet import HostsFiles, IpAllocator
from .podstatus import now_iso
from .podworker import PodWorker, Settings, WorkerEnv
from .provisioner import HostPathProvisioner

Obj = dict[str, Any]
log = logging.getLogger("e2e.kubelet")
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CAPACITY = {"cpu": "64", "memory": "256Gi", "pods": "110", "ephemeral-storage": "500Gi"}

__all__ = ["ProcessKubelet", "ImageEntry", "KubeletError", "default_image_map", "delete_stale_nodes", "image_entry",
           "resolve_image"]


class KubeletError(RuntimeError):
    """The process kubelet could not start, or processes it started survived :meth:`ProcessKubelet.stop`."""


# ------------------------------------------------------------------------------------------ images


def image_entry(bin_dir: str | os.PathLike[str], env: Mapping[str, str] | None = None,
                paths: tuple[str, ...] = ()) -> ImageEntry:
    """An image backed by a ``bin`` directory (a venv's: its root, and ``paths``, stay visible under
    volume mounts)."""
    b = Path(bin_dir).resolve()
    return ImageEntry(str(b), tuple((env or {}).items()), (str(b.parent), *paths))


def _project_paths(root: Path) -> tuple[str, ...]:
    """What the project's images need besides the venv: the checkout (the venv installs it editable,
    so its source must stay visible even when a volume, e.g. an emptyDir at /tmp, covers it) and the
    cached dependency site-packages the venv points at."""
    paths = [str(root.resolve())]
    deps = root / ".venv" / ".deps"
    if deps.is_file():
        paths.append(deps.read_text().strip())
    return tuple(paths)


def default_image_map(repo_root: Path | None = None) -> dict[str, ImageEntry]:
    """The project's images → this checkout's ``.venv/bin``; ``vllm/vllm-openai`` → the vLLM venv's
    ``bin`` when one is configured (:func:`vllm_venv`)."""
    root = Path(repo_root or REPO_ROOT)
    venv, keep = root / ".venv", _project_paths(root)
    out = {"ghcr.io/rft-dev/rft-runtime": image_entry(venv / "bin", paths=keep),
           "ghcr.io/rft-dev/rft-operator": image_entry(venv / "bin", paths=keep)}
    vllm = vllm_venv()
    if vllm is not None:
        out["vllm/vllm-openai"] = image_entry(vllm / "bin", paths=_pth_dirs(vllm))
    return out


def vllm_venv() -> Path | None:
    """The venv standing in for the vLLM image: ``$RFT_VLLM_VENV``, else the venv of
    ``$RFT_VLLM_PYTHON`` (what ``make test`` sets, from ``hack/vllm-venv.sh``); None when neither is set."""
    if os.environ.get("RFT_VLLM_VENV"):
        return Path(os.environ["RFT_VLLM_VENV"])
    python = os.environ.get("RFT_VLLM_PYTHON")
    return Path(python).parent.parent if python else None


def _pth_dirs(venv: Path) -> tuple[str, ...]:
    """Directories a venv's ``.pth`` files add to its path, as plain lines or ``site.addsitedir('...')``
    (the vLLM venv takes torch from the project's dependency site that way): they must stay visible
    in its pods too."""
    out: list[str] = []
    for pth in sorted(venv.glob("lib/python*/site-packages/*.pth")):
        for line in pth.read_text().splitlines():
            line = line.strip()
            found = [line] if line.startswith("/") else re.findall(r"addsitedir\(\s*['\"](/[^'\"]+)['\"]", line)
            out += [d for d in found if Path(d).is_dir() and d not in out]
    return tuple(out)


def _repository(image: str) -> str:
    """``image`` without tag or digest, ``docker.io/`` and ``library/`` stripped."""
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        ref = ref[: len(ref) - len(last)] + last.split(":", 1)[0]
    for prefix in ("docker.io/library/", "docker.io/", "index.docker.io/"):
        if ref.startswith(prefix):
            ref = ref[len(prefix):]
            break
    return ref


def resolve_image(image_map: Mapping[str, ImageEntry], image: str) -> ImageEntry | None:
    """The entry for ``image``: an exact key, else the key equal to its repository, else the longest
    key that is a path prefix of its repository (``ghcr.io/rft-dev`` matches ``ghcr.io/rft-dev/x:1``)."""
    if image in image_map:
        return image_map[image]
    repo = _repository(image)
    best = None
    for key, entry in image_map.items():
        k = _repository(key)
        if repo == k or repo.startswith(k.rstrip("/") + "/"):
            if best is None or len(k) > len(best[0]):
                best = (k, entry)
    return best[1] if best else None


def _normalise(image_map: Mapping[str, Any]) -> dict[str, ImageEntry]:
    return {k: v if isinstance(v, ImageEntry) else image_entry(v) for k, v in image_map.items()}


# ------------------------------------------------------------------------------------------ kubelet


class ProcessKubelet:
    """Runs the pods bound to Node ``node_name`` as local processes (see the module docstring).

    ``api_client``: a ``kubernetes.client.ApiClient`` with admin rights (its configuration is reused
    on a private connection pool). ``workdir``: pod directories, volumes, logs
    (``<workdir>/logs/<ns>_<pod>_<container>.log``) and provisioned PVs (``<workdir>/pv``).
    ``image_map``: image or repository prefix → ``bin`` directory (or :class:`ImageEntry`).
    ``capacity``: what the Node advertises (nothing is enforced). ``grace_cap_s`` caps termination
    grace periods; ``backoff_base_s``/``backoff_max_s`` the restart back-off (a kubelet: 10 s/300 s).
    ``provision_volumes``: also run the hostPath PV provisioner. ``enforce_read_only_root``: honour
    ``readOnlyRootFilesystem`` by remounting ``/`` read-only inside the container's mount namespace.
    """

    def __init__(self, api_client: Any, node_name: str, workdir: str | os.PathLike[str],
                 image_map: Mapping[str, Any] | None = None, *, capacity: Mapping[str, str] | None = None,
                 labels: Mapping[str, str] | None = None, grace_cap_s: float = 10.0, backoff_base_s: float = 1.0,
                 backoff_max_s: float = 20.0, provision_volumes: bool = True, enforce_read_only_root: bool = True,
                 ip_lock_dir: Path | None = None) -> None:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", node_name or ""):
            raise ValueError(f"node_name {node_name!r} is not a valid Kubernetes node name")
        self.node_name = node_name
        self.workdir = Path(workdir).resolve()
        self.image_map = _normalise(default_image_map() if image_map is None else image_map)
        self.capacity = {**DEFAULT_CAPACITY, **(capacity or {})}
        self.settings = Settings(grace_cap_s=grace_cap_s, backoff_base_s=backoff_base_s, backoff_max_s=backoff_max_s,
                                 enforce_read_only_root=enforce_read_only_root)
        self.api = KubeApi(api_client)
        url = urlparse(self.api.server)
        self.api_host, self.api_port = url.hostname or "127.0.0.1", url.port or 443
        self.host_ip = "127.0.0.1"
        self.logs_dir = self.workdir / "logs"
        self._labels = dict(labels or {})
        self._provision = provision_volumes
        self._ips = IpAllocator(ip_lock_dir)
        self._hosts = HostsFiles()
        self._hosts_dirty = threading.Event()
        self._cgroups: proctree.CgroupRoot | None = None
        self._workers: dict[str, PodWorker] = {}
        self._finished: set[str] = set()
        self._launched: list[proctree.ContainerProcess] = []
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._events_sent: dict[tuple, float] = {}
        self._node: NodeAgent | None = None
        self._pods: Informer | None = None
        self._services: Informer | None = None
        self._provisioner: HostPathProvisioner | None = None
        self._server: KubeletServer | None = None
        self._hosts_thread = threading.Thread(target=self._hosts_loop, name="hosts-files", daemon=True)
        self._started = False

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> ProcessKubelet:
        """Register the Node, start the provisioner, watches and heartbeats; returns once the Node
        is Ready and the caches are synced (raises :class:`KubeletError` at ``timeout``)."""
        if self._started:
            return self
        for d in ("logs", "pods", "pv"):
            (self.workdir / d).mkdir(parents=True, exist_ok=True)
        reaped = proctree.reap_dead_kubelets()
        if reaped:
            log.warning("killed %d processes left by a process kubelet that died: %s", len(reaped), reaped)
        self._cgroups = proctree.CgroupRoot(f"rft-kubelet-{os.getpid()}-{self.node_name}")
        env = self._worker_env()
        self._env = env
        try:
            generate_pki(self.workdir / "pki")  # the serving certificate of the logs endpoint
            pki = self.workdir / "pki"
            self._server = KubeletServer(pki / "serving.crt", pki / "serving.key", self.log_path,
                                         self._pod_active).start()
            self._node = NodeAgent(self.api, self.node_name, self.capacity, self._labels, self.host_ip,
                                   kubelet_port=self._server.port)
            self._node.register()
            self._node.start()
            if self._provision:
                self._provisioner = HostPathProvisioner(self.api, self.workdir / "pv", self.node_name).start(timeout)
            self._services = Informer(self.api, "Service", self._on_service).start()
            self._pods = Informer(self.api, "Pod", self._on_pod, fieldSelector=f"spec.nodeName={self.node_name}")
            self._hosts_thread.start()
            self._pods.start()
            for inf in (self._services, self._pods):
                if not inf.wait_synced(timeout):
                    raise KubeletError(f"timed out after {timeout}s listing {inf.kind}s from {self.api.server}")
        except (ApiError, OSError) as e:
            self.stop()
            raise KubeletError(f"process kubelet {self.node_name} could not start: {e}") from e
        self._started = True
        return self

    def stop(self, delete_node: bool = False, timeout: float = 60.0) -> None:
        """Kill every container process this kubelet started and check none is left.

        Pods stay in the API (as with a stopped kubelet) unless ``delete_node``: then the Node and
        its Lease are deleted too (the pod garbage collector later removes pods bound to it).
        Raises :class:`KubeletError` listing pids that survived SIGKILL.
        """
        self._stopping.set()
        for inf in (self._pods, self._services):
            if inf is not None:
                inf.stop(timeout=2)
        with self._lock:
            workers = list(self._workers.values())
        for w in workers:
            w.shutdown()
        deadline = time.monotonic() + timeout
        for w in workers:
            w.join(max(0.1, deadline - time.monotonic()))
        survivors: list[int] = []
        with self._lock:
            launched = list(self._launched)
        for proc in launched:
            if proc.members():
                try:
                    proc.terminate(0.0)
                except RuntimeError:
                    survivors.extend(proc.members())
        if self._provisioner is not None:
            self._provisioner.stop()
        if self._server is not None:
            self._server.stop()
        if self._node is not None:
            self._node.stop(delete_node=delete_node)
        self._hosts_dirty.set()
        if self._hosts_thread.is_alive():
            self._hosts_thread.join(5)
        if self._cgroups is not None:
            self._cgroups.remove()
        self._ips.release_all()
        self.api.close()
        self._started = False
        if survivors:
            raise KubeletError(f"processes {sorted(set(survivors))} survived SIGKILL")

    def __enter__(self) -> ProcessKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- inspection -------------------------------------------------------------------------

    def log_path(self, namespace: str, pod: str, container: str) -> Path:
        """``<workdir>/logs/<namespace>_<pod>_<container>.log`` (all instances, appended)."""
        return self.logs_dir / f"{namespace}_{pod}_{container}.log"

    def logs(self, namespace: str, pod: str, container: str | None = None) -> str:
        """The output of a container (every restart appended); ``container`` may be left out when
        the pod has logs of one container only. Empty when nothing was written yet."""
        if container is None:
            paths = sorted(self.logs_dir.glob(f"{namespace}_{pod}_*.log"))
            if len(paths) > 1:
                names = [p.name[len(f"{namespace}_{pod}_"):-4] for p in paths]
                raise ValueError(f"pod {namespace}/{pod} has several containers {names}: name one")
            return paths[0].read_text(errors="replace") if paths else ""
        p = self.log_path(namespace, pod, container)
        return p.read_text(errors="replace") if p.exists() else ""

    def dump_logs(self, namespace: str | None = None, tail_bytes: int = 4000) -> str:
        """The tail of every container log (of ``namespace``), headed by its file name: for test
        failure reports."""
        out = []
        pattern = f"{namespace}_*.log" if namespace else "*.log"
        for p in sorted(self.logs_dir.glob(pattern)):
            data = p.read_bytes()
            out.append(f"----- {p.name} ({len(data)} bytes)\n{data[-tail_bytes:].decode(errors='replace')}")
        return "\n".join(out) or f"(no container logs{' in ' + namespace if namespace else ''})"

    def pids(self) -> list[int]:
        """Live processes of every container this kubelet started (for leak checks)."""
        with self._lock:
            launched = list(self._launched)
        return sorted({p for proc in launched for p in proc.members()})

    def running_pods(self) -> list[tuple[str, str]]:
        """``(namespace, name)`` of the pods that have a worker."""
        with self._lock:
            return sorted((w.namespace, w.name) for w in self._workers.values())

    # ---- wiring -----------------------------------------------------------------------------

    def _worker_env(self) -> WorkerEnv:
        assert self._cgroups is not None
        return WorkerEnv(
            api=self.api, node_name=self.node_name, workdir=self.workdir, host_ip=self.host_ip,
            api_host=self.api_host, api_port=self.api_port, allocatable=dict(self.capacity),
            resolve_image=lambda image: resolve_image(self.image_map, image), ips=self._ips, hosts=self._hosts,
            hosts_changed=self._hosts_changed, cgroups=self._cgroups, settings=self.settings, event=self._event,
            log_path=self.log_path, finished=self._worker_finished, launched=self._process_launched)

    def _process_launched(self, proc: proctree.ContainerProcess) -> None:
        with self._lock:
            self._launched = [p for p in self._launched if p.popen.poll() is None or p.members()]
            self._launched.append(proc)

    def _on_pod(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        with self._lock:
            if old is not None and (new is None or new["metadata"]["uid"] != old["metadata"]["uid"]):
                w = self._workers.get(old["metadata"]["uid"])
                if w is not None:
                    w.gone()
            if new is None or self._stopping.is_set():
                return
            uid = new["metadata"]["uid"]
            if uid in self._workers:
                self._workers[uid].update(new)
            elif uid not in self._finished:
                self._workers[uid] = PodWorker(self._env, new).start()

    def _pod_active(self, namespace: str, name: str) -> bool:
        with self._lock:
            return any(w.namespace == namespace and w.name == name and w.active() for w in self._workers.values())

    def _worker_finished(self, uid: str) -> None:
        with self._lock:
            self._workers.pop(uid, None)
            self._finished.add(uid)

    def _on_service(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        self._hosts_changed()

    def _hosts_changed(self, sync: bool = False) -> None:
        if sync:
            self._refresh_hosts()
        else:
            self._hosts_dirty.set()

    def _refresh_hosts(self) -> None:
        services = self._services.items() if self._services is not None else []
        try:
            self._hosts.refresh(services)
        except OSError as e:
            log.warning("hosts files: %s", e)

    def _hosts_loop(self) -> None:
        while not self._stopping.is_set():
            self._hosts_dirty.wait(2.0)
            self._hosts_dirty.clear()
            if not self._stopping.is_set():
                self._refresh_hosts()

    def _event(self, pod: Obj, etype: str, reason: str, message: str) -> None:
        """Post a core/v1 Event about ``pod`` (the same reason+message at most every 30 s)."""
        meta = pod["metadata"]
        key = (meta.get("uid"), reason, message)
        now = time.monotonic()
        with self._lock:
            if now - self._events_sent.get(key, -1e9) < 30:
                return
            self._events_sent[key] = now
        stamp = now_iso()
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                   "namespace": meta["namespace"], "uid": meta.get("uid")},
                "reason": reason, "message": message[:1024], "type": etype,
                "source": {"component": "kubelet", "host": self.node_name},
                "reportingComponent": "kubelet", "reportingInstance": self.node_name,
                "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1}
        try:
            self.api.create("Event", meta["namespace"], body)
        except (ApiError, OSError) as e:
            log.debug("event %s for %s/%s not posted: %s", reason, meta["namespace"], meta["name"], e)


def delete_stale_nodes(api_client: Any, max_age_s: float = 120.0) -> list[str]:
    """Delete Nodes of process kubelets (label ``rft.dev/process-kubelet``) whose Lease was not
    renewed for ``max_age_s`` (a session that died without :meth:`ProcessKubelet.stop`), so the
    scheduler stops placing pods on them; returns their names. For clusters shared across sessions."""
    import datetime as dt

    api = KubeApi(api_client)
    gone = []
    try:
        nodes = api.list("Node", labelSelector="rft.dev/process-kubelet=true")["items"]
        now = dt.datetime.now(dt.timezone.utc)
        for node in nodes:
            name = node["metadata"]["name"]
            lease = api.get("Lease", "kube-node-lease", name)
            renew = ((lease or {}).get("spec") or {}).get("renewTime")
            age = (now - dt.datetime.fromisoformat(renew.replace("Z", "+00:00"))).total_seconds() if renew else 1e9
            if age > max_age_s:
                api.delete("Node", None, name)
                api.delete("Lease", "kube-node-lease", name)
                gone.append(name)
    finally:
        api.close()
    return gone


# ------------------------------------------------------------------------------------------ CLI


def main(argv: list[str] | None = None) -> int:
    """Run a process kubelet in the foreground until SIGINT/SIGTERM."""
    from kubernetes import config

    ap = argparse.ArgumentParser(prog="python -m e2e.kubelet", description=__doc__.split("\n")[0])
    ap.add_argument("--kubeconfig", required=True, type=Path, help="admin kubeconfig (e.g. .cluster/kubeconfig)")
    ap.add_argument("--dir", required=True, type=Path, help="work directory (pods, volumes, logs, PVs)")
    ap.add_argument("--node", default="rft-node", help="node name (default rft-node)")
    ap.add_argument("--grace-cap", default=10.0, type=float, help="cap on termination grace periods (s)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    kubelet = ProcessKubelet(config.new_client_from_config(config_file=str(a.kubeconfig)), a.node, a.dir,
                             grace_cap_s=a.grace_cap)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    kubelet.start()
    log.info("process kubelet %s running; logs in %s", a.node, kubelet.logs_dir)
    done.wait()
    kubelet.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
