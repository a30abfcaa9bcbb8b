"""The coordinator's HTTP API (contract 4 in docs/architecture.md), a thin aiohttp layer over the service.

Routes (JSON in, JSON out; errors are ``{"error": {"message", "field"}}`` with status 400):

* ``POST /v1/lease`` ``{"worker_id": str, "max_tasks": int, "wait_s": number}`` (``max_tasks`` capped at
  ``max_lease_tasks``) → ``{"done", "policy_version", "lease_timeout_s", "tasks": [{"lease_id", "task_key",
  "task", "n", "seed", "sampling", "policy_version", "purpose", "deadline_in_s"}]}``. ``wait_s`` (default 0,
  at most :data:`MAX_LEASE_WAIT_S`) long-polls: with no task to grant, the answer waits until one is (tasks
  submitted, given back or re-queued), the run is done, or ``wait_s`` passed, whichever is first; a
  worker then hears of new work at once instead of at its next poll.
* ``POST /v1/episodes`` ``{"worker_id": str, "lease_ids": [str], "episodes": [episode...]}`` →
  ``{"accepted": [ids], "duplicate": [...], "stale": [...], "unknown": [...], "refused": [...],
  "invalid": [...], "errors": [str]}``; idempotent by episode id. ``lease_ids`` are the leases the
  poster holds (the proof of holding them). Status 200 when nothing was refused or invalid; else
  409 (an episode without the poster's live lease) or 422 (an invalid or poisoned episode) with the
  same body plus ``error`` naming the first problem — episodes accepted in the same post stay
  accepted. Bodies are capped (:func:`~rft_runtime.coordinator.core.max_body_bytes`: 413 above)
  and must be strict JSON (no NaN/Infinity).
* ``POST /v1/release`` ``{"lease_ids": [str], "reason": str}`` → ``{"released": int}``
* ``GET /v1/status`` → the coordinator status (version, mode, queue sizes, counters)
* ``GET /health`` → ``{"ok": true}``; ``GET /metrics`` → Prometheus text (when a registry is given)

Every route but ``/health`` and ``/metrics`` requires the job's token (:mod:`rft_runtime.auth`): 401
without it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from .. import auth
from .core import max_body_bytes
from .service import CoordinatorService


def _error(message: str, field: str | None = None, status: int = 400) -> web.Response:
    return web.json_response({"error": {"message": message, "field": field}}, status=status)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (numbers must be finite)")


def _finite_float(text: str) -> float:
    v = float(text)
    if v in (float("inf"), float("-inf")):
        raise ValueError(f"{text} overflows a float (numbers must be finite)")
    return v


def _strict_loads(text: str) -> Any:
    return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json(loads=_strict_loads)
    except (ValueError, UnicodeDecodeError) as e:
        raise web.HTTPBadRequest(text=json.dumps({"error": {"message": f"body is not JSON: {e}", "field": None}}),
                                 content_type="application/json") from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text=json.dumps({"error": {"message": "body must be a JSON object",
                                                            "field": None}}), content_type="application/json")
    return body


def _worker_id(body: dict[str, Any]) -> str | web.Response:
    wid = body.get("worker_id")
    if not isinstance(wid, str) or not wid:
        return _error("worker_id must be a non-empty string", "worker_id")
    return wid


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


MAX_LEASE_WAIT_S = 60.0
"""The longest ``wait_s`` a lease may ask for."""
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
        body = await _body(request)
        wid = _worker_id(body)
        if isinstance(wid, web.Response):
            return wid
        max_tasks = body.get("max_tasks", 1)
        if isinstance(max_tasks, bool) or not isinstance(max_tasks, int) or max_tasks < 1:
            return _error("max_tasks must be an integer >= 1", "max_tasks")
        wait_s = body.get("wait_s", 0)
        if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not 0 <= wait_s <= MAX_LEASE_WAIT_S:
            return _error(f"wait_s must be a number of seconds from 0 to {MAX_LEASE_WAIT_S:g}", "wait_s")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            event = changes.event  # before asking: a change from now on sets this one
            out = service.lease(wid, max_tasks)
            left = deadline - loop.time()
            if out["tasks"] or out["done"] or left <= 0 or changes.closing or event is None:
                return web.json_response(out)
            await changes.wait(event, min(left, LEASE_RECHECK_S))

    async def episodes(request: web.Request) -> web.Response:
        body = await _body(request)
        wid = _worker_id(body)
        if isinstance(wid, web.Response):
            return wid
        eps = body.get("episodes")
        if not isinstance(eps, list):
            return _error("episodes must be a list of episode objects", "episodes")
        held = body.get("lease_ids")
        if not isinstance(held, list) or not all(isinstance(i, str) for i in held):
            return _error("lease_ids must be the list of lease ids the poster holds", "lease_ids")
        result = service.post_episodes(wid, eps, held)
        if result["refused"] or result["invalid"]:
            result["error"] = {"message": result["errors"][0] if result["errors"] else "episodes refused",
                               "field": "episodes"}
            return web.json_response(result, status=409 if result["refused"] else 422)
        return web.json_response(result)

    async def release(request: web.Request) -> web.Response:
        body = await _body(request)
        ids = body.get("lease_ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            return _error("lease_ids must be a list of strings", "lease_ids")
        reason = body.get("reason", "")
        return web.json_response({"released": service.release(ids, str(reason))})

    async def status(request: web.Request) -> web.Response:
        return web.json_response(service.status())

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

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
