"""Where a step's groups come from: the tasks the trainer submits to its coordinator and collects.

Data order: tasks come from a seeded, resumable cursor (the tasks a checkpoint carried over first);
each submitted task gets a sampling seed derived from the job seed and its submission number
(:func:`task_seed`), so a resumed run sees the same tasks with the same seeds as an uninterrupted
one. Under bounded staleness (``rollout.maxStaleness`` S > 0) the tasks of the next S steps are kept
submitted ahead (:meth:`TaskFeed.prefetch`); with DAPO's dynamic sampling a step submits rounds
until enough groups carry a learning signal (:meth:`TaskFeed.train_groups`). Every task is sampled
from the trainer's current policy or a newer one (``min_version``: while a publication runs in the
background, they wait for it).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
from collections import deque
from typing import Any, Callable

from rft_api.runtime import RuntimeConfig

from ..algos import DynamicSampler
from ..coordinator import CoordinatorService, Group
from ..data import DataCursor, DomainMixCursor
from .datasets import load_training_tasks
from .shutdown import StopRequested

log = logging.getLogger(__name__)

SEED_MOD = 2**31 - 1


def task_seed(job_seed: int, seq: int) -> int:
    """The sampling seed of submission ``seq`` (sample ``i`` uses ``seed + i``)."""
    return (job_seed * 1_000_003 + seq * 7_919 + 17) % SEED_MOD


def sampling_params(spec: Any, temperature: float | None = None) -> dict[str, Any]:
    """Sampling fields handed to rollout workers with each lease (vLLM names)."""
    r = spec.rollout
    out: dict[str, Any] = {"max_tokens": r.max_tokens, "temperature": r.temperature if temperature is None else temperature}
    if r.top_p < 1.0:
        out["top_p"] = r.top_p
    if r.top_k != -1:
        out["top_k"] = r.top_k
    return out


def group_rewards(g: Group) -> list[float | None]:
    """The rewards of a group's episodes (for dynamic sampling)."""
    return [e.reward for e in g.episodes]


