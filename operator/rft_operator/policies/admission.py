"""Admission policy (Kueue): whether a queued job may have role pods, read from its Workload (pure).

A job labelled ``kueue.x-k8s.io/queue-name`` is held, exactly like a suspended job (role workloads
removed; the checkpoint claim, config and Services kept), until Kueue admits its Workload: condition
``Admitted`` True with ``status.admission`` set. While held, the job's phase is ``Suspended`` and its
``Suspended`` condition says why, in Kueue's words (the ``QuotaReserved`` condition's message, for
example "couldn't assign flavors to pod set trainer: insufficient quota ..."). Admission resumes it:
the new trainer starts from the latest checkpoint, and the deadline clock restarts.

An evicted Workload (condition ``Evicted`` True: preempted, deactivated, pods-ready timeout, ...)
holds the job again. As Kueue's integrations do, the operator then stops the role pods and, once
they are gone, releases the quota reservation (``status.admission`` cleared, ``QuotaReserved`` and
``Admitted`` False), so that Kueue can requeue the Workload. A terminal job marks its Workload
``Finished``, which returns its quota.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

Obj = dict[str, Any]
QUEUED = "QueuedForAdmission"
EVICTED = "Evicted"
NOT_QUEUEABLE = "NotQueueable"


@dataclass(frozen=True)
class Hold:
    """Why a queued job may not have role pods now."""

    reason: str
    message: str


def condition(workload: Optional[Obj], ctype: str) -> Optional[Obj]:
    """The Workload's condition of type ``ctype``, if any."""
    for c in ((workload or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c
    return None


def _is_true(workload: Optional[Obj], ctype: str) -> bool:
    c = condition(workload, ctype)
    return c is not None and c.get("status") == "True"


def admitted(workload: Optional[Obj]) -> bool:
    """Kueue admitted the Workload (and has not evicted it)."""
    return (workload is not None and bool((workload.get("status") or {}).get("admission"))
            and _is_true(workload, "Admitted") and not _is_true(workload, "Evicted"))


def hold(queue: str, workload: Optional[Obj]) -> Optional[Hold]:
    """The hold on a job queued in ``queue`` whose Workload is ``workload`` (None: it may run)."""
    if workload is None:
        return Hold(QUEUED, f"waiting for Kueue to admit the job in queue {queue!r}: its Workload is being created")
    if _is_true(workload, "Evicted"):
        c = condition(workload, "Evicted") or {}
        return Hold(EVICTED, f"Kueue evicted the job's Workload ({c.get('reason', 'Evicted')}): "
                             f"{c.get('message', '')}".rstrip(": "))
    if admitted(workload):
        return None
    qr = condition(workload, "QuotaReserved")
    why = (qr or {}).get("message") or "not admitted yet"
    return Hold(QUEUED, f"waiting for Kueue to admit the job in queue {queue!r}: {why}")


def must_release(workload: Optional[Obj]) -> bool:
    """An evicted Workload still holds its quota reservation: release it once the pods are gone."""
    return workload is not None and _is_true(workload, "Evicted") and bool((workload.get("status") or {}).get("admission"))


def release_patch(workload: Obj, now: str) -> Obj:
    """The status merge patch that releases an evicted Workload's quota reservation."""
    ev = condition(workload, "Evicted") or {}
    message = ev.get("message") or "evicted"
    gen = workload["metadata"].get("generation")
    changed = {
        "QuotaReserved": ("False", "Pending", message),
        "Admitted": ("False", "NoReservation", "the workload has no quota reservation"),
    }
    return {"status": {"admission": None, "conditions": _merge(workload, changed, now, gen)}}


def finished_patch(workload: Obj, succeeded: bool, message: str, now: str) -> Optional[Obj]:
    """The status merge patch that marks the Workload ``Finished`` (None when it already is)."""
    if _is_true(workload, "Finished"):
        return None
    changed = {"Finished": ("True", "Succeeded" if succeeded else "Failed", message or "the job finished")}
    return {"status": {"conditions": _merge(workload, changed, now, workload["metadata"].get("generation"))}}


def _merge(workload: Obj, changed: dict[str, tuple[str, str, str]], now: str, generation: Optional[int]) -> list[Obj]:
    """The Workload's conditions with ``changed`` (type → status, reason, message) set; a merge patch
    replaces the list, so every other condition is kept as it is."""
    out, seen = [], set()
    for c in ((workload.get("status") or {}).get("conditions") or []):
        t = c.get("type")
        if t in changed:
            status, reason, message = changed[t]
            ltt = c.get("lastTransitionTime") if c.get("status") == status else now
            c = {"type": t, "status": status, "reason": reason, "message": message[:32768],
                 "lastTransitionTime": ltt or now, **({"observedGeneration": generation} if generation else {})}
            seen.add(t)
        out.append(c)
    for t, (status, reason, message) in changed.items():
        if t not in seen:
            out.append({"type": t, "status": status, "reason": reason, "message": message[:32768],
                        "lastTransitionTime": now, **({"observedGeneration": generation} if generation else {})})
    return out


def assignments(workload: Optional[Obj]) -> dict[str, list[str]]:
    """Pod set name → the flavor names the admission assigned it (in a stable order)."""
    out: dict[str, list[str]] = {}
    for a in (((workload or {}).get("status") or {}).get("admission") or {}).get("podSetAssignments") or []:
        flavors = a.get("flavors") or {}
        out[a.get("name", "")] = sorted(set(str(v) for v in flavors.values()))
    return out
