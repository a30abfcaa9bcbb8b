"""The coordinator's HTTP API (contract 4 in docs/architecture.md), a thin aiohttp layer over the service.

Routes (JSON in, JSON out; errors are ``{"error": {"message", "field"}}`` with status 400):

* ``POST /v1/lease`` ``{"worker_id": str, "max_tasks": int}`` (capped at ``max_lease_tasks``) → ``{"done", "policy_version",
  "lease_timeout_s", "tasks": [{"lease_id", "task_key", "task", "n", "seed", "sampling",
  "policy_version", "purpose", "deadline_in_s"}]}``
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


def create_app(service: CoordinatorService, metrics_registry: Any = None, *, token: str | None = None) -> web.Application:
    """The aiohttp application serving ``service`` (and ``/metrics`` from a prometheus registry);
    ``token``: the job token its data-plane routes require (None: open, see :mod:`rft_runtime.auth`)."""
    app = web.Application(client_max_size=max_body_bytes(service.config), middlewares=[auth.middleware(token)])

    async def lease(request: web.Request) -> web.Response:
        body = await _body(request)
        wid = _worker_id(body)
        if isinstance(wid, web.Response):
            return wid
        max_tasks = body.get("max_tasks", 1)
        if isinstance(max_tasks, bool) or not isinstance(max_tasks, int) or max_tasks < 1:
            return _error("max_tasks must be an integer >= 1", "max_tasks")
        return web.json_response(service.lease(wid, max_tasks))

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