class TaskFeed:
    """The training tasks (:meth:`load`), their submission to the coordinator (:meth:`connect`) and the
    collection of each step's groups. ``min_version``: the trainer's policy version, the oldest a
    submitted task may be sampled from; ``should_stop``: polled while collecting."""

    def __init__(self, cfg: RuntimeConfig, max_steps: int, *, min_version: Callable[[], int],
                 should_stop: Callable[[], bool]) -> None:
        self.cfg, self.spec, self.alg = cfg, cfg.spec, cfg.algorithm
        self.max_steps = max_steps
        self._min_version = min_version
        self._should_stop = should_stop
        self.pending: list[dict[str, Any]] = []  # carried over by a checkpoint: submitted before the cursor's
        # Bounded staleness S: the tasks of up to S later steps, submitted ahead (oldest first), so the
        # rollouts of steps t+1..t+S run while step t trains.
        self.prefetched: deque[list[str]] = deque()
        self.prefetched_tasks: deque[list[dict[str, Any]]] = deque()
        self._coordinator: CoordinatorService | None = None

    def load(self) -> None:
        """The training tasks behind a seeded cursor (a domain mix's when ``dataset.mix`` is set)."""
        spec = self.spec
        self.tasks = load_training_tasks(spec.dataset, self.cfg.paths.datasets)
        self.cursor: DataCursor | DomainMixCursor
        if spec.dataset.mix:
            self.cursor = DomainMixCursor(self.tasks, [(m.domain, m.weight) for m in spec.dataset.mix],
                                          seed=spec.dataset.order_seed(), shuffle=spec.dataset.shuffle)
            log.info("domain mix per step of %d prompts: %s", spec.rollout.prompts_per_step,
                     ", ".join(f"{d} {n}" for d, n in self.cursor.counts(spec.rollout.prompts_per_step).items()))
        else:
            self.cursor = DataCursor(self.tasks, seed=spec.dataset.order_seed(), shuffle=spec.dataset.shuffle)

    @functools.cached_property
    def fingerprint(self) -> str:
        """The training tasks' content, hashed (a checkpoint's run identity: a dataset edited under a
        running job would silently misplace the data cursor)."""
        blob = json.dumps([dataclasses.asdict(t) for t in self.tasks], sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def restore(self, cursor: dict[str, Any], pending: list[dict[str, Any]]) -> None:
        """Continue from a checkpoint's cursor, with the tasks it carried over."""
        self.cursor.load_state_dict(cursor)
        self.pending = list(pending)

    def carried_tasks(self) -> list[dict[str, Any]]:
        """The tasks a checkpoint carries over: the prefetched ones (they stay live in the coordinator;
        a resumed run submits them again), then those not submitted yet."""
        return [t for tasks in self.prefetched_tasks for t in tasks] + list(self.pending)

    def connect(self, coordinator: CoordinatorService) -> None:
        self._coordinator = coordinator

    @property
    def coordinator(self) -> CoordinatorService:
        if self._coordinator is None:
            raise RuntimeError("the trainer's coordinator is not started")
        return self._coordinator

    def next_tasks(self, k: int) -> list[dict[str, Any]]:
        out = self.pending[:k]
        self.pending = self.pending[k:]
        if len(out) < k:
            out += [t.to_dict() for t in self.cursor.next_batch(k - len(out))]
        return out

    def submit(self, tasks: list[dict[str, Any]], **kw: Any) -> list[str]:
        """Queue ``tasks``, sampled from the trainer's current policy or a newer one (while its
        publication runs in the background they wait for it)."""
        coordinator = self.coordinator
        seq0 = coordinator.next_seq
        seeds = [task_seed(self.spec.trainer.seed, seq0 + i) for i in range(len(tasks))]
        return coordinator.submit(tasks, seeds=seeds, min_version=self._min_version(), **kw)

    def collect(self, keys: list[str]) -> list[Group]:
        """The groups of ``keys``, once complete; :class:`.shutdown.StopRequested` when asked to stop."""
        groups = self.coordinator.collect(keys, stall_timeout_s=self.cfg.trainer.stall_timeout_seconds,
                                          should_stop=self._should_stop)
        if groups is None:
            raise StopRequested()
        return groups

    def prefetch(self, step_no: int) -> None:
        """Bounded staleness S: keep the tasks of the S steps after ``step_no`` (never past the last)
        submitted, so the rollouts run ahead while the trainer trains. Their episodes are at most S
        versions old when their step takes them (the coordinator drops a group that became staler and
        samples it again)."""
        depth = min(self.spec.rollout.max_staleness, self.max_steps - step_no)
        while len(self.prefetched) < depth:
            tasks = self.next_tasks(self.spec.rollout.prompts_per_step)
            self.prefetched_tasks.append(tasks)
            self.prefetched.append(self.submit(tasks))

    def train_groups(self) -> tuple[list[Group], list[Group], dict[str, float]]:
        """(groups to train on, every group generated this step, dynamic-sampling stats)."""
        target = self.spec.rollout.prompts_per_step
        prefetched: list[str] = []
        if self.prefetched:
            prefetched = self.prefetched.popleft()
            self.prefetched_tasks.popleft()
        if not self.alg.dynamic_sampling:
            keys = prefetched or self.submit(self.next_tasks(target))
            groups = self.collect(keys)
            return groups, groups, {}
        sampler: DynamicSampler[Group] = DynamicSampler(target, self.alg.dynamic_sampling_max_rounds + 1,
                                                        rewards_of=group_rewards)
        everything: list[Group] = []
        while not sampler.done:
            need = sampler.groups_needed()
            keys = prefetched or self.submit(self.next_tasks(need))
            prefetched = []
            groups = self.collect(keys)
            everything += groups
            sampler.add_round(groups)
        res = sampler.result()
        train = res.groups or res.dropped  # nothing with signal: zero advantages, a no-op gradient
        stats = {"ds_rounds": float(res.rounds), "ds_kept_groups": float(len(res.groups)),
                 "ds_dropped_groups": float(len(res.dropped)), "ds_surplus_groups": float(len(res.surplus)),
                 "ds_complete": float(res.complete)}
        return train, everything, stats
