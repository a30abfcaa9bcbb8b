"""A thread-safe wrapper of :class:`~rft_runtime.coordinator.core.Coordinator`.

The HTTP handlers (in the server thread) and the trainer (in its own thread) share one
coordinator through this class: every call takes the lock, and the trainer can block until the
groups it waits for are complete. Listeners (:meth:`CoordinatorService.add_listener`) hear of every
change that can give a waiting lease something to answer (tasks submitted or given back, a new policy
version, the run finishing): the HTTP layer's long-polled leases wait on them.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable, Mapping

from .core import Coordinator, CoordinatorConfig, Group
from .wire import CoordinatorStatus, LeaseResponse, PostEpisodesResponse


class CollectTimeout(TimeoutError):
    """No episode arrived for too long while the trainer waited for groups."""


class CoordinatorService:
    """Lock-protected access to a coordinator, plus waiting for groups."""

    def __init__(self, core: Coordinator) -> None:
        self._core = core
        self._cond = threading.Condition()
        self._last_progress = time.monotonic()
        self._listeners: list[Callable[[], None]] = []

    def add_listener(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` (from whichever thread made it, holding the lock: it must only schedule work)
        after each change that may let a lease that found nothing find something."""
        with self._cond:
            self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[], None]) -> None:
        with self._cond:
            if fn in self._listeners:
                self._listeners.remove(fn)

    def _changed(self) -> None:
        """Under the lock: wake the trainer waiting in :meth:`collect` and the listeners."""
        self._cond.notify_all()
        for fn in self._listeners:
            fn()

    @property
    def config(self) -> CoordinatorConfig:
        """The coordinator's (immutable) settings."""
        return self._core.cfg

    # ---------------------------------------------------------------- worker-facing (HTTP)
    def lease(self, worker_id: str, max_tasks: int) -> LeaseResponse:
        """See :meth:`Coordinator.lease`."""
        with self._cond:
            return self._core.lease(worker_id, max_tasks)

    def post_episodes(self, worker_id: str, episodes: Iterable[Any],
                      lease_ids: Iterable[str] | None = None) -> PostEpisodesResponse:
        """See :meth:`Coordinator.post_episodes`; wakes a waiting trainer."""
        with self._cond:
            result = self._core.post_episodes(worker_id, episodes, lease_ids)
            if result.accepted or result.stale:
                self._last_progress = time.monotonic()
            self._changed()
            return result

    def release(self, lease_ids: Iterable[str], reason: str = "") -> int:
        """See :meth:`Coordinator.release`."""
        with self._cond:
            n = self._core.release(lease_ids, reason)
            if n:
                self._changed()
            return n

    def status(self) -> CoordinatorStatus:
        """See :meth:`Coordinator.status`."""
        with self._cond:
            return self._core.status()

    # ---------------------------------------------------------------- trainer-facing
    @property
    def policy_version(self) -> int:
        """The current policy version."""
        with self._cond:
            return self._core.policy_version

    @property
    def next_seq(self) -> int:
        """The sequence number of the next submission."""
        with self._cond:
            return self._core.next_seq

    def set_policy_version(self, version: int) -> None:
        """See :meth:`Coordinator.set_policy_version`."""
        with self._cond:
            self._core.set_policy_version(version)
            self._changed()

    def submit(self, tasks: Iterable[Mapping[str, Any]], **kw: Any) -> list[str]:
        """See :meth:`Coordinator.submit`."""
        with self._cond:
            self._last_progress = time.monotonic()
            keys = self._core.submit(tasks, **kw)
            self._changed()
            return keys

    def cancel(self, keys: Iterable[str]) -> list[dict[str, Any]]:
        """See :meth:`Coordinator.cancel`."""
        with self._cond:
            return self._core.cancel(keys)

    def finish(self, complete: bool = True) -> None:
        """See :meth:`Coordinator.finish`."""
        with self._cond:
            self._core.finish(complete)
            self._changed()

    def wait_workers_told_done(self, *, seen_within_s: float, timeout_s: float, poll_s: float = 0.05) -> list[str]:
        """After :meth:`finish`: wait up to ``timeout_s`` until every worker seen within the last
        ``seen_within_s`` seconds has had a ``done`` answer (a worker asks for work every fraction of a
        second, or when a rollout it runs ends); returns those still not told."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._cond:
                untold = self._core.workers_not_told_done(seen_within_s)
            if not untold or time.monotonic() >= deadline:
                return untold
            time.sleep(poll_s)

    def counters(self) -> dict[str, int]:
        """A copy of the counters."""
        with self._cond:
            return dict(self._core.counters)

    def idle_seconds(self) -> float:
        """See :meth:`Coordinator.idle_seconds`."""
        with self._cond:
            return self._core.idle_seconds()

    def collect(
        self,
        keys: list[str],
        *,
        stall_timeout_s: float,
        should_stop: Callable[[], bool] = lambda: False,
        poll_s: float = 0.25,
    ) -> list[Group] | None:
        """Block until every task in ``keys`` is complete and fresh; return their groups in the
        order of ``keys``.

        Returns None when ``should_stop()`` turns true; groups not yet taken stay in the
        coordinator (cancel them if they will not be collected). Raises :class:`CollectTimeout`
        after ``stall_timeout_s`` without any episode arriving.
        """
        wanted = list(keys)
        got: dict[str, Group] = {}
        with self._cond:
            while True:
                remaining = [k for k in wanted if k not in got]
                if not remaining:
                    return [got[k] for k in wanted]
                if not self._core.pending(remaining):
                    groups, requeued = self._core.take(remaining)  # stale ones are re-queued
                    got.update((g.key, g) for g in groups)
                    if requeued:
                        self._changed()
                    continue
                if should_stop():
                    return None
                if self._core.expire():
                    self._changed()
                if time.monotonic() - self._last_progress > stall_timeout_s:
                    raise CollectTimeout(
                        f"no episode arrived for {stall_timeout_s:.0f}s while waiting for "
                        f"{len(remaining)} of {len(wanted)} groups; are rollout workers running? "
                        f"coordinator status: {self._core.status().model_dump()}")
                self._cond.wait(poll_s)
