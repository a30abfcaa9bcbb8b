"""Pod networking of the process kubelet (TEST INFRASTRUCTURE): loopback pod IPs and hosts files.

- :class:`IpAllocator`: each pod gets its own loopback address ``127.0.X.Y`` (the whole 127/8 is
  routed to ``lo`` on Linux, so nothing needs configuring). An address is held with an ``flock`` on
  ``<lock_dir>/<ip>.lock`` while its pod lives, so several kubelets on one machine (parallel test
  sessions) never hand out the same address; a crashed holder's lock is released by the kernel.
- :func:`resolve_services` + :func:`render_hosts` + :class:`HostsFiles`: each pod's ``/etc/hosts``
  maps every Service name (``svc`` in the pod's own namespace, ``svc.ns``, ``svc.ns.svc``,
  ``svc.ns.svc.cluster.local``) to the IP of ONE pod serving it (selector match and Ready, or any
  running pod when ``publishNotReadyAddresses``); the choice stays put while that pod stays eligible.
  Pods with ``hostname`` + ``subdomain`` (a headless Service) also get ``host.subdomain.ns.svc...``.
  Files are rewritten in place (same inode), so bind mounts in running pods see every change.

Limitations (by design): no cluster IPs and no port translation, so a client must use the
Service's name with the TARGET port (builders here give both the same number); no load balancing
across replicas; only pods run by this kubelet are endpoints.
"""

from __future__ import annotations

import fcntl
import os
import random
import tempfile
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

CLUSTER_DOMAIN = "cluster.local"


class IpAllocator:
    """Hands out ``127.0.X.Y`` (X 1..254, Y 2..254) guarded by per-address lock files."""

    def __init__(self, lock_dir: Path | None = None) -> None:
        self.lock_dir = Path(lock_dir or Path(tempfile.gettempdir()) / "rft-kubelet-pod-ips")
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()
        self._cursor = random.randrange(254 * 253)

    @staticmethod
    def _ip(n: int) -> str:
        return f"127.0.{1 + n // 253}.{2 + n % 253}"

    def allocate(self, owner: str) -> str:
        """A free address, locked for ``owner`` (written into the lock file for debugging)."""
        with self._lock:
            total = 254 * 253
            for _ in range(total):
                self._cursor = (self._cursor + 1) % total
                ip = self._ip(self._cursor)
                if ip in self._held:
                    continue
                fd = os.open(self.lock_dir / f"{ip}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    os.close(fd)
                    continue
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()} {owner}\n".encode())
                self._held[ip] = fd
                return ip
            raise RuntimeError(f"no free pod IP left in 127.0.0.0/16 (lock dir {self.lock_dir})")

    def release(self, ip: str) -> None:
        """Give ``ip`` back (a no-op for an address this allocator does not hold)."""
        with self._lock:
            fd = self._held.pop(ip, None)
        if fd is not None:
            os.close(fd)  # closing drops the flock

    def release_all(self) -> None:
        with self._lock:
            ips = list(self._held)
        for ip in ips:
            self.release(ip)


@dataclass(frozen=True)
class PodEndpoint:
    """What name resolution needs to know about one pod run by this kubelet."""

    namespace: str
    name: str
    ip: str | None
    labels: Mapping[str, str] = field(default_factory=dict)
    ready: bool = False
    running: bool = False
    terminating: bool = False
    hostname: str = ""
    subdomain: str = ""


def _selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def resolve_services(services: Iterable[dict], pods: Iterable[PodEndpoint],
                     previous: Mapping[tuple[str, str], str] | None = None) -> dict[tuple[str, str], str]:
    """``{(namespace, service): ip}`` for every Service with at least one eligible pod.

    Eligible: selector matches, IP assigned, not terminating, and Ready (or merely running when the
    Service sets ``publishNotReadyAddresses``). A previous choice is kept while it stays eligible,
    otherwise the eligible pod with the smallest name is chosen.
    """
    previous = previous or {}
    pods = list(pods)
    out: dict[tuple[str, str], str] = {}
    for svc in services:
        meta, spec = svc.get("metadata", {}), svc.get("spec", {})
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        selector = spec.get("selector") or {}
        not_ready_ok = bool(spec.get("publishNotReadyAddresses"))
        eligible = sorted(
            (p for p in pods if p.namespace == ns and p.ip and not p.terminating and _selects(selector, p.labels)
             and (p.ready or (not_ready_ok and p.running))),
            key=lambda p: p.name)
        if not eligible:
            continue
        prev = previous.get((ns, name))
        out[(ns, name)] = prev if prev in {p.ip for p in eligible} else eligible[0].ip  # type: ignore[assignment]
    return out


