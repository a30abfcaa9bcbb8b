"""Keep every inference endpoint on the trainer's current policy version.

An inference server that restarts (its pod deleted or crashed, a replica rescheduled) comes back
with the base weights and reports policy version 0 (or, serving adapters, none) while the trainer
is at version ``v``. Every sample it serves is then stale (or, for adapters, refused): the step never
completes. :class:`InferenceSync` polls the version each endpoint reports (``GET
/get_policy_version``, or the adapters listed by ``/v1/models``) every ``period_s`` seconds and, for
an endpoint that answers with a version other than the current one, re-loads the current weights
(``<checkpoints>/weights/v<v>``, which the publisher keeps) through the engine's reload protocol
(an adapter engine gets every kept version). An unreachable endpoint (still starting, no address
yet) is skipped until it answers; while discovery lists no replica, nothing is checked
(:meth:`.InferenceReplicas.urls` without waiting).

The trainer holds :attr:`InferenceSync.lock` while it publishes a new version, so a check never
sees a half-published version and never loads an older one over it.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

import httpx

from .publisher import WeightPublisher
from .reload import PublishError

log = logging.getLogger(__name__)


class InferenceSync:
    """A daemon thread that re-publishes the current weights to endpoints that lost them."""

    def __init__(self, publisher: WeightPublisher, current_version: Callable[[], int], *,
                 period_s: float = 2.0) -> None:
        self.publisher = publisher
        self.current_version = current_version
        self.period_s = period_s
        self.lock = threading.Lock()
        self.resynced: list[tuple[str, int | None, int]] = []
        """(endpoint, version it reported, version loaded) for every re-load done."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="inference-sync", daemon=True)

    def start(self) -> "InferenceSync":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def check_once(self) -> list[str]:
        """Re-load the current weights into every reachable endpoint that reports another version;
        returns the endpoints re-loaded."""
        done = []
        with self.lock:
            version = self.current_version()
            path = self.publisher.weights_dir(version)
            for url, reported in self.publisher.current_versions().items():
                if reported is None or reported == version:
                    continue
                if not path.is_dir():
                    log.warning("inference %s reports policy version %s, but the weights of version %d are not "
                                "at %s", url, reported, version, path)
                    continue
                log.warning("inference %s reports policy version %s, the trainer is at %d: re-loading %s",
                            url, reported, version, path)
                self.publisher.restore_endpoint(url, version)
                self.resynced.append((url, reported, version))
                done.append(url)
        return done

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.check_once()
            except (PublishError, httpx.HTTPError, OSError) as e:
                log.warning("inference re-sync failed (retrying in %.0fs): %s", self.period_s, e)
