"""How the trainer's run ends: the stop request, the outcome, and the rollout workers told.

A stop is asked for from outside the trainer (``should_stop``: SIGTERM/SIGINT in ``rft trainer``,
the driver's Ctrl-C in ``rft run``); a step polls it while it waits for its groups and ends with
:class:`StopRequested`, counting nothing (:meth:`.feed.TaskFeed.collect`). The run then ends one
of three ways, which :attr:`Shutdown.outcome` records for the experiment trackers when the trainer
closes: ``FINISHED`` (:meth:`.trainer.Trainer.finish`), ``KILLED`` (:meth:`.trainer.Trainer.stop`,
checkpointed for ``--resume``) or ``FAILED`` (neither ran: an error). Before its coordinator's
server stops, the rollout workers active lately are told that the run is done
(:meth:`Shutdown.tell_workers_done`).
"""

from __future__ import annotations

import logging
from typing import Callable, Literal

from ..coordinator import CoordinatorService

log = logging.getLogger(__name__)

# When the trainer stops its coordinator: workers that leased or posted within this many seconds are
# told "done" first, waiting at most TELL_DONE_TIMEOUT_S for them to ask (a worker with room for work
# holds a long-polled lease, answered as soon as the run is done; else it asks when a rollout ends).
WORKER_SEEN_WITHIN_S = 30.0
TELL_DONE_TIMEOUT_S = 5.0

Outcome = Literal["FAILED", "FINISHED", "KILLED"]


class StopRequested(Exception):
    """The trainer was asked to stop while collecting a step (the step is not counted)."""


class Shutdown:
    """The stop request (``should_stop``, polled while a step collects) and how the run ended
    (:attr:`outcome`: ``FAILED`` unless :meth:`finished` or :meth:`stopped` was called)."""

    def __init__(self, should_stop: Callable[[], bool]) -> None:
        self.should_stop = should_stop
        self.outcome: Outcome = "FAILED"

    def finished(self) -> None:
        """Training completed (the final checkpoint and model are written)."""
        self.outcome = "FINISHED"

    def stopped(self) -> None:
        """Stopped before the end, the last completed step checkpointed."""
        self.outcome = "KILLED"

    @staticmethod
    def tell_workers_done(coordinator: CoordinatorService, tell_workers_s: float | None) -> None:
        """Say "done" to rollout workers asking for work (and "finished" only if the coordinator was
        finished: training completed), and wait until every worker active in the last
        :data:`WORKER_SEEN_WITHIN_S` seconds has been told, so none is left retrying an absent
        coordinator (a bounded wait, ``tell_workers_s`` or :data:`TELL_DONE_TIMEOUT_S`: a worker may
        have died meanwhile; 0 where the caller stops its workers itself, as ``rft run`` does)."""
        coordinator.finish(complete=False)
        wait_s = TELL_DONE_TIMEOUT_S if tell_workers_s is None else tell_workers_s
        untold = coordinator.wait_workers_told_done(seen_within_s=WORKER_SEEN_WITHIN_S, timeout_s=wait_s)
        if untold and wait_s > 0:
            log.info("rollout workers not told that the run is done before the coordinator stopped: %s",
                     ", ".join(untold))
