"""Pod status as a kubelet reports it, from the process kubelet's container records (pure functions).

:class:`ContainerRecord` is what the pod worker knows about one container; :func:`pod_status` turns
the records into ``status`` (phase, conditions, ``initContainerStatuses``, ``containerStatuses``, pod
and host IPs, start time), keeping the ``lastTransitionTime`` of conditions that did not change and
every condition the kubelet does not own (``PodScheduled``, ``DisruptionTarget``, readiness gates).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
KUBELET_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ContainerRecord:
    """The kubelet's view of one container (all instances of it, across restarts)."""

    name: str
    image: str
    image_id: str = ""
    init: bool = False
    sidecar: bool = False  # an init container with restartPolicy Always
    state: str = "waiting"  # waiting | running | terminated
    reason: str = "ContainerCreating"
    message: str = ""
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    container_id: str = ""
    last_terminated: Obj | None = None
    restart_count: int = 0
    ready: bool = False
    started: bool = False
    done: bool = False  # terminated and will not be started again
    ever_ran: bool = False

    def terminated(self) -> Obj:
        t: Obj = {"exitCode": self.exit_code if self.exit_code is not None else 0,
                  "reason": self.reason, "startedAt": self.started_at, "finishedAt": self.finished_at}
        if self.message:
            t["message"] = self.message
        if self.container_id:
            t["containerID"] = self.container_id
        return t

    def status(self) -> Obj:
        if self.state == "running":
            state: Obj = {"running": {"startedAt": self.started_at}}
        elif self.state == "terminated":
            state = {"terminated": self.terminated()}
        else:
            state = {"waiting": {"reason": self.reason, **({"message": self.message} if self.message else {})}}
        out: Obj = {"name": self.name, "image": self.image, "imageID": self.image_id, "ready": self.ready,
                    "restartCount": self.restart_count, "started": self.state == "running" and self.started,
                    "state": state, "lastState": {"terminated": self.last_terminated} if self.last_terminated else {}}
        if self.container_id:
            out["containerID"] = self.container_id
        return out


@dataclass
class PodView:
    """Everything :func:`pod_status` needs besides the container records."""

    restart_policy: str = "Always"
    pod_ip: str | None = None
    host_ip: str = "127.0.0.1"
    start_time: str | None = None
    sandbox_ready: bool = False
    readiness_gates: list[str] = field(default_factory=list)
    deleting: bool = False
    failed_reason: str = ""  # e.g. DeadlineExceeded: the pod is Failed whatever its containers did
    failed_message: str = ""


def phase(init: list[ContainerRecord], main: list[ContainerRecord], view: PodView) -> str:
    """Pending, Running, Succeeded or Failed, by the kubelet's rules."""
    if view.failed_reason:
        return "Failed"
    regular_init = [c for c in init if not c.sidecar]
    if any(c.done and c.exit_code not in (0, None) for c in regular_init):
        return "Failed"  # an init container failed for good (restartPolicy Never)
    if not all(c.done for c in regular_init):
        return "Pending"
    if main and all(c.done for c in main):
        return "Succeeded" if all(c.exit_code == 0 for c in main) else "Failed"
    if not any(c.ever_ran for c in main):
        return "Pending"
    return "Running"


def _condition(ctype: str, ok: bool, reason: str = "", message: str = "") -> Obj:
    c: Obj = {"type": ctype, "status": "True" if ok else "False"}
    if not ok and reason:
        c["reason"] = reason
    if not ok and message:
        c["message"] = message
    return c


def pod_status(old: Obj, init: list[ContainerRecord], main: list[ContainerRecord], view: PodView) -> Obj:
    """The pod's new ``status`` given its current one (``old``)."""
    ph = phase(init, main, view)
    terminal = ph in ("Succeeded", "Failed")
    initialized = all(c.done and c.exit_code == 0 for c in init if not c.sidecar) and \
        all(c.started for c in init if c.sidecar)
    unready = [c.name for c in main if not c.ready]
    old_conds = {c.get("type"): c for c in old.get("conditions") or []}
    gates_ok = all(old_conds.get(g, {}).get("status") == "True" for g in view.readiness_gates)
    if terminal:
        why = "PodCompleted" if ph == "Succeeded" else "PodFailed"
        ready_c = [_condition("ContainersReady", False, why), _condition("Ready", False, why)]
    else:
        msg = f"containers with unready status: [{' '.join(unready)}]" if unready else ""
        ready_c = [_condition("ContainersReady", not unready, "ContainersNotReady", msg),
                   _condition("Ready", not unready and gates_ok and not view.deleting,
                              "ContainersNotReady" if unready else "ReadinessGatesNotReady", msg)]
    not_init = [c.name for c in init if not c.done and not c.sidecar]
    mine = [
        _condition("PodReadyToStartContainers", view.sandbox_ready and not (terminal and view.deleting)),
        _condition("Initialized", initialized, "ContainersNotInitialized",
                   f"containers with incomplete status: [{' '.join(not_init)}]" if not_init else ""),
        *ready_c,
    ]
    stamp = now_iso()
    conditions = [c for c in old.get("conditions") or [] if c.get("type") not in KUBELET_CONDITIONS]
    for c in mine:
        prev = old_conds.get(c["type"])
        c["lastProbeTime"] = None
        if prev and prev.get("status") == c["status"] and prev.get("lastTransitionTime"):
            c["lastTransitionTime"] = prev["lastTransitionTime"]
        else:
            c["lastTransitionTime"] = stamp
        conditions.append(c)
    status: Obj = {**old, "phase": ph, "conditions": conditions,
                   "hostIP": view.host_ip, "hostIPs": [{"ip": view.host_ip}],
                   "containerStatuses": [c.status() for c in main], "qosClass": old.get("qosClass", "BestEffort")}
    if init:
        status["initContainerStatuses"] = [c.status() for c in init]
    if view.pod_ip:
        status["podIP"], status["podIPs"] = view.pod_ip, [{"ip": view.pod_ip}]
    if view.start_time:
        status["startTime"] = old.get("startTime") or view.start_time
    if view.failed_reason:
        status["reason"], status["message"] = view.failed_reason, view.failed_message
    return status


def comparable(status: Obj) -> Obj:
    """``status`` without timestamps that change on every write (to decide whether to write)."""
    out = dict(status)
    out["conditions"] = sorted(({k: v for k, v in c.items() if k not in ("lastTransitionTime", "lastProbeTime")}
                                for c in status.get("conditions") or []), key=lambda c: c.get("type", ""))
    return out
