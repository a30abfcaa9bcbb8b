"""Leader election on a ``coordination.k8s.io/v1`` Lease: several operator replicas, one active.

The protocol is client-go's: the holder renews ``spec.renewTime`` every ``renew_seconds``; a
candidate takes the Lease over when it has seen no change of it (no new ``resourceVersion``) for
``spec.leaseDurationSeconds`` by its *own* clock (no trust in other machines' clocks), or when the
Lease names no holder (a leader that stopped cleanly releases it). Every write is a PUT with the
``resourceVersion`` read, so two candidates cannot both win: the loser gets 409.

A leader that could not renew for ``renew_deadline_seconds`` (less than the lease duration) stops
leading before anyone can take over. With the defaults (15 s lease, renew every 5 s, retry every
2 s) a killed leader is replaced within about 17 s.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .kube import Kube, KubeError
from .timeutil import now as utcnow

log = logging.getLogger(__name__)
Obj = dict[str, Any]
LEASE_NAME = "rft-operator"


def default_identity() -> str:
    """``<pod or host name>_<random>``: unique per process."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def _micro_time() -> str:
    return utcnow().strftime("%Y-%m-%dT%H:%M:%S.000000Z")


@dataclass
class LeaderElector:
    api: Kube
    namespace: str
    name: str = LEASE_NAME
    identity: str = field(default_factory=default_identity)
    lease_seconds: int = 15
    renew_seconds: float = 5.0
    renew_deadline_seconds: float = 10.0
    retry_seconds: float = 2.0
    clock: Callable[[], float] = time.monotonic
    _seen_rv: Optional[str] = None
    _seen_at: float = 0.0
    holder: str = ""
    """The holder last seen."""
    _held: Optional[Obj] = None

    def _spec(self, old: Optional[Obj]) -> Obj:
        spec = dict((old or {}).get("spec") or {})
        now = _micro_time()
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if old else 0)
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=self.lease_seconds, renewTime=now)
        return spec

    def try_acquire_or_renew(self) -> bool:
        """One attempt (blocking): True when this process holds the Lease afterwards. A holder renews
        with one PUT on the Lease it last wrote (a GET only after a conflict)."""
        if self._held is not None and self.holder == self.identity:
            renewed = dict(self._held, spec=self._spec(self._held))
            try:
                out = self.api.replace(renewed)
                self._held, self._seen_rv, self._seen_at = out, out["metadata"].get("resourceVersion"), self.clock()
                return True
            except KubeError as e:
                if not e.conflict:
                    raise
                self._held = None  # changed by someone else: read it
        lease = self.api.get("Lease", self.namespace, self.name)
        if lease is None:
            try:
                self._held = self.api.create({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                              "metadata": {"name": self.name, "namespace": self.namespace},
                                              "spec": self._spec(None)})
                self.holder = self.identity
                return True
            except KubeError as e:
                if e.conflict:
                    return False
                raise
        meta, spec = lease["metadata"], lease.get("spec") or {}
        self._held = None
        if meta.get("resourceVersion") != self._seen_rv:
            self._seen_rv, self._seen_at = meta.get("resourceVersion"), self.clock()
        holder = self.holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or self.lease_seconds)
        if holder and holder != self.identity and self.clock() - self._seen_at < duration:
            return False  # held, and renewed recently as far as we have seen
        lease["spec"] = self._spec(lease)
        try:
            out = self.api.replace(lease)
        except KubeError as e:
            if e.conflict:
                return False
            raise
        self._seen_rv, self._seen_at = out["metadata"].get("resourceVersion"), self.clock()
        self.holder, self._held = self.identity, out
        return True

    def release(self) -> None:
        """Give the Lease up (if still held) so a follower takes over at once."""
        lease = self.api.get("Lease", self.namespace, self.name)
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        lease["spec"] = {**lease["spec"], "holderIdentity": None, "leaseDurationSeconds": 1, "renewTime": _micro_time()}
        try:
            self.api.replace(lease)
        except KubeError as e:
            log.warning("could not release the lease: %s", e)

    async def _attempt(self) -> bool:
        try:
            return await asyncio.to_thread(self.try_acquire_or_renew)
        except KubeError as e:
            log.warning("leader election: %s", e)
            return False

    async def acquire(self, stopped: Callable[[], bool]) -> bool:
        """Wait until this process leads (True) or ``stopped()`` (False)."""
        logged = False
        while not stopped():
            if await self._attempt():
                log.info("leader election: %s leads (lease %s/%s)", self.identity, self.namespace, self.name)
                return True
            if not logged:
                log.info("leader election: %s waits for lease %s/%s", self.identity, self.namespace, self.name)
                logged = True
            await asyncio.sleep(self.retry_seconds)
        return False

    async def keep(self) -> None:
        """Renew until a renewal has failed for ``renew_deadline_seconds``; then return (leadership lost)."""
        last_ok = self.clock()
        while True:
            await asyncio.sleep(self.renew_seconds if self.clock() - last_ok < self.renew_seconds else self.retry_seconds)
            if await self._attempt():
                last_ok = self.clock()
            elif self.holder not in ("", self.identity) or self.clock() - last_ok >= self.renew_deadline_seconds:
                log.error("leader election: %s lost lease %s/%s", self.identity, self.namespace, self.name)
                return
