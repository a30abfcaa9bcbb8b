"""Async HTTP client of the coordinator API, with retries (connection errors, 425/429/5xx).

Each answer is parsed once into its message (:mod:`rft_runtime.coordinator.wire`): the rollout worker
holds a :class:`~rft_runtime.coordinator.wire.LeaseResponse` and its typed grants, never the JSON. An
answer that does not fit its message (a coordinator of another version) raises
:class:`CoordinatorProtocolError`. Requests are the same messages, sent as they are: the coordinator
checks them (a 400 names the field).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from typing import Any, Callable, Iterable, TypeVar

import aiohttp

from .. import auth
from ..coordinator.wire import (
    CoordinatorStatus,
    ErrorBody,
    LeaseRequest,
    LeaseResponse,
    PostEpisodesRequest,
    PostEpisodesResponse,
    ReleaseRequest,
    ReleaseResponse,
    Wire,
    WireError,
)
from ..timeouts import LazySession, session_timeout

log = logging.getLogger(__name__)

RETRYABLE = (425, 429)


class CoordinatorUnavailable(ConnectionError):
    """The coordinator did not answer within the retry deadline."""


W = TypeVar("W", bound=Wire)


class CoordinatorProtocolError(RuntimeError):
    """The coordinator's answer does not fit the API's message (the message names the field)."""


class CoordinatorRejected(RuntimeError):
    """The coordinator answered 4xx: the request itself is wrong (message from the server). ``body``:
    the answer's JSON object (an episode post refused in part carries every episode's outcome: a
    :class:`~rft_runtime.coordinator.wire.PostEpisodesResponse`)."""

    def __init__(self, message: str, status: int = 400, body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class CoordinatorClient:
    """Calls ``/v1/lease``, ``/v1/episodes``, ``/v1/release`` and ``/v1/status``.

    Retries with capped exponential backoff for ``deadline_s`` (a trainer restarting between two
    of its steps is ridden out) unless ``should_stop()`` turns true; posting the same episodes twice
    is harmless (idempotent).
    """

    def __init__(self, base_url: str, *, deadline_s: float = 300.0, attempt_timeout_s: float = 60.0,
                 should_stop: Callable[[], bool] = lambda: False, token: str | None = None) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"coordinator URL must be http(s)://..., got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.deadline_s = deadline_s
        self.attempt_timeout_s = attempt_timeout_s
        # the job's token (``token``, else $RFT_JOB_TOKEN)
        self._http = LazySession([self.base_url], auth.client_headers(token), total_s=attempt_timeout_s)
        self._rng = random.Random()
        self._should_stop = should_stop

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> "CoordinatorClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(self, method: str, path: str, answer: type[W], body: Wire | bytes | None = None,
                    wait_s: float = 0.0) -> W:
        """The 200 answer as ``answer``. ``body``: a message, or one already encoded (bytes). ``wait_s``:
        how long the server may hold the answer (a long-polled lease), added to each attempt's time limit."""
        deadline = time.monotonic() + self.deadline_s
        data = body.json_bytes() if isinstance(body, Wire) else body
        kw: dict[str, Any] = {"data": data, "headers": {"content-type": "application/json"}} if data is not None else {}
        if wait_s:
            kw["timeout"] = session_timeout(self.attempt_timeout_s + wait_s)
        http = self._http.get()
        attempt = 0
        while True:
            attempt += 1
            try:
                async with http.request(method, self.base_url + path, **kw) as resp:
                    status, text = resp.status, (await resp.read()).decode("utf-8", "replace")
                if status == 200:
                    return _parse(answer, text, f"{method} {path}")
                if status < 500 and status not in RETRYABLE:
                    try:
                        decoded = json.loads(text)
                    except ValueError:
                        decoded = None
                    try:
                        msg = ErrorBody.parse(decoded).error.message
                    except WireError:
                        msg = text
                    raise CoordinatorRejected(f"{method} {path}: HTTP {status}: {msg}", status,
                                              decoded if isinstance(decoded, dict) else None)
                last = f"HTTP {status}"
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                last = f"{type(e).__name__}: {e}"
            delay = min(5.0, 0.2 * 2 ** (attempt - 1)) * (0.5 + 0.5 * self._rng.random())
            if time.monotonic() + delay > deadline or self._should_stop():
                raise CoordinatorUnavailable(
                    f"{method} {self.base_url}{path} failed after {attempt} attempts: {last}")
            log.debug("coordinator %s %s: %s; retrying in %.2fs", method, path, last, delay)
            await asyncio.sleep(delay)

    async def lease(self, worker_id: str, max_tasks: int, wait_s: float = 0.0) -> LeaseResponse:
        """Lease up to ``max_tasks`` tasks; with none to grant, the coordinator holds the answer up to
        ``wait_s`` seconds for one (a long poll; see :mod:`rft_runtime.coordinator.http`)."""
        ask = LeaseRequest.model_construct(worker_id=worker_id, max_tasks=max_tasks, wait_s=float(wait_s))
        return await self._call("POST", "/v1/lease", LeaseResponse, ask, wait_s=wait_s)

    async def post_episodes(self, worker_id: str, episodes: Iterable[dict[str, Any]],
                            lease_ids: Iterable[str]) -> PostEpisodesResponse:
        """Post episodes (JSON form) of the leases ``lease_ids`` this worker holds; idempotent by
        episode id."""
        encoded = b",".join(json.dumps(ep, separators=(",", ":")).encode() for ep in episodes)
        return await self.post_episodes_json(worker_id, lease_ids, encoded)

    async def post_episodes_json(self, worker_id: str, lease_ids: Iterable[str],
                                 episodes: bytes) -> PostEpisodesResponse:
        """:meth:`post_episodes` of episodes already encoded: ``episodes`` is their JSON objects joined by
        commas (what :class:`~rft_runtime.rollout.posting.EpisodePoster` coalesces); the envelope is the
        message's JSON, the episodes are spliced in as they are."""
        envelope = PostEpisodesRequest.model_construct(worker_id=worker_id, episodes=[], lease_ids=list(lease_ids))
        head = envelope.model_dump_json(exclude={"episodes"}).encode()
        return await self._call("POST", "/v1/episodes", PostEpisodesResponse,
                                head[:-1] + b',"episodes":[' + episodes + b"]}")

    async def release(self, lease_ids: Iterable[str], reason: str = "") -> int:
        """Give leases back for immediate re-issue; returns how many were live."""
        give = ReleaseRequest.model_construct(lease_ids=list(lease_ids), reason=reason)
        return (await self._call("POST", "/v1/release", ReleaseResponse, give)).released

    async def status(self) -> CoordinatorStatus:
        """The coordinator status."""
        return await self._call("GET", "/v1/status", CoordinatorStatus)


def _parse(answer: type[W], text: str, what: str) -> W:
    try:
        return answer.parse(json.loads(text))
    except ValueError as e:  # WireError, or not JSON at all
        raise CoordinatorProtocolError(f"{what}: the coordinator's answer is not a {answer.__name__}: {e}") from None
