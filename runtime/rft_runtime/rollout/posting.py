"""Episode posts of tasks that finish together, sent to the coordinator as one request.

A rollout worker's tasks finish in bursts: the engine batches their requests, so the ``n`` samples of
several prompts come back in the same decode iteration. One ``POST /v1/episodes`` per task costs the
worker an HTTP exchange each and, worse, the coordinator (a thread of the trainer's process) a request
each while the trainer computes. :class:`EpisodePoster` sends at most one post at a time: the tasks that
finish while one is in flight go together in the next, with every task's lease id (the coordinator
accepts an episode only when its task's live lease is among the ids, so coalescing changes no outcome).
Nothing waits to be coalesced: a task that finishes with no post in flight is posted at once.

A coalesced body stays within :data:`COALESCE_BYTES`, the slack every coordinator's body limit has
beyond one task's post (:func:`~rft_runtime.coordinator.core.max_body_bytes`); a single task's post
larger than that goes alone, as it always did. A post the coordinator refuses in part (409/422: an
episode without its live lease, or invalid) fails only the tasks whose episodes were refused, as their own
posts would have; a post that fails otherwise fails every task in it (each releases its lease, as
before); a task cancelled before its post was sent is left out of it.

Episodes are encoded here, once per task, and spliced into the post's envelope as they are (the
coordinator's client types only the envelope, :meth:`~.coordinator_client.CoordinatorClient.post_episodes_json`);
each task's answer is its share of the post's typed answer (:class:`~rft_runtime.coordinator.wire.PostEpisodesResponse`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
from typing import Any

from ..coordinator.wire import PostEpisodesResponse, WireError
from .coordinator_client import CoordinatorClient, CoordinatorRejected

COALESCE_BYTES = 1 << 20
"""The most episode bytes in a post of several tasks."""


@dataclasses.dataclass
class _Entry:
    lease_id: str
    ids: frozenset[str]
    body: bytes  # the task's episodes as JSON objects joined by commas
    done: asyncio.Future[PostEpisodesResponse]


class EpisodePoster:
    """Posts each task's episodes, coalescing the tasks that finish while a post is in flight.

    :attr:`requests` counts the posts sent (for tests and metrics)."""

    def __init__(self, coord: CoordinatorClient, worker_id: str, *, coalesce_bytes: int = COALESCE_BYTES) -> None:
        self._coord = coord
        self._worker_id = worker_id
        self._limit = coalesce_bytes
        self._queue: collections.deque[_Entry] = collections.deque()
        self._sender: asyncio.Task[None] | None = None
        self.requests = 0

    async def post(self, episodes: list[dict[str, Any]], lease_id: str) -> PostEpisodesResponse:
        """Post one task's episodes (JSON form) under its lease; returns the coordinator's outcome lists
        (``accepted``, ``stale``, ...) for these episodes and the ``errors`` that name them. Raises what
        the post raised (:class:`~rft_runtime.rollout.coordinator_client.CoordinatorUnavailable`, ...;
        a :class:`~rft_runtime.rollout.coordinator_client.CoordinatorRejected` whose ``body`` is this
        task's share of the answer)."""
        body = ",".join(json.dumps(ep, separators=(",", ":")) for ep in episodes).encode()
        entry = _Entry(lease_id, frozenset(str(ep.get("id")) for ep in episodes), body,
                       asyncio.get_running_loop().create_future())
        self._queue.append(entry)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._drain())
        return await entry.done  # cancelling the task cancels its entry: a post not yet sent leaves it out

    async def aclose(self) -> None:
        """Stop sending (the tasks still waiting are cancelled)."""
        if self._sender is not None and not self._sender.done():
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
        for e in self._queue:
            e.done.cancel()
        self._queue.clear()

    def _next_batch(self) -> list[_Entry]:
        batch: list[_Entry] = []
        size = 0
        while self._queue:
            e = self._queue[0]
            if e.done.done():  # cancelled while it waited
                self._queue.popleft()
                continue
            if batch and size + len(e.body) > self._limit:
                break
            batch.append(self._queue.popleft())
            size += len(e.body) + 1
        return batch

    async def _drain(self) -> None:
        while batch := self._next_batch():
            self.requests += 1
            try:
                res = await self._coord.post_episodes_json(self._worker_id, [e.lease_id for e in batch],
                                                           b",".join(e.body for e in batch))
            except asyncio.CancelledError:
                for e in batch:
                    e.done.cancel()
                raise
            except CoordinatorRejected as ex:
                outcome = _outcome(ex)
                if outcome is None:  # not refused episodes (a 400, 401, 413...): every task fails with it
                    _fail(batch, ex)
                else:  # refused in part: the tasks whose episodes were refused fail, as alone they would
                    _settle(batch, outcome, ex)
                continue
            except Exception as ex:  # noqa: BLE001 - every task of the post fails with it
                _fail(batch, ex)
                continue
            _settle(batch, res, None)


def _outcome(ex: CoordinatorRejected) -> PostEpisodesResponse | None:
    """The episodes' outcomes a rejected post carries: a 409 (refused) or 422 (invalid) answer's body."""
    if ex.status not in (409, 422):
        return None
    try:
        return PostEpisodesResponse.parse(ex.body)
    except WireError:
        return None


def _fail(batch: list[_Entry], ex: BaseException) -> None:
    for e in batch:
        if not e.done.done():
            e.done.set_exception(ex)


def _settle(batch: list[_Entry], res: PostEpisodesResponse, rejected: CoordinatorRejected | None) -> None:
    """Give each task of a post its share of the answer; with ``rejected`` (a 409/422), a task with a
    refused or invalid episode gets the rejection, naming its own first error."""
    everyone = frozenset().union(*(e.ids for e in batch))
    for e in batch:
        if e.done.done():
            continue
        share = _share(res, e.ids, everyone)
        if rejected is not None and (share.refused or share.invalid):
            first = share.errors[0] if share.errors else "episodes refused"
            e.done.set_exception(CoordinatorRejected(f"POST /v1/episodes: HTTP {rejected.status}: {first}",
                                                     rejected.status, share.model_dump(exclude={"error"})))
        else:
            e.done.set_result(share)


def _share(res: PostEpisodesResponse, ids: frozenset[str], everyone: frozenset[str]) -> PostEpisodesResponse:
    """The part of a post's result about the episodes ``ids``: their outcomes, and the errors that
    name one of them (an error that names no episode of the post goes to every task in it)."""
    def mine(outcome: list[str]) -> list[str]:
        return [i for i in outcome if i in ids]

    return PostEpisodesResponse.model_construct(
        accepted=mine(res.accepted), duplicate=mine(res.duplicate), stale=mine(res.stale),
        unknown=mine(res.unknown), refused=mine(res.refused),
        invalid=[i for i in res.invalid if i is not None and i in ids],
        errors=[m for m in res.errors if any(repr(i) in m for i in ids) or not any(repr(i) in m for i in everyone)])
