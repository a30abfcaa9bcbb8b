"""The async side of reconciling: one reconcile at a time per job, coalesced triggers, requeues, resync.

Every trigger (kopf's create/update/resume handlers, events of owned children, the periodic resync,
a requeue) calls :meth:`Controller.reconcile`, which reads the job fresh and runs the blocking
:func:`rft_operator.reconcile.reconcile` in a thread. While one reconcile of a job runs, further
triggers for it collapse into a single follow-up.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Optional

from .kube import Kube, KubeError
from .metrics import Metrics
from .reconcile import Outcome, reconcile

log = logging.getLogger(__name__)
Key = tuple[str, str]


class Controller:
    """Serialises reconciles per job and keeps the metrics."""

    def __init__(self, api: Kube, metrics: Metrics, *, namespaces: tuple[str, ...] = (),
                 resync_seconds: float = 10.0, before_apply: Optional[Callable[[dict[str, Any]], None]] = None):
        self.api = api
        self.metrics = metrics
        self.namespaces = namespaces
        self.resync_seconds = resync_seconds
        self.before_apply = before_apply
        self._locks: dict[Key, asyncio.Lock] = {}
        self._waiting: set[Key] = set()
        self._tasks: set[asyncio.Task] = set()

    async def reconcile(self, namespace: str, name: str) -> Optional[Outcome]:
        """Reconcile one job now (or join the one already queued). Transient API errors propagate."""
        key = (namespace, name)
        if key in self._waiting:
            return None  # a reconcile that has not started yet will see the latest state
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._waiting.add(key)
        async with lock:
            self._waiting.discard(key)
            return await self._run(key)

    async def _run(self, key: Key) -> Optional[Outcome]:
        namespace, name = key
        t0 = time.perf_counter()
        try:
            obj = await asyncio.to_thread(self.api.get, "RFTJob", namespace, name)
            if obj is None:
                self.metrics.reconciles.labels(result="gone").inc()
                self._locks.pop(key, None)
                return None
            outcome = await asyncio.to_thread(reconcile, self.api, obj, before_apply=self.before_apply)
        except KubeError as e:
            self.metrics.reconciles.labels(result="error").inc()
            self.metrics.errors.labels(kind="transient" if e.transient else "unexpected").inc()
            raise
        except Exception:
            self.metrics.reconciles.labels(result="error").inc()
            self.metrics.errors.labels(kind="unexpected").inc()
            raise
        finally:
            self.metrics.duration.observe(time.perf_counter() - t0)
        self.metrics.reconciles.labels(result="ok").inc()
        if outcome.errors:
            self.metrics.errors.labels(kind="apply").inc(len(outcome.errors))
        if outcome.requeue_after is not None:
            self._later(outcome.requeue_after, key)
        log.debug("reconciled %s/%s: phase=%s applied=%d deleted=%s status_written=%s", namespace, name,
                  outcome.phase, len(outcome.applied), outcome.deleted, outcome.status_written)
        return outcome

    def _later(self, delay: float, key: Key) -> None:
        async def requeue() -> None:
            await asyncio.sleep(delay)
            try:
                await self.reconcile(*key)
            except Exception as e:  # the resync retries it
                log.warning("requeued reconcile of %s/%s failed: %s", *key, e)

        task = asyncio.get_running_loop().create_task(requeue())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def resync_once(self) -> int:
        """Reconcile every job in the watched namespaces; returns how many were seen."""
        jobs: list[dict[str, Any]] = []
        for ns in (self.namespaces or (None,)):
            jobs += await asyncio.to_thread(self.api.list, "RFTJob", ns)
        self.metrics.set_phases((j.get("status") or {}).get("phase", "Pending") for j in jobs)
        for j in jobs:
            meta = j["metadata"]
            try:
                await self.reconcile(meta["namespace"], meta["name"])
            except Exception as e:
                log.warning("resync of %s/%s failed: %s", meta["namespace"], meta["name"], e)
        return len(jobs)

    async def resync_forever(self) -> None:
        """The periodic level-triggered resync (the operator's timer)."""
        while True:
            await asyncio.sleep(self.resync_seconds)
            try:
                await self.resync_once()
            except Exception as e:
                log.warning("resync failed: %s", e)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
