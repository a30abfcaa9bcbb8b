"""The coordinator's HTTP API (contract 4 in docs/architecture.md), a thin aiohttp layer over the service.

Each request body is parsed once into its message (:mod:`.wire`), each answer is the service's message
as JSON. Routes (JSON in, JSON out; errors are ``{"error": {"message", "field"}}`` with status 400,
the field named by the message's model):

* ``POST /v1/lease`` ``{"worker_id": str, "max_tasks": int, "wait_s": number}`` (``max_tasks`` capped at
  ``max_lease_tasks``) → ``{"done", "finished", "policy_version", "lease_timeout_s", "tasks": [{"lease_id",
  "task_key", "task", "n", "seed", "sampling", "policy_version", "purpose", "deadline_in_s"}]}``
  (:class:`~.wire.LeaseRequest` → :class:`~.wire.LeaseResponse`). ``wait_s`` (default 0,
  at most :data:`MAX_LEASE_WAIT_S`) long-polls: with no task to grant, the answer waits until one is (tasks
  submitted, given back or re-queued), the run is done, or ``wait_s`` passed, whichever is first; a
  worker then hears of new work at once instead of at its next poll.
* ``POST /v1/episodes`` ``{"worker_id": str, "lease_ids": [str], "episodes": [episode...]}`` →
  ``{"accepted": [ids], "duplicate": [...], "stale": [...], "unknown": [...], "refused": [...],
  "invalid": [...], "errors": [str]}`` (:class:`~.wire.PostEpisodesRequest` →
  :class:`~.wire.PostEpisodesResponse`; the episodes themselves are checked one by one by the
  coordinator, see :mod:`.episodes`); idempotent by episode id. ``lease_ids`` are the leases the
  poster holds (the proof of holding them). Status 200 when nothing was refused or invalid; else
  409 (an episode without the poster's live lease) or 422 (an invalid or poisoned episode) with the
  same body plus ``error`` naming the first problem — episodes accepted in the same post stay
  accepted. Bodies are capped (:func:`~rft_runtime.coordinator.core.max_body_bytes`: 413 above)
  and must be strict JSON (no NaN/Infinity).
* ``POST /v1/release`` ``{"lease_ids": [str], "reason": str}`` → ``{"released": int}``
  (:class:`~.wire.ReleaseRequest` → :class:`~.wire.ReleaseResponse`)
* ``GET /v1/status`` → the coordinator status (version, mode, queue sizes, counters:
  :class:`~.wire.CoordinatorStatus`)
* ``GET /health`` → ``{"ok": true}``; ``GET /metrics`` → Prometheus text (when a registry is given)

Every route but ``/health`` and ``/metrics`` requires the job's token (:mod:`rft_runtime.auth`): 401
without it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

from aiohttp import web

from .. import auth
from .core import max_body_bytes
from .service import CoordinatorService
from .wire import (
    MAX_LEASE_WAIT_S,
    ErrorBody,
    ErrorDetail,
    Health,
    LeaseRequest,
    PostEpisodesRequest,
    ReleaseRequest,
    ReleaseResponse,
    Wire,
    WireError,
)

__all__ = ["LEASE_RECHECK_S", "MAX_LEASE_WAIT_S", "create_app"]

W = TypeVar("W", bound=Wire)


def _answer(message: Wire, status: int = 200) -> web.Response:
    return web.Response(body=message.json_bytes(), status=status, content_type="application/json")


def _bad_request(message: str, field: str | None) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=ErrorBody(error=ErrorDetail(message=message, field=field)).model_dump_json(),
                              content_type="application/json")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (numbers must be finite)")


def _finite_float(text: str) -> float:
    v = float(text)
    if v in (float("inf"), float("-inf")):
        raise ValueError(f"{text} overflows a float (numbers must be finite)")
    return v


def _strict_loads(text: str) -> Any:
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)


async def _parse(request: web.Request, message: type[W]) -> W:
    """The request's body as ``message``; a body that is not strict JSON, or does not fit, is answered 400
    naming the field."""
    try:
        body = await request.json(loads=_strict_loads)
    except (ValueError, UnicodeDecodeError) as e:
        raise _bad_request(f"body is not JSON: {e}", None) from None
    try:
        return message.parse(body)
    except WireError as e:
        raise _bad_request(str(e), e.field) from None


class _Changes:
    """Wakes the leases long-polling in the server's event loop when the service changes (any thread)."""

    def __init__(self, service: CoordinatorService) -> None:
        self.service = service
        self.loop: asyncio.AbstractEventLoop | None = None
        self.event: asyncio.Event | None = None
        self.closing = False

    async def start(self, app: web.Application) -> None:
        self.loop, self.event = asyncio.get_running_loop(), asyncio.Event()
        self.service.add_listener(self.changed)

    async def stop(self, app: web.Application) -> None:
        self.service.remove_listener(self.changed)
        self.closing = True
        self._wake()

    def changed(self) -> None:
        if self.loop is not None:
            try:
                self.loop.call_soon_threadsafe(self._wake)
            except RuntimeError:  # the server's loop closed meanwhile: nobody waits any more
                pass

    def _wake(self) -> None:
        # every waiter holds the event of its generation; a fresh one for those that start waiting now
        if self.event is not None:
            ev, self.event = self.event, asyncio.Event()
            ev.set()

    async def wait(self, event: asyncio.Event, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass


LEASE_RECHECK_S = 1.0
"""A waiting lease asks the coordinator again at least this often: leases that expired (the one change
no call makes) are re-issued to a waiting worker within this time."""


def create_app(service: CoordinatorService, metrics_registry: Any = None, *, token: str | None = None) -> web.Application:
    """The aiohttp application serving ``service`` (and ``/metrics`` from a prometheus registry);
    ``token``: the job token its data-plane routes require (None: open, see :mod:`rft_runtime.auth`)."""
    app = web.Application(client_max_size=max_body_bytes(service.config), middlewares=[auth.middleware(token)])
    changes = _Changes(service)
    app.on_startup.append(changes.start)
    app.on_shutdown.append(changes.stop)

    async def lease(request: web.Request) -> web.Response:
        ask = await _parse(request, LeaseRequest)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ask.wait_s
        while True:
            event = changes.event  # before asking: a change from now on sets this one
            out = service.lease(ask.worker_id, ask.max_tasks)
            left = deadline - loop.time()
            if out.tasks or out.done or left <= 0 or changes.closing or event is None:
                return _answer(out)
            await changes.wait(event, min(left, LEASE_RECHECK_S))

    async def episodes(request: web.Request) -> web.Response:
        post = await _parse(request, PostEpisodesRequest)
        result = service.post_episodes(post.worker_id, post.episodes, post.lease_ids)
        if result.refused or result.invalid:
            first = ErrorDetail(message=result.errors[0] if result.errors else "episodes refused", field="episodes")
            return _answer(result.model_copy(update={"error": first}), status=409 if result.refused else 422)
        return _answer(result)

    async def release(request: web.Request) -> web.Response:
        give = await _parse(request, ReleaseRequest)
        return _answer(ReleaseResponse(released=service.release(give.lease_ids, give.reason)))

    async def status(request: web.Request) -> web.Response:
        return _answer(service.status())

    async def health(request: web.Request) -> web.Response:
        return _answer(Health())

    app.router.add_post("/v1/lease", lease)
    app.router.add_post("/v1/episodes", episodes)
    app.router.add_post("/v1/release", release)
    app.router.add_get("/v1/status", status)
    app.router.add_get("/health", health)
    if metrics_registry is not None:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        async def metrics(request: web.Request) -> web.Response:
            return web.Response(body=generate_latest(metrics_registry),
                                headers={"Content-Type": CONTENT_TYPE_LATEST})

        app.router.add_get("/metrics", metrics)
    return app
