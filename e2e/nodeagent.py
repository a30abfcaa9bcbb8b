"""The process kubelet's Node (TEST INFRASTRUCTURE): registration and heartbeats.

:class:`NodeAgent` creates (or adopts) the Node with a Ready condition, capacity/allocatable, the
loopback addresses and no taints (the TaintNodesByCondition admission adds ``not-ready`` on create
and no node-lifecycle controller runs here to lift it, so the agent removes it), then renews the
node's Lease in ``kube-node-lease`` every ``lease_renew_s`` and rewrites the Ready condition's
heartbeat every ``status_every_s`` (and whenever someone turned it off).
"""

from __future__ import annotations

import datetime as dt
import logging
import platform
import threading
from collections.abc import Mapping
from typing import Any

from .kubeapi import ApiError, KubeApi
from .podstatus import now_iso

Obj = dict[str, Any]
log = logging.getLogger("e2e.kubelet")
LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_S = 40


def _micro_now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _arch() -> str:
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def node_status(capacity: Mapping[str, str], host_ip: str, kubelet_version: str, kubelet_port: int = 0,
                old: Obj | None = None) -> Obj:
    """The Node status this kubelet reports (Ready, no pressure, capacity = allocatable)."""
    stamp = now_iso()
    old_conds = {c["type"]: c for c in (old or {}).get("conditions") or []}

    def cond(ctype: str, status: str, reason: str, message: str) -> Obj:
        prev = old_conds.get(ctype)
        since = prev["lastTransitionTime"] if prev and prev.get("status") == status else stamp
        return {"type": ctype, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": stamp, "lastTransitionTime": since}

    return {
        "capacity": dict(capacity), "allocatable": dict(capacity),
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            cond("Ready", "True", "KubeletReady", "process kubelet (e2e test infrastructure) is posting ready status"),
        ],
        # InternalIP only: the API server would try a Hostname address first, and it resolves nowhere.
        "addresses": [{"type": "InternalIP", "address": host_ip}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "nodeInfo": {
            "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": platform.release(),
            "osImage": "rft e2e process kubelet", "containerRuntimeVersion": "process://podexec",
            "kubeletVersion": kubelet_version, "kubeProxyVersion": "", "operatingSystem": "linux",
            "architecture": _arch(),
        },
    }


class NodeAgent:
    """Registers ``node_name`` and keeps it Ready until :meth:`stop`."""

    def __init__(self, api: KubeApi, node_name: str, capacity: Mapping[str, str], labels: Mapping[str, str],
                 host_ip: str = "127.0.0.1", kubelet_port: int = 0, lease_renew_s: float = 10.0,
                 status_every_s: float = 30.0) -> None:
        self.api, self.node_name, self.capacity = api, node_name, dict(capacity)
        self.labels = {"kubernetes.io/hostname": node_name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": _arch(), "rft.dev/process-kubelet": "true", **labels}
        self.host_ip, self.kubelet_port = host_ip, kubelet_port
        self.lease_renew_s, self.status_every_s = lease_renew_s, status_every_s
        self.kubelet_version = "v1.34.0-rft-process"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"node-{node_name}", daemon=True)

    def register(self) -> Obj:
        """Create or adopt the Node, make it Ready and untainted; returns it."""
        try:
            ver = self.api.request("GET", "/version")
            self.kubelet_version = ver.get("gitVersion", self.kubelet_version)
        except (ApiError, OSError):
            pass
        node = self.api.get("Node", None, self.node_name)
        if node is None:
            body = {"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": self.node_name, "labels": self.labels},
                    "spec": {},
                    "status": node_status(self.capacity, self.host_ip, self.kubelet_version, self.kubelet_port)}
            try:
                node = self.api.create("Node", None, body)
            except ApiError as e:
                if e.status != 409:
                    raise
                node = self.api.get("Node", None, self.node_name)
        assert node is not None
        node = self.api.patch("Node", None, self.node_name,
                              {"metadata": {"labels": self.labels}, "spec": {"taints": None, "unschedulable": None}})
        self._post_status()
        self._renew_lease()
        return node

    def start(self) -> NodeAgent:
        self._thread.start()
        return self

    def stop(self, delete_node: bool = False) -> None:
        self._stop.set()
        self._thread.join(15)
        if delete_node:
            try:
                self.api.delete("Node", None, self.node_name)
                self.api.delete("Lease", LEASE_NAMESPACE, self.node_name)
            except (ApiError, OSError) as e:
                log.warning("node %s: delete failed: %s", self.node_name, e)

    def _post_status(self) -> None:
        cur = self.api.get("Node", None, self.node_name)
        if cur is None:
            raise ApiError(404, "Not Found", f"node {self.node_name} disappeared")
        status = node_status(self.capacity, self.host_ip, self.kubelet_version, self.kubelet_port, cur.get("status"))
        self.api.patch("Node", None, self.node_name, {"status": status}, subresource="status")
        if (cur.get("spec") or {}).get("taints"):
            self.api.patch("Node", None, self.node_name, {"spec": {"taints": None}})

    def _renew_lease(self) -> None:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.node_name, "namespace": LEASE_NAMESPACE},
                "spec": {"holderIdentity": self.node_name, "leaseDurationSeconds": LEASE_DURATION_S,
                         "renewTime": _micro_now()}}
        cur = self.api.get("Lease", LEASE_NAMESPACE, self.node_name)
        if cur is None:
            try:
                self.api.create("Lease", LEASE_NAMESPACE, body)
            except ApiError as e:
                if e.status != 409:
                    raise
            return
        self.api.patch("Lease", LEASE_NAMESPACE, self.node_name, {"spec": body["spec"]})

    def _run(self) -> None:
        since_status = 0.0
        while not self._stop.wait(self.lease_renew_s):
            try:
                self._renew_lease()
                since_status += self.lease_renew_s
                if since_status >= self.status_every_s:
                    since_status = 0.0
                    self._post_status()
            except (ApiError, OSError) as e:
                log.warning("node %s heartbeat failed: %s", self.node_name, e)
            except Exception:  # noqa: BLE001 - keep beating
                log.exception("node %s heartbeat failed", self.node_name)
