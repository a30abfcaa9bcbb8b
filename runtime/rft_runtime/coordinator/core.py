"""The coordinator's state machine: tasks, leases, groups and counters (pure; no I/O, no threads).

Lifecycle of one submitted task (a prompt to be sampled ``n`` times)::

    queued ──lease──► leased ──all n episodes──► complete ──take──► (gone)
      ▲                 │
      └──expiry/release─┘        cancel: queued|leased|complete → (gone, returned to the caller)

* Every submission gets a unique ``task_key`` (``"{task_id}@{seq}"``); episodes carry it as their
  ``task_id``, so episode ids (``"{task_key}:{rollout_idx}"``) are unique over the whole run.
* Posting is idempotent by episode id: a second copy is counted in ``episodes_duplicate`` and
  ignored. An expired lease is re-issued (front of the queue); episodes of the old lease that
  arrive later are refused (only the live lease's holder posts).
* Staleness: an episode is produced by the policy version of its oldest step. It is accepted when
  ``current - version <= max_staleness`` (0 = on-policy: only the current version). A group that
  became too stale while waiting is dropped at :meth:`Coordinator.take` and its task re-queued.
  A task may wait for a newer policy (``submit(min_version=...)``): it is granted only once the
  version served reaches it, which bounds how old its episodes can be from the moment it is submitted.
* Every dropped or re-issued thing is counted (:attr:`Coordinator.counters`).

* Episodes are checked against the shared type (:class:`rft_runtime.types.Episode`: the token
  contract) before they are accepted; a violation is ``invalid`` with the problem named.
* Trust boundary (docs/security-runtime.md): an episode is accepted only from the worker holding
  the task's live lease (``refused`` otherwise: no lease, another worker's, an expired or released
  one; over HTTP the post must also name the lease id, an unguessable token only the holder got),
  with finite rewards, token ids inside the vocabulary and lengths inside the limits
  (:class:`EpisodeLimits`), and the same first-step prompt ids as the other episodes of its group
  (the coordinator never sees the tokenizer, so it binds the group to one rendered prompt rather
  than to ids it could recompute). Nothing that fails these reaches the trainer.

The worker-facing calls take and return the API's messages (:mod:`.wire`): a lease answers a
:class:`~.wire.LeaseResponse`, a post a :class:`~.wire.PostEpisodesResponse`, the status a
:class:`~.wire.CoordinatorStatus`. A submission is checked once, as an :class:`~.wire.Assignment` (its
``n``, seed, sampling and purpose), and what a lease grants is that assignment as it was checked.

The clock is injected (``clock()`` returns seconds) so lease expiry is tested without sleeping.
"""

from __future__ import annotations

import itertools
import math
import secrets
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from rft_api.constants import REWARD_LIMIT

from ..types import Episode
from .episodes import (
    EpisodeFormatError,
    episode_id,
    episode_rollout_idx,
    episode_task_key,
    episode_version,
    parse_episode,
)
from .wire import (
    OUTCOMES,
    Assignment,
    CoordinatorStatus,
    LeaseGrant,
    LeaseResponse,
    PostEpisodesResponse,
    Sampling,
    TaskStates,
    WireError,
    check_group_size,
)

COUNTER_NAMES = (
    "tasks_submitted",
    "leases_granted",
    "leases_expired",
    "leases_released",
    "tasks_reissued",
    "tasks_cancelled",
    "episodes_accepted",
    "episodes_duplicate",
    "episodes_dropped_stale",
    "episodes_dropped_unknown",
    "episodes_dropped_invalid",
    "episodes_refused_lease",
    "groups_completed",
    "groups_dropped_stale",
    "groups_taken",
)

MAX_LEASE_TASKS = 64  # default cap of tasks granted by one lease call
SEEN_IDS_KEPT = 200_000  # ids of taken episodes remembered to count late duplicates (bounded memory)


BYTES_PER_TOKEN = 512  # JSON of one token in an episode: id, logprob, mask, its text in messages, generously
MAX_BODY_BYTES = 64 * 1024 * 1024  # the ceiling whatever the limits (and the bound when they are unknown)


