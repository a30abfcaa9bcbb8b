"""A deterministic, resumable cursor over a list of tasks.

Epoch ``e`` visits the tasks in a permutation drawn from ``(seed, e)`` alone (or in the given order
when ``shuffle=False``), so ``(seed, epoch, index)`` is the whole state: a trainer that saves
:meth:`DataCursor.state_dict` and restores it with :meth:`DataCursor.load_state_dict` sees exactly
the batches an uninterrupted run would have seen. Batches run across epoch boundaries.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Sequence

from .task import DatasetError, Task

__all__ = ["DataCursor", "epoch_order", "tasks_fingerprint"]


def epoch_order(num_tasks: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """The visiting order (indices into the task list) of ``epoch``; deterministic."""
    order = list(range(num_tasks))
    if shuffle:
        random.Random(f"cursor:{seed}:{epoch}").shuffle(order)
    return order


def tasks_fingerprint(tasks: Sequence[Task]) -> str:
    """A short digest of the task ids in order, to refuse resuming over a different dataset."""
    h = hashlib.sha256()
    for t in tasks:
        h.update(t.task_id.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:16]


class DataCursor:
    """Iterate ``tasks`` in seeded per-epoch order, ``k`` at a time, resumably.

    ``epochs`` bounds the number of passes (``None``: unbounded). ``next_batch(k)`` returns up to
    ``k`` tasks; it returns fewer only when the last epoch ends, and ``[]`` once exhausted.
    Tasks repeat across epochs with the same ``task_id``: callers that need unique ids per lease
    combine the id with :attr:`epoch` (see :meth:`next_batch_with_positions`).
    """

    def __init__(
        self,
        tasks: Sequence[Task],
        seed: int = 0,
        epoch: int = 0,
        index: int = 0,
        *,
        shuffle: bool = True,
        epochs: int | None = None,
    ) -> None:
        if not tasks:
            raise DatasetError("DataCursor: field 'tasks' must not be empty")
        if epochs is not None and epochs < 1:
            raise DatasetError(f"DataCursor: field 'epochs' must be >= 1 or None, got {epochs}")
        self._tasks = list(tasks)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.epochs = epochs
        self._fingerprint = tasks_fingerprint(self._tasks)
        self._set_position(epoch, index)

    def _set_position(self, epoch: int, index: int) -> None:
        if epoch < 0 or not 0 <= index <= len(self._tasks):
            raise DatasetError(f"DataCursor: position epoch={epoch} index={index} is out of range "
                               f"for {len(self._tasks)} tasks")
        if index == len(self._tasks):
            epoch, index = epoch + 1, 0
        self.epoch, self.index = epoch, index
        self._order = epoch_order(len(self._tasks), self.seed, epoch, self.shuffle)

    @property
    def num_tasks(self) -> int:
        """Number of tasks in one epoch."""
        return len(self._tasks)

    @property
    def exhausted(self) -> bool:
        """True once every allowed epoch has been consumed."""
        return self.epochs is not None and self.epoch >= self.epochs

    @property
    def consumed(self) -> int:
        """Tasks handed out since epoch 0, index 0."""
        return self.epoch * len(self._tasks) + self.index

    def next_batch_with_positions(self, k: int) -> list[tuple[int, int, Task]]:
        """Like :meth:`next_batch` but each item is ``(epoch, index_in_epoch, task)``."""
        if k < 0:
            raise DatasetError(f"DataCursor.next_batch: field 'k' must be >= 0, got {k}")
        out: list[tuple[int, int, Task]] = []
        while len(out) < k and not self.exhausted:
            out.append((self.epoch, self.index, self._tasks[self._order[self.index]]))
            self._set_position(self.epoch, self.index + 1)
        return out

    def next_batch(self, k: int) -> list[Task]:
        """The next ``k`` tasks (fewer only at the end of the last epoch)."""
        return [t for _, _, t in self.next_batch_with_positions(k)]

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state: seed, epoch, index, shuffle, epochs, num_tasks, fingerprint."""
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "index": self.index,
            "shuffle": self.shuffle,
            "epochs": self.epochs,
            "num_tasks": len(self._tasks),
            "fingerprint": self._fingerprint,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position saved by :meth:`state_dict`; refuses a different dataset."""
        for key in ("seed", "epoch", "index", "num_tasks", "fingerprint"):
            if key not in state:
                raise DatasetError(f"DataCursor.load_state_dict: field {key!r} is missing")
        if state["num_tasks"] != len(self._tasks) or state["fingerprint"] != self._fingerprint:
            raise DatasetError(
                "DataCursor.load_state_dict: field 'fingerprint' does not match: the state was saved "
                f"over {state['num_tasks']} tasks ({state['fingerprint']}), this cursor has "
                f"{len(self._tasks)} ({self._fingerprint})"
            )
        self.seed = int(state["seed"])
        self.shuffle = bool(state.get("shuffle", self.shuffle))
        self.epochs = state.get("epochs", self.epochs)
        self._set_position(int(state["epoch"]), int(state["index"]))
