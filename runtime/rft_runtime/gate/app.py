"""The gate's aiohttp application (see the package docstring for what it does and why)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from .. import auth
from ..model.weights_files import current_published
from .extension import RELOAD_METHOD

log = logging.getLogger("rft.gate")

UNPUBLISHED = -1
"""The policy version reported until a published one is loaded: never one the trainer grants, so it
loads the current version and rollouts refuse the samples meanwhile (as the builtin server)."""
VERSION_HEADER = "x-policy-version"
FORWARDED_PREFIXES = ("/v1/",)
FORWARDED_PATHS = frozenset({"/tokenize", "/detokenize", "/version"})
"""What the gate forwards to vLLM (with the token); every other path answers 404."""
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                         "trailers", "transfer-encoding", "upgrade", "host", "content-length"})
MAX_BODY_BYTES = 64 << 20
"""The largest request body forwarded (token-id prompts of long contexts, n samples, a chat history)."""

_READY_TASK = web.AppKey("ready_task", asyncio.Task)


class UpstreamError(RuntimeError):
    """vLLM refused or failed a control call (the message names the route and its answer). ``answered``:
    vLLM answered with an error (a failure that repeats: weights it cannot load, a worker without the gate's
    extension), rather than not answering at all (a restart, a crash: worth retrying)."""

    def __init__(self, message: str, answered: bool) -> None:
        super().__init__(message)
        self.answered = answered


def forwarded(path: str) -> bool:
    """Whether the gate forwards ``path`` to vLLM."""
    return path in FORWARDED_PATHS or path.startswith(FORWARDED_PREFIXES)


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    """An OpenAI-shaped error body (what clients of vLLM parse)."""
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": status}},
                             status=status)


class Gate:
    """Forwards the job's requests to vLLM at ``upstream`` and, with ``weights_dir`` (full-weight sync),
    loads each published policy version into it between requests.

    ``drain_timeout_s``: how long an update lets the requests in flight finish before vLLM aborts them;
    ``reload_timeout_s``: the longest a reload may take."""

    def __init__(self, upstream: str, *, weights_dir: str | Path | None = None, drain_timeout_s: float = 120.0,
                 reload_timeout_s: float = 600.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.weights_dir = Path(weights_dir) if weights_dir is not None else None
        self.drain_timeout_s = drain_timeout_s
        self.reload_timeout_s = reload_timeout_s
        self.version: int | None = UNPUBLISHED if self.weights_dir is not None else None
        """The policy version vLLM serves (None: the gate does not track versions, e.g. LoRA adapters)."""
        self.ready = False
        """vLLM answered and the current published version (if any) is loaded."""
        self.broken: str | None = None
        """Why vLLM's weights are unusable (a reload it failed part-way): only a restart of vLLM repairs it, which
        the inference pod's liveness probe (``/health?probe=liveness``) asks of the kubelet."""
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._inflight = 0
        self._loads = 0  # reloads started: a weight version read across one is not compared
        self._update_lock = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the gate is not started")
        return self._session

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def watch(self, period_s: float = 1.0) -> None:
        """Follow vLLM for the gate's lifetime: once it answers ``/health``, load the version the trainer last
        published and be ready; when it stops answering (its container restarted: it comes back with the base
        weights) or reports a weight version other than the one loaded, serve nothing until it is back and the
        current version is loaded again. Runs as a task of the application."""
        while True:
            if not await self._upstream_healthy():
                self._lost("vLLM does not answer /health")
            elif not self.ready:
                if not self.broken:  # broken: only a restart of vLLM (seen above as unhealthy) helps
                    await self._load_current()
            elif self.version is not None and self.version >= 0 and not self._update_lock.locked():
                loads = self._loads
                reported = await self._weight_version()
                if reported is not None and reported != str(self.version) and loads == self._loads \
                        and not self._update_lock.locked():
                    self._lost(f"vLLM reports weight version {reported!r}, the gate loaded {self.version}")
            await asyncio.sleep(period_s)

    def _lost(self, why: str) -> None:
        """vLLM lost the weights the gate loaded (or never had them): not ready, no version, until reloaded."""
        if self.ready:
            log.warning("%s: not ready until vLLM is back and the current policy version is loaded", why)
        self.ready = False
        self.broken = None  # a restarted vLLM can load weights again
        if self.version is not None:
            self.version = UNPUBLISHED

    async def _load_current(self) -> None:
        """Load the version the trainer last published (if any) and become ready; log and stay not ready
        when vLLM refuses it (the next round tries again, maybe with a newer version)."""
        current = current_published(self.weights_dir) if self.weights_dir is not None else None
        if current is not None:
            version, path = current
            try:
                async with self._update_lock:
                    await self._reload(str(path), version)
            except UpstreamError as exc:
                log.error("could not load the current policy version %d from %s: %s", version, path, exc)
                if exc.answered:
                    self.broken = f"vLLM failed to load policy version {version}: {exc}"
                return
            log.info("loaded the current policy version %d from %s", version, path)
        self.ready = True
        log.info("vLLM at %s is ready behind the gate (policy version %s)", self.upstream, self.version)

    async def _weight_version(self) -> str | None:
        try:
            async with self.session.get(self.upstream + "/weight_info", timeout=aiohttp.ClientTimeout(total=10)) as r:
                return str((await r.json()).get("weight_version")) if r.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None

    async def _upstream_healthy(self) -> bool:
        try:
            async with self.session.get(self.upstream + "/health", timeout=aiohttp.ClientTimeout(total=10)) as r:
                return r.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False

    # ------------------------------------------------------------------ routes

    async def health(self, request: web.Request) -> web.Response:
        """Readiness: vLLM answers and serves the current version. ``?probe=liveness``: whether vLLM can still
        load weights (500 after a reload it failed part-way: restart it)."""
        if request.query.get("probe") == "liveness":
            if self.broken:
                return web.json_response({"status": "broken", "reason": self.broken}, status=500)
            return web.json_response({"status": "alive"})
        if self.broken:
            return web.json_response({"status": "broken", "reason": self.broken}, status=503)
        if self.ready and await self._upstream_healthy():
            return web.json_response({"status": "ok", "policy_version": self.version})
        return web.json_response({"status": "starting" if not self.ready else "vLLM is not healthy"}, status=503)

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        return await self._pass(request, "/metrics")

    async def get_policy_version(self, request: web.Request) -> web.Response:
        if self.version is None:
            return _error(404, "this gate serves LoRA adapters: the versions are the adapters /v1/models lists",
                          "NotFoundError")
        return web.json_response({"policy_version": self.version})

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        """``POST /update_weights_from_disk {"model_path", "policy_version"}`` (the builtin server's route)."""
        if self.weights_dir is None:
            return _error(404, "this gate does not load full weights (inference.weightSync is not disk)",
                          "NotFoundError")
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return self._update_failed("the request body is not JSON")
        if not isinstance(body, dict):
            return self._update_failed("the request body must be a JSON object")
        version = body.get("policy_version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            return self._update_failed(f"policy_version must be an integer >= 0, got {version!r}")
        try:
            path = self._confined(body.get("model_path"))
        except ValueError as exc:
            return self._update_failed(str(exc))
        if not self.ready:
            why = self.broken or "vLLM is starting or restarting; it loads the current version before it is ready"
            return self._update_failed(why, status=503)
        async with self._update_lock:
            self._open.clear()  # new requests wait at the gate from here on
            try:
                await self._drain()
                await self._reload(str(path), version)
            except UpstreamError as exc:  # an answered failure fails the publication; no answer is retried
                if exc.answered:
                    self.broken = f"vLLM failed to load policy version {version}: {exc}"
                    self.ready = False
                return self._update_failed(f"vLLM did not take policy version {version}: {exc}",
                                           status=400 if exc.answered else 503)
            finally:
                self._open.set()
        log.info("serving policy version %d from %s", version, path)
        return web.json_response({"success": True, "message": "Succeeded to update model weights.",
                                  "policy_version": version, "load_format": "full"},
                                 headers={VERSION_HEADER: str(version)})

    def _update_failed(self, message: str, status: int = 400) -> web.Response:
        return web.json_response({"success": False, "message": message, "policy_version": self.version},
                                 status=status)

    def _confined(self, model_path: Any) -> Path:
        """``model_path`` as a directory inside the weights directory (the trainer's publications), else
        ValueError: the gate never makes vLLM read anything else."""
        assert self.weights_dir is not None
        if not isinstance(model_path, str) or not model_path:
            raise ValueError("model_path is required (a published policy version's directory)")
        root = os.path.realpath(self.weights_dir)
        real = os.path.realpath(model_path)
        if os.path.commonpath([root, real]) != root or real == root:
            raise ValueError(f"model_path {model_path!r} is not a policy version under {self.weights_dir}")
        if not os.path.isdir(real):
            raise ValueError(f"model_path {model_path!r} is not a directory")
        return Path(real)

    # ------------------------------------------------------------------ weights

    async def _drain(self) -> None:
        """Wait until no request is in flight; past the drain timeout, have vLLM abort them (their clients
        see an aborted completion and retry it)."""
        try:
            await asyncio.wait_for(self._idle.wait(), self.drain_timeout_s)
            return
        except asyncio.TimeoutError:
            log.warning("%d request(s) still in flight after %.0f s: aborting them for the weight update",
                        self._inflight, self.drain_timeout_s)
        await self._control("POST", "/pause?mode=abort")
        try:
            await asyncio.wait_for(self._idle.wait(), 60.0)
        finally:
            await self._control("POST", "/resume")

    async def _reload(self, path: str, version: int) -> None:
        """Reload vLLM's weights in place from ``path`` and make ``version`` the one served. A reload that
        fails leaves the weights unknown: the gate reports :data:`UNPUBLISHED` until one succeeds."""
        self.version = UNPUBLISHED
        self._loads += 1
        await self._control("POST", "/collective_rpc", {"method": RELOAD_METHOD, "kwargs": {"weights_path": path},
                                                        "timeout": self.reload_timeout_s})
        # the KV blocks cached for shared prefixes were computed with the old weights
        await self._control("POST", "/reset_prefix_cache")
        await self._control("POST", "/update_weight_version", {"new_version": str(version)})
        self.version = version

    async def _control(self, method: str, route: str, body: dict[str, Any] | None = None) -> Any:
        try:
            async with self.session.request(method, self.upstream + route, json=body,
                                            headers=auth.client_headers()) as r:
                text = await r.text()
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"{method} {route}: {type(exc).__name__}: {exc}", answered=False) from exc
        if r.status != 200:
            raise UpstreamError(f"{method} {route}: HTTP {r.status}: {text[:500]}", answered=True)
        try:
            return json.loads(text) if text else None
        except ValueError:
            return text

    # ------------------------------------------------------------------ forwarding

    async def forward(self, request: web.Request) -> web.StreamResponse:
        if not forwarded(request.path):
            return _error(404, f"{request.path} is not served here", "NotFoundError")
        while not self._open.is_set():  # a weight update is draining or loading: wait for the new version
            await self._open.wait()
        if not self.ready:  # rollouts retry a 503 (elsewhere, or here once ready)
            return _error(503, self.broken or "the replica is not ready: vLLM is starting or loading the current "
                          "policy version", "ServiceUnavailableError")
        return await self._pass(request, request.path_qs, counted=True)

    async def _pass(self, request: web.Request, target: str, counted: bool = False) -> web.StreamResponse:
        """Send ``request`` to vLLM's ``target`` and stream its answer back, stamped with the policy version
        that the whole request ran on (no update starts while a counted request is in flight)."""
        if counted:
            self._inflight += 1
            self._idle.clear()
        version = self.version
        try:
            body = await request.read()
            headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
            async with self.session.request(request.method, self.upstream + target, data=body or None,
                                            headers=headers) as up:
                resp = web.StreamResponse(status=up.status, headers={
                    k: v for k, v in up.headers.items() if k.lower() not in _HOP_BY_HOP})
                if version is not None:
                    resp.headers[VERSION_HEADER] = str(version)
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except aiohttp.ClientError as exc:
            return _error(502, f"vLLM did not answer: {type(exc).__name__}", "BadGatewayError")
        finally:
            if counted:
                self._inflight -= 1
                if self._inflight == 0:
                    self._idle.set()


def create_app(gate: Gate, token: str | None) -> web.Application:
    """The gate's application: the job token on every route but ``/health`` and ``/metrics``."""
    app = web.Application(middlewares=[auth.middleware(token)], client_max_size=MAX_BODY_BYTES)
    app.router.add_get("/health", gate.health)
    app.router.add_get("/metrics", gate.metrics)
    app.router.add_get("/get_policy_version", gate.get_policy_version)
    app.router.add_post("/update_weights_from_disk", gate.update_weights_from_disk)
    app.router.add_route("*", "/{tail:.*}", gate.forward)

    async def on_startup(_app: web.Application) -> None:
        await gate.start()
        _app[_READY_TASK] = asyncio.create_task(gate.watch())

    async def on_cleanup(_app: web.Application) -> None:
        task = _app.get(_READY_TASK)
        if task is not None and not task.done():
            task.cancel()
        await gate.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