def service_names(namespace: str, service: str, pod_namespace: str) -> list[str]:
    """The names a pod in ``pod_namespace`` may use for ``service`` in ``namespace``."""
    names = [f"{service}.{namespace}.svc.{CLUSTER_DOMAIN}", f"{service}.{namespace}.svc", f"{service}.{namespace}"]
    if namespace == pod_namespace:
        names.append(service)
    return names


def render_hosts(pod: PodEndpoint, services: Mapping[tuple[str, str], str],
                 subdomain_hosts: Iterable[PodEndpoint] = ()) -> str:
    """The hosts file of ``pod``: localhost, its own name, then one line per resolvable Service and
    per pod of a headless-Service subdomain."""
    lines = ["# Kubernetes-managed hosts file (rft e2e process kubelet: TEST INFRASTRUCTURE).",
             "127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    host = pod.hostname or pod.name
    if pod.ip:
        if pod.subdomain:
            lines.append(f"{pod.ip}\t{host}.{pod.subdomain}.{pod.namespace}.svc.{CLUSTER_DOMAIN}\t{host}")
        else:
            lines.append(f"{pod.ip}\t{host}")
    for (ns, svc), ip in sorted(services.items()):
        lines.append(f"{ip}\t" + " ".join(service_names(ns, svc, pod.namespace)))
    for other in sorted(subdomain_hosts, key=lambda p: (p.namespace, p.subdomain, p.hostname)):
        if other.ip and other is not pod:
            names = [f"{other.hostname}.{n}" for n in service_names(other.namespace, other.subdomain, pod.namespace)]
            lines.append(f"{other.ip}\t" + " ".join(names))
    return "\n".join(lines) + "\n"


def subdomain_members(services: Iterable[dict], pods: Iterable[PodEndpoint]) -> list[PodEndpoint]:
    """Pods with ``hostname`` and ``subdomain`` naming a headless Service of their namespace that
    selects them (and that are eligible as for :func:`resolve_services`)."""
    headless = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in services
                if (s.get("spec") or {}).get("clusterIP") == "None"}
    out = []
    for p in pods:
        svc = headless.get((p.namespace, p.subdomain)) if p.hostname and p.subdomain else None
        if svc is None or not p.ip or p.terminating:
            continue
        spec = svc.get("spec") or {}
        selector = spec.get("selector") or {}
        if selector and not _selects(selector, p.labels):
            continue
        if p.ready or (spec.get("publishNotReadyAddresses") and p.running):
            out.append(p)
    return out


def write_in_place(path: Path, content: str) -> bool:
    """Replace the file's content keeping its inode; True when it changed."""
    data = content.encode()
    try:
        with open(path, "r+b") as f:
            if f.read() == data:
                return False
            f.seek(0)
            f.write(data)
            f.truncate()
            f.flush()
        return True
    except FileNotFoundError:
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, 0o644)
        return True


class HostsFiles:
    """The hosts files of every pod of one kubelet, kept in line with Services and pod readiness."""

    def __init__(self) -> None:
        self._pods: dict[str, tuple[PodEndpoint, Path | None]] = {}
        self._previous: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def set(self, uid: str, endpoint: PodEndpoint, path: Path | None) -> bool:
        """Record (or update) a pod; True when something name resolution depends on changed."""
        with self._lock:
            old = self._pods.get(uid)
            self._pods[uid] = (endpoint, path)
            return old is None or old[0] != endpoint or old[1] != path

    def remove(self, uid: str) -> None:
        with self._lock:
            self._pods.pop(uid, None)

    def endpoints(self) -> list[PodEndpoint]:
        with self._lock:
            return [ep for ep, _ in self._pods.values()]

    def refresh(self, services: list[dict]) -> int:
        """Rewrite every hosts file whose content changed; returns how many were rewritten."""
        with self._lock:
            pods = list(self._pods.values())
            eps = [ep for ep, _ in pods]
            resolved = resolve_services(services, eps, self._previous)
            self._previous = resolved
            members = subdomain_members(services, eps)
            changed = 0
            for ep, path in pods:
                if path is not None and path.parent.exists():
                    changed += write_in_place(path, render_hosts(ep, resolved, members))
        return changed