def max_body_bytes(cfg: "CoordinatorConfig") -> int:
    """The largest episode post the coordinator reads: a worker posts one task's ``n`` episodes at
    a time, each at most the model's context (or prompt + response limits) in tokens; 1 MiB of
    slack, never above :data:`MAX_BODY_BYTES`."""
    lim = cfg.limits
    resp = lim.max_response_tokens or cfg.sampling.get("max_tokens")
    tokens = lim.max_model_len or (lim.max_prompt_tokens + resp if lim.max_prompt_tokens and isinstance(resp, int)
                                   else None)
    if tokens is None:
        return MAX_BODY_BYTES
    return min(MAX_BODY_BYTES, (1 << 20) + cfg.n * tokens * BYTES_PER_TOKEN)


REWARD_RULE = f"rewards must be finite and within ±{REWARD_LIMIT:g}"


def _bad_reward(r: float | None) -> bool:
    """A reward the trainer cannot take: not finite, or beyond :data:`~rft_api.constants.REWARD_LIMIT`
    (an advantage of it could overflow the learner's float32)."""
    return r is not None and not (math.isfinite(r) and abs(r) <= REWARD_LIMIT)


class CoordinatorError(RuntimeError):
    """Misuse of the coordinator by its owner (e.g. taking a group that is not complete)."""


@dataclass(frozen=True)
class EpisodeLimits:
    """What a posted episode may contain (None = not checked).

    Attributes:
        vocab_size: every prompt and response token id must be ``< vocab_size``.
        max_prompt_tokens: the first step's prompt length (``rollout.maxPromptTokens``).
        max_response_tokens: a step's response length; by default the lease's ``sampling.max_tokens``.
        max_model_len: prompt + response of any step (the model's context).
    """

    vocab_size: int | None = None
    max_prompt_tokens: int | None = None
    max_response_tokens: int | None = None
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_prompt_tokens", "max_response_tokens", "max_model_len"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"coordinator: field 'limits.{name}' must be an integer >= 1, got {v!r}")

    def check(self, ep: Episode, max_tokens: int | None = None) -> str | None:
        """The first problem of ``ep`` (a message naming the field), or None; ``max_tokens``: the
        lease's ``sampling.max_tokens``, the response limit unless :attr:`max_response_tokens` is set."""
        max_resp = self.max_response_tokens if self.max_response_tokens is not None else max_tokens
        for t, traj in enumerate(ep.trajectories):
            if _bad_reward(traj.reward):
                return f"trajectories.{t}.reward is {traj.reward!r}: {REWARD_RULE}"
            for i, step in enumerate(traj.steps):
                where = f"trajectories.{t}.steps.{i}"
                if _bad_reward(step.reward):
                    return f"{where}.reward is {step.reward!r}: {REWARD_RULE}"
                if self.vocab_size is not None:
                    for name, ids in (("prompt_ids", step.prompt_ids), ("response_ids", step.response_ids)):
                        if ids and max(ids) >= self.vocab_size:  # one pass in C; the first bad id named
                            bad = next(x for x in ids if x >= self.vocab_size)
                            return f"{where}.{name} holds token id {bad}, outside the vocabulary (size {self.vocab_size})"
                if i == 0 and self.max_prompt_tokens is not None and len(step.prompt_ids) > self.max_prompt_tokens:
                    return (f"{where}.prompt_ids has {len(step.prompt_ids)} tokens, more than maxPromptTokens "
                            f"{self.max_prompt_tokens}")
                if max_resp is not None and len(step.response_ids) > max_resp:
                    return f"{where}.response_ids has {len(step.response_ids)} tokens, more than max_tokens {max_resp}"
                total = len(step.prompt_ids) + len(step.response_ids)
                if self.max_model_len is not None and total > self.max_model_len:
                    return f"{where} has {total} tokens, more than the model's context {self.max_model_len}"
        return None


