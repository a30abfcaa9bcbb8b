"""Checkpoint policy: the retained-checkpoint view that status shows, from the trainer's progress.

The trainer writes a checkpoint every ``checkpoint.everySteps`` steps and at the end, and deletes the
oldest once more than ``checkpoint.keepLast`` complete ones exist; it lists the retained ones in its
progress record. The operator shows that list (oldest first, one entry per step, at most ``keepLast``:
an entry the trainer has not yet pruned is not shown as retained) and the newest as
``status.lastCheckpoint``. Without a progress record the previous view is kept.
"""
from __future__ import annotations

from typing import Optional, Sequence

from rft_api.progress import Progress
from rft_api.status import CheckpointRecord


def retained(progress: Optional[Progress], keep_last: int,
             previous: Sequence[CheckpointRecord] = ()) -> list[CheckpointRecord]:
    """The checkpoints to show, oldest first: unique by step (the later entry wins), newest ``keep_last``."""
    if progress is None:
        return list(previous)
    by_step: dict[int, CheckpointRecord] = {}
    for c in progress.checkpoints:
        by_step[c.step] = CheckpointRecord(step=c.step, path=c.path, time=c.time)
    ordered = [by_step[s] for s in sorted(by_step)]
    return ordered[-keep_last:] if keep_last > 0 else []


def latest(checkpoints: Sequence[CheckpointRecord],
           previous: Optional[CheckpointRecord] = None) -> Optional[CheckpointRecord]:
    """The newest checkpoint, or the previous one when none is listed (a record is never forgotten)."""
    return checkpoints[-1] if checkpoints else previous
