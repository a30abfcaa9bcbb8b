"""The async side of reconciling: one reconcile at a time per job, coalesced triggers, bounded
concurrency, requeues with backoff, and the periodic resync with jitter.

Every trigger (a watch event of the job, of one of its children or pods, the periodic resync, a
requeue) calls :meth:`Controller.reconcile`, which takes the job, its children and its pods from the
watch cache (:class:`rft_operator.store.Store`) and runs the blocking
:func:`rft_operator.reconcile.reconcile` in a thread; what the reconcile wrote goes back into the
cache. While one reconcile of a job runs, further triggers for it collapse into a single follow-up.
At most ``max_concurrent`` reconciles run at once. A reconcile that failed on a transient API error
is retried with exponential backoff (capped), besides the resync.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Optional

from rft_api.constants import KIND

from . import names
from .builders.common import Site
from .kube import Kube, KubeError, child_kinds
from .metrics import Metrics
from .reconcile import Outcome, reconcile
from .store import Key, Store

log = logging.getLogger(__name__)
BACKOFF_S = (1.0, 60.0)
"""First and longest delay of the retries after a failed reconcile."""
JITTER = 0.2
"""The resync period varies by ± this fraction, and each job's resync is spread over the period."""


class Controller:
    """Serialises reconciles per job, bounds their concurrency, keeps the cache and the metrics."""

    def __init__(self, api: Kube, metrics: Metrics, *, namespaces: tuple[str, ...] = (),
                 resync_seconds: float = 10.0,
                 max_concurrent: int = 8, store: Optional[Store] = None, kueue: bool = False,
                 dns_ports: Optional[tuple[int, ...]] = None, dns_cidrs: tuple[str, ...] = (),
                 site: Site = Site()):
        self.api = api
        self.site = site
        self.kueue = kueue
        self.dns_ports = dns_ports
        self.dns_cidrs = dns_cidrs
        self.metrics = metrics
        self.namespaces = namespaces
        self.resync_seconds = resync_seconds
        self.store = store or Store()
        self.max_concurrent = max_concurrent
        self._slots: Optional[asyncio.Semaphore] = None
        self._locks: dict[Key, asyncio.Lock] = {}
        self._waiting: set[Key] = set()
        self._failures: dict[Key, int] = {}
        self._tasks: set[asyncio.Task] = set()

    # ---------------------------------------------------------------- the cache
    def prime(self) -> None:
        """Fill the cache with one LIST per watched kind (blocking; before the watches start)."""
        for ns in (self.namespaces or (None,)):
            for obj in self.api.list(KIND, ns):
                self.store.put_job(obj)
            for kind in (*child_kinds(self.kueue), "Pod"):
                for obj in self.api.list(kind, ns, names.MANAGED_SELECTOR):
                    self.store.put(obj)
        self.metrics.set_phases(self._phases())

    def _phases(self) -> list[str]:
        return [(j.get("status") or {}).get("phase", "Pending") for j in self.store.jobs.values()]

    # ---------------------------------------------------------------- reconciling
    async def reconcile(self, namespace: str, name: str) -> Optional[Outcome]:
        """Reconcile one job now (or join the one already queued). Transient API errors propagate."""
        key = (namespace, name)
        if key in self._waiting:
            return None  # a reconcile that has not started yet will see the latest state
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._waiting.add(key)
        async with lock:
            self._waiting.discard(key)
            if self._slots is None:
                self._slots = asyncio.Semaphore(self.max_concurrent)
            async with self._slots:
                return await self._run(key)

    async def _run(self, key: Key) -> Optional[Outcome]:
        namespace, name = key
        obj = self.store.jobs.get(key)
        if obj is None:
            self.metrics.reconciles.labels(result="gone").inc()
            self._locks.pop(key, None)
            self._failures.pop(key, None)
            return None
        t0 = time.perf_counter()
        try:
            outcome = await asyncio.to_thread(reconcile, self.api, obj, children=self.store.children(key),
                                              pods=self.store.pods(key), kueue=self.kueue,
                                              dns_ports=self.dns_ports, dns_cidrs=self.dns_cidrs,
                                              site=self.site)
        except KubeError as e:
            self.metrics.reconciles.labels(result="error").inc()
            self.metrics.errors.labels(kind="transient" if e.transient else "unexpected").inc()
            self._retry(key)
            raise
        except Exception:
            self.metrics.reconciles.labels(result="error").inc()
            self.metrics.errors.labels(kind="unexpected").inc()
            self._retry(key)
            raise
        finally:
            self.metrics.duration.observe(time.perf_counter() - t0)
        self._failures.pop(key, None)
        learnt = [outcome.token] if outcome.token is not None else []
        self.store.settle(key, [outcome.current[k] for k in outcome.applied if k in outcome.current] + learnt,
                          outcome.deleted)
        if outcome.status_obj is not None:
            self.store.put_job(outcome.status_obj)
        self.metrics.reconciles.labels(result="ok").inc()
        if outcome.errors:
            self.metrics.errors.labels(kind="apply").inc(len(outcome.errors))
        if outcome.requeue_after is not None:
            self._later(outcome.requeue_after, key)
        log.debug("reconciled %s/%s: phase=%s applied=%d deleted=%s status_written=%s", namespace, name,
                  outcome.phase, len(outcome.applied), outcome.deleted, outcome.status_written)
        return outcome

    def _retry(self, key: Key) -> None:
        n = self._failures[key] = self._failures.get(key, 0) + 1
        first, cap = BACKOFF_S
        self._later(min(cap, first * 2 ** (n - 1)) * random.uniform(1 - JITTER, 1 + JITTER), key)

    def _later(self, delay: float, key: Key) -> None:
        async def requeue() -> None:
            await asyncio.sleep(delay)
            try:
                await self.reconcile(*key)
            except Exception as e:  # retried with backoff (and by the resync)
                log.warning("requeued reconcile of %s/%s failed: %s", *key, e)

        task = asyncio.get_running_loop().create_task(requeue())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---------------------------------------------------------------- the resync
    async def resync_once(self, spread: float = 0.0) -> int:
        """Reconcile every cached job, spread over ``spread`` seconds; returns how many were seen."""
        keys = sorted(self.store.jobs)
        self.metrics.set_phases(self._phases())
        random.shuffle(keys)

        async def one(i: int, key: Key) -> None:
            if spread:
                await asyncio.sleep(spread * (i + 1) / len(keys))
            try:
                await self.reconcile(*key)
            except Exception as e:
                log.warning("resync of %s/%s failed: %s", *key, e)

        await asyncio.gather(*(one(i, k) for i, k in enumerate(keys)))
        return len(keys)

    async def resync_forever(self) -> None:
        """The periodic level-triggered resync (the operator's timer), from the cache, with jitter."""
        while True:
            period = self.resync_seconds * random.uniform(1 - JITTER, 1 + JITTER)
            if not self.store.jobs:
                await asyncio.sleep(period)
                continue
            try:
                await self.resync_once(spread=period)  # takes about a period: each job once per period
            except Exception as e:
                log.warning("resync failed: %s", e)
                await asyncio.sleep(period)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