@dataclass(frozen=True)
class CoordinatorConfig:
    """Settings of a coordinator.

    Attributes:
        n: samples per task (the group size) unless a submission says otherwise (an integer >= 1:
            :data:`~.wire.GroupSize`, the rule every submission's ``n`` is checked by).
        lease_timeout_s: a lease not completed within this time is re-issued.
        max_staleness: 0 = on-policy; S > 0 accepts episodes at most S versions old.
        sampling: default sampling parameters handed out with each lease (vLLM field names, the fields of
            :class:`~.wire.Sampling`; checked when the coordinator is made).
        limits: what an episode may contain (:class:`EpisodeLimits`).
        max_lease_tasks: one lease call grants at most this many tasks (a larger ask is capped).
    """

    n: int
    lease_timeout_s: float
    max_staleness: int = 0
    sampling: Mapping[str, Any] = field(default_factory=dict)
    limits: EpisodeLimits = field(default_factory=EpisodeLimits)
    max_lease_tasks: int = MAX_LEASE_TASKS

    def __post_init__(self) -> None:
        check_group_size(self.n, "coordinator: field 'n'")
        if not self.lease_timeout_s > 0:
            raise ValueError(f"coordinator: field 'lease_timeout_s' must be > 0, got {self.lease_timeout_s!r}")
        if not isinstance(self.max_staleness, int) or self.max_staleness < 0:
            raise ValueError(f"coordinator: field 'max_staleness' must be an integer >= 0, got {self.max_staleness!r}")
        if isinstance(self.max_lease_tasks, bool) or not isinstance(self.max_lease_tasks, int) or self.max_lease_tasks < 1:
            raise ValueError(f"coordinator: field 'max_lease_tasks' must be an integer >= 1, got {self.max_lease_tasks!r}")


@dataclass
class TaskRecord:
    """One submitted task (its checked :class:`~.wire.Assignment`) and the episodes collected for it."""

    order: Assignment
    min_version: int = 0  # granted only once the policy version served is at least this
    state: str = "queued"  # queued | leased | complete
    lease_id: str | None = None
    worker_id: str | None = None
    deadline: float | None = None
    leased_version: int | None = None
    times_leased: int = 0
    episodes: dict[int, Episode] = field(default_factory=dict)
    prompts: dict[str, list[int]] = field(default_factory=dict)  # trajectory name → first-step prompt ids

    @property
    def key(self) -> str:
        return self.order.task_key

    @property
    def n(self) -> int:
        return self.order.n

    def grant(self, lease_id: str, version: int, deadline_in_s: float) -> LeaseGrant:
        """The lease of this task: its assignment, checked at submission, as it is (not checked again)."""
        return LeaseGrant.model_construct(**dict(self.order), lease_id=lease_id, policy_version=version,
                                          deadline_in_s=deadline_in_s)


@dataclass(frozen=True)
class Group:
    """A complete group handed to the trainer: the task and its ``n`` episodes by rollout index."""

    key: str
    task: dict[str, Any]
    purpose: str
    episodes: list[Episode]
    oldest_version: int | None


class Coordinator:
    """Leases tasks to rollout workers and gathers their episodes into groups (not thread-safe)."""

    def __init__(
        self,
        cfg: CoordinatorConfig,
        *,
        policy_version: int = 0,
        clock: Callable[[], float] = time.monotonic,
        seq_start: int = 0,
        nonce: str | None = None,
    ) -> None:
        self.cfg = cfg
        try:
            self._sampling = Sampling.parse(cfg.sampling)
        except WireError as e:
            raise ValueError(f"coordinator: field 'sampling': {e}") from None
        self._version = int(policy_version)
        self._clock = clock
        self._next_seq = int(seq_start)
        self._lease_seq = itertools.count(1)
        self._nonce = nonce or uuid.uuid4().hex[:8]  # kept in lease ids for logs; the secret part follows
        self._tasks: dict[str, TaskRecord] = {}
        self._queue: deque[str] = deque()
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._stale_leases: set[str] = set()  # task keys whose lease turned out stale during one post
        self.done = False
        self.finished = False  # done because training completed (not because the trainer is stopping)
        self._workers: dict[str, float] = {}  # worker id -> when it last leased or posted
        self._told_done: set[str] = set()  # workers a lease has answered "done" since finish()
        self.counters: dict[str, int] = {k: 0 for k in COUNTER_NAMES}
        self._idle_total = 0.0
        self._idle_since: float | None = clock()

    # ---------------------------------------------------------------- owner (trainer) side
    @property
    def policy_version(self) -> int:
        """The version of the policy inference currently serves."""
        return self._version

    def set_policy_version(self, version: int) -> None:
        """Advance the current policy version (never backwards)."""
        if version < self._version:
            raise CoordinatorError(f"policy version may not go backwards: {self._version} -> {version}")
        self._version = int(version)

    @property
    def next_seq(self) -> int:
        """The sequence number the next submission gets (saved in checkpoints)."""
        return self._next_seq

    def submit(
        self,
        tasks: Iterable[Mapping[str, Any]],
        *,
        seeds: Iterable[int],
        purpose: str = "train",
        n: int | None = None,
        sampling: Mapping[str, Any] | None = None,
        min_version: int = 0,
    ) -> list[str]:
        """Queue tasks (``Task.to_dict()`` form) for leasing; returns their task keys in order.

        ``seeds`` gives each task its sampling seed (sample ``i`` uses ``seed + i``). ``min_version``: the
        tasks are granted only once the policy version served is at least this one (they wait in the
        queue, later tasks that may be granted going first): a trainer that publishes a version in the
        background submits the next tasks for the version it has just trained, so that they are not
        sampled from an older policy that would be too stale when their step takes them.

        Each task is checked here, once, as the :class:`~.wire.Assignment` its leases will grant (``n``,
        seed, sampling, purpose): a bad value raises :class:`CoordinatorError` naming the field, and
        nothing of the call is queued.
        """
        try:
            params = self._sampling if sampling is None else Sampling.parse(sampling)
        except WireError as e:
            raise CoordinatorError(f"submit: sampling: {e}") from None
        records: list[TaskRecord] = []
        for i, (task, seed) in enumerate(zip(list(tasks), list(seeds), strict=True)):
            task_id = task.get("task_id")
            if not isinstance(task_id, str) or not task_id:
                raise CoordinatorError(f"submitted task has no 'task_id': {task!r}")
            try:
                order = Assignment.parse({"task_key": f"{task_id}@{self._next_seq + i}", "task": task,
                                          "n": self.cfg.n if n is None else n, "seed": seed, "sampling": params,
                                          "purpose": purpose})
            except WireError as e:
                raise CoordinatorError(f"submitted task {task_id!r}: {e}") from None
            records.append(TaskRecord(order, int(min_version)))
        self._next_seq += len(records)
        keys = [r.key for r in records]
        for rec in records:
            self._tasks[rec.key] = rec
            self._queue.append(rec.key)
        self.counters["tasks_submitted"] += len(keys)
        self._note_work()
        return keys

    def is_complete(self, key: str) -> bool:
        """True when the task has all its episodes (unknown keys raise)."""
        return self._record(key).state == "complete"

    def pending(self, keys: Iterable[str]) -> list[str]:
        """The keys among ``keys`` that are not complete yet."""
        return [k for k in keys if self._record(k).state != "complete"]

    def take(self, keys: Iterable[str]) -> tuple[list[Group], list[str]]:
        """Remove complete groups for training: returns ``(groups, requeued)``.

        A group whose oldest episode became too stale for the current version is dropped (counted
        in ``groups_dropped_stale``), its task re-queued, and its key listed in ``requeued``; wait
        for it again. Raises :class:`CoordinatorError` for a key that is not complete.
        """
        groups: list[Group] = []
        requeued: list[str] = []
        for key in keys:
            rec = self._record(key)
            if rec.state != "complete":
                raise CoordinatorError(f"task {key!r} is {rec.state}, not complete")
            eps = [rec.episodes[i] for i in range(rec.n)]
            oldest = min((v for v in (episode_version(e) for e in eps) if v is not None), default=None)
            if oldest is not None and not self._fresh(oldest):
                self.counters["groups_dropped_stale"] += 1
                self._requeue(rec, front=True, clear=True)
                requeued.append(key)
                continue
            del self._tasks[key]
            for e in eps:
                self._remember(e.id)
            self.counters["groups_taken"] += 1
            groups.append(Group(key, rec.order.task, rec.order.purpose, eps, oldest))
        self._note_work()
        return groups, requeued

    def cancel(self, keys: Iterable[str]) -> list[dict[str, Any]]:
        """Withdraw tasks whatever their state; returns their task dicts (nothing is lost: the
        caller decides whether to submit them again). Later episodes for them are dropped as
        unknown."""
        out = []
        cancel = set(keys)
        for key in cancel:
            rec = self._record(key)
            out.append(rec.order.task)
            del self._tasks[key]
        if cancel:
            self._queue = deque(k for k in self._queue if k not in cancel)
        self.counters["tasks_cancelled"] += len(cancel)
        self._note_work()
        return out

    def finish(self, complete: bool = True) -> None:
        """No more work: leases answer ``done`` from now on. ``complete``: because training completed
        (leases also answer ``finished``); else the trainer is stopping (interrupted, its pod deleted)
        and a later attempt will resume the run, so a worker should come back rather than idle."""
        self.done = True
        self.finished = self.finished or complete

    def workers_not_told_done(self, seen_within_s: float) -> list[str]:
        """Workers that leased or posted within the last ``seen_within_s`` seconds and have had no
        ``done`` answer since :meth:`finish` (all of them before it): the ones a trainer about to stop
        its coordinator would leave asking an absent server."""
        now = self._clock()
        return sorted(w for w, t in self._workers.items() if now - t <= seen_within_s and w not in self._told_done)

    # ---------------------------------------------------------------- worker side
    def lease(self, worker_id: str, max_tasks: int) -> LeaseResponse:
        """Grant up to ``max_tasks`` queued tasks to ``worker_id`` (the fields of a checked
        :class:`~.wire.LeaseRequest`).

        Returns a :class:`~.wire.LeaseResponse` whose grants (:class:`~.wire.LeaseGrant`) are the tasks'
        assignments with a lease id, the version served and the lease's deadline. Expired leases are
        re-issued first. At most ``cfg.max_lease_tasks`` tasks are granted per call whatever
        ``max_tasks`` asks. A lease id is unguessable: posting episodes over HTTP requires it as the
        proof of holding the lease.
        """
        self.expire()
        max_tasks = min(max_tasks, self.cfg.max_lease_tasks)
        grants: list[LeaseGrant] = []
        now = self._clock()
        self._workers[worker_id] = now
        if self.done:
            self._told_done.add(worker_id)
        while not self.done and len(grants) < max_tasks:
            key = self._next_grantable()
            if key is None:
                break
            rec = self._tasks[key]
            rec.state = "leased"
            rec.lease_id = lease_id = f"{self._nonce}-{next(self._lease_seq)}-{secrets.token_hex(16)}"
            rec.worker_id = worker_id
            rec.deadline = now + self.cfg.lease_timeout_s
            rec.leased_version = self._version
            rec.times_leased += 1
            if rec.times_leased > 1:
                self.counters["tasks_reissued"] += 1
            grants.append(rec.grant(lease_id, self._version, float(self.cfg.lease_timeout_s)))
        self.counters["leases_granted"] += len(grants)
        return LeaseResponse(done=self.done, finished=self.finished, policy_version=self._version,
                             lease_timeout_s=float(self.cfg.lease_timeout_s), tasks=grants)

    def post_episodes(self, worker_id: str, episodes: Iterable[Any],
                      lease_ids: Iterable[str] | None = None) -> PostEpisodesResponse:
        """Accept episodes (JSON objects); returns the ids in each outcome (:class:`~.wire.PostEpisodesResponse`).

        Outcomes: ``accepted``, ``duplicate`` (id seen before), ``stale`` (too old a policy),
        ``unknown`` (no such task: cancelled, already trained on, or from another trainer run),
        ``refused`` (the poster does not hold the task's live lease: never leased, leased by
        another worker, expired or released; with ``errors``), ``invalid`` (bad fields, a rollout
        index outside ``0..n-1``, a non-finite reward, a token id outside the vocabulary, a length
        over the limits, a prompt differing from its group's; with ``errors``).

        ``lease_ids`` (required over HTTP): the lease ids the poster holds; an episode is accepted
        only when its task's live lease id is among them.
        """
        held = None if lease_ids is None else set(lease_ids)
        self._workers[worker_id] = self._clock()
        self.expire()  # an expired lease is not a live one
        result: dict[str, list[Any]] = {k: [] for k in OUTCOMES}
        errors: list[str] = []
        for ep in episodes:
            try:
                eid = episode_id(ep)
                key = episode_task_key(ep)
                idx = episode_rollout_idx(ep)
            except EpisodeFormatError as e:
                self.counters["episodes_dropped_invalid"] += 1
                raw_id = ep.get("id") if isinstance(ep, Mapping) else None
                result["invalid"].append(raw_id if isinstance(raw_id, str) else None)
                errors.append(str(e))
                continue
            outcome, error = self._accept(ep, eid, key, idx, worker_id, held)
            result[outcome].append(eid)
            if error:
                errors.append(error)
        for key in self._stale_leases:
            rec = self._tasks.get(key)
            if rec is not None and rec.state == "leased":
                self._requeue(rec, front=True, clear=True)
        self._stale_leases.clear()
        self._note_work()
        # built here from ids read by episode_id (strings; None for an invalid episode without one): trusted
        return PostEpisodesResponse.model_construct(
            accepted=result["accepted"], duplicate=result["duplicate"], stale=result["stale"],
            unknown=result["unknown"], refused=result["refused"], invalid=result["invalid"], errors=errors)

    def release(self, lease_ids: Iterable[str], reason: str = "") -> int:
        """Give leased tasks back for immediate re-issue (a worker that cannot finish them)."""
        ids = set(lease_ids)
        released = 0
        for rec in list(self._tasks.values()):
            if rec.state == "leased" and rec.lease_id in ids:
                self._requeue(rec, front=True)
                released += 1
        self.counters["leases_released"] += released
        return released

    def expire(self) -> int:
        """Re-queue tasks whose lease deadline passed; returns how many."""
        now = self._clock()
        expired = [r for r in self._tasks.values() if r.state == "leased" and r.deadline is not None
                   and r.deadline <= now]
        for rec in expired:
            self._requeue(rec, front=True)
        self.counters["leases_expired"] += len(expired)
        return len(expired)

    # ---------------------------------------------------------------- status
    def status(self) -> CoordinatorStatus:
        """A summary: version, mode, queue sizes and all counters."""
        states = {"queued": 0, "leased": 0, "complete": 0}
        for rec in self._tasks.values():
            states[rec.state] += 1
        return CoordinatorStatus(done=self.done, policy_version=self._version,
                                 mode="on-policy" if self.cfg.max_staleness == 0 else "bounded-staleness",
                                 max_staleness=self.cfg.max_staleness, tasks=TaskStates(**states),
                                 counters=dict(self.counters))

    def idle_seconds(self) -> float:
        """Seconds, since this coordinator was made, during which no task was queued or leased: the
        rollout workers had nothing to generate (``time/idle_generate`` per step is its increase)."""
        now = self._clock()
        return self._idle_total + (now - self._idle_since if self._idle_since is not None else 0.0)

    # ---------------------------------------------------------------- internals
    def _note_work(self) -> None:
        """Start or stop the idle clock after a change that can open or close tasks."""
        open_tasks = any(r.state != "complete" for r in self._tasks.values())  # queued or leased
        now = self._clock()
        if open_tasks and self._idle_since is not None:
            self._idle_total += now - self._idle_since
            self._idle_since = None
        elif not open_tasks and self._idle_since is None:
            self._idle_since = now

    def _record(self, key: str) -> TaskRecord:
        try:
            return self._tasks[key]
        except KeyError:
            raise CoordinatorError(f"unknown task key {key!r}") from None

    def _remember(self, eid: str) -> None:
        self._seen[eid] = None
        while len(self._seen) > SEEN_IDS_KEPT:
            self._seen.popitem(last=False)

    def _next_grantable(self) -> str | None:
        """Take the first queued task the version served may be granted (``min_version``) off the queue."""
        for i, key in enumerate(self._queue):
            if self._tasks[key].min_version <= self._version:
                del self._queue[i]
                return key
        return None

    def _fresh(self, version: int) -> bool:
        return version >= 0 and 0 <= self._version - version <= self.cfg.max_staleness

    @staticmethod
    def _prompt_mismatch(rec: TaskRecord, ep: Episode) -> str | None:
        for t, traj in enumerate(ep.trajectories):
            want = rec.prompts.get(traj.name)
            if traj.steps and want is not None and traj.steps[0].prompt_ids != want:
                return (f"trajectories.{t}.steps.0.prompt_ids differ from the prompt the other episodes of task "
                        f"{rec.key!r} were sampled from")
        return None

    def _requeue(self, rec: TaskRecord, *, front: bool, clear: bool = False) -> None:
        rec.state, rec.lease_id, rec.worker_id, rec.deadline = "queued", None, None, None
        if clear:
            rec.prompts.clear()
            rec.episodes.clear()  # their ids were never remembered: a re-sample is not a duplicate
        (self._queue.appendleft if front else self._queue.append)(rec.key)

    def _accept(self, raw: Mapping[str, Any], eid: str, key: str, idx: int, worker_id: str,
                held: set[str] | None) -> tuple[str, str | None]:
        if eid in self._seen:
            self.counters["episodes_duplicate"] += 1
            return "duplicate", None
        rec = self._tasks.get(key)
        if rec is None:
            self.counters["episodes_dropped_unknown"] += 1
            return "unknown", None
        if rec.state == "complete" or (0 <= idx < rec.n and idx in rec.episodes):
            self.counters["episodes_duplicate"] += 1
            return "duplicate", None
        if rec.state != "leased" or rec.worker_id != worker_id or (held is not None and rec.lease_id not in held):
            self.counters["episodes_refused_lease"] += 1
            why = ("its task is not leased (never leased, expired or released)" if rec.state != "leased"
                   else "the poster does not hold the task's live lease")
            return "refused", f"episode {eid!r}: {why}"
        if not 0 <= idx < rec.n:
            self.counters["episodes_dropped_invalid"] += 1
            return "invalid", f"episode {eid!r}: rollout_idx {idx} is outside 0..{rec.n - 1}"
        if eid != f"{key}:{idx}":
            self.counters["episodes_dropped_invalid"] += 1
            return "invalid", f"episode id {eid!r} must be '{key}:{idx}'"
        try:
            ep = parse_episode(raw)
        except EpisodeFormatError as e:
            self.counters["episodes_dropped_invalid"] += 1
            return "invalid", f"episode {eid!r}: {e}"
        problem = self.cfg.limits.check(ep, rec.order.sampling.max_tokens) or self._prompt_mismatch(rec, ep)
        if problem:
            self.counters["episodes_dropped_invalid"] += 1
            return "invalid", f"episode {eid!r}: {problem}"
        version = episode_version(ep, default=rec.leased_version)
        if version is None or version > self._version:
            self.counters["episodes_dropped_invalid"] += 1
            return "invalid", f"episode {eid!r}: policy version {version} is not a served version"
        if not self._fresh(version):
            self.counters["episodes_dropped_stale"] += 1
            # The lease's work is unusable: leased under a policy that is now too old, or sampled
            # from an engine serving older weights than the lease asked for (an inference server
            # that restarted with its base weights). Sample again now instead of at lease expiry
            # (once the whole post is read: its other episodes belong to the same lease).
            self._stale_leases.add(rec.key)
            return "stale", None
        rec.episodes[idx] = ep
        for traj in ep.trajectories:
            if traj.steps:
                rec.prompts.setdefault(traj.name, list(traj.steps[0].prompt_ids))
        self.counters["episodes_accepted"] += 1
        if len(rec.episodes) == rec.n:
            if rec.state == "queued":
                self._queue = deque(k for k in self._queue if k != key)
            rec.state, rec.lease_id, rec.deadline = "complete", None, None
            self.counters["groups_completed"] += 1
        return "accepted", None
