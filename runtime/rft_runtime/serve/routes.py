"""HTTP handlers of the builtin server (aiohttp).

Limits (docs/security-runtime.md): the request body is capped (:func:`max_body_bytes`, a 400 in
vLLM's error shape above it); one request may ask for at most ``max_request_tokens`` generated
tokens over all its choices (``n`` × prompts × ``max_tokens``, after the context budget is applied)
and :data:`MAX_CHOICES` choices; chat templates render in a small thread pool, off the event loop,
within ``render_timeout_s`` (a 400 after it: other requests are served meanwhile). A chat template
supplied by the request (``chat_template`` or ``chat_template_kwargs.chat_template``) is refused
unless the server trusts request templates (``--trust-request-chat-template``, as vLLM), and is then
at most :data:`MAX_TEMPLATE_CHARS` long.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..model.weights_files import unpack_weights_archive
from .errors import APIError, EngineError, WeightLoadError, bad_request, invalid_param, model_not_found
from .metrics import ServeMetrics
from .protocol import (
    DEFAULT_MAX_LOGPROBS,
    GenerationRequest,
    PromptInput,
    SamplingParams,
    check_token_ids,
    get_bool,
    get_int,
    parse_chat,
    parse_completion,
    parse_messages,
    resolve_max_tokens,
)
from .render import chat_body, completion_body
from .stream import Streamer, sse

if TYPE_CHECKING:
    from .engine import Engine
    from .sequence import GenerationResult

log = logging.getLogger(__name__)

VERSION_HEADER = "x-policy-version"
HEALTH_FRESH_S = 2.0  # a successful step this recent proves the engine can generate
RENDER_TIMEOUT_S = 10.0  # one chat-template rendering
RENDER_THREADS = 4  # renderings in flight at once (a runaway trusted template holds one until it ends)
MAX_TEMPLATE_CHARS = 64 * 1024  # a request-supplied chat template
MAX_CHOICES = 1024  # prompts × n of one request
REQUEST_TOKENS_PER_CONTEXT = 64  # default max_request_tokens = this × max_model_len
BODY_BYTES_PER_CONTEXT_TOKEN = 2048


def max_upload_bytes_for(model_dir: str) -> int:
    """The cap on a weights archive: four times the served model's weight files (a trainer's fp32
    master weights of a bf16 model, and room), at least 64 MiB."""
    base = Path(model_dir)
    size = sum(f.stat().st_size for f in base.rglob("*") if f.is_file() and f.suffix in (".safetensors", ".bin")) \
        if base.is_dir() else 0
    return max(64 << 20, 4 * size)


def max_body_bytes(max_model_len: int) -> int:
    """The request body cap: generous for one context of text or token ids (a batch of prompts
    included), between 1 MiB and 64 MiB."""
    return min(64 << 20, max(1 << 20, max_model_len * BODY_BYTES_PER_CONTEXT_TOKEN))


async def read_json(request: web.Request) -> Any:
    """The request body as JSON, or a 400 naming the problem (also for a body over the cap)."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise bad_request(f"The request body is too large: {exc.text}") from None
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"Invalid JSON body: {exc}") from exc


def json_response(body: Any, status: int = 200, version: int | None = None) -> web.Response:
    """A JSON response, with the policy-version header when ``version`` is given."""
    headers = {VERSION_HEADER: str(version)} if version is not None else None
    return web.json_response(body, status=status, headers=headers, dumps=lambda o: json.dumps(o, allow_nan=False))


class ServeRoutes:
    """The routes, bound to one engine and served model name."""

    def __init__(self, engine: Engine, served_model_name: str, metrics: ServeMetrics, *,
                 health_timeout: float = 10.0, max_logprobs: int = DEFAULT_MAX_LOGPROBS,
                 trust_request_chat_template: bool = False, render_timeout_s: float = RENDER_TIMEOUT_S,
                 max_request_tokens: int | None = None, max_upload_bytes: int | None = None):
        self.engine = engine
        self.max_upload_bytes = max_upload_bytes or max_upload_bytes_for(engine.lm.model_dir)
        self.trust_request_chat_template = trust_request_chat_template
        self.render_timeout_s = render_timeout_s
        self.max_request_tokens = max_request_tokens or REQUEST_TOKENS_PER_CONTEXT * engine.lm.max_model_len
        self._render_pool = ThreadPoolExecutor(RENDER_THREADS, thread_name_prefix="rft-chat-template")
        self.name = served_model_name
        self.metrics = metrics
        self.health_timeout = health_timeout
        self.max_logprobs = max_logprobs
        self.codec = engine.lm.codec
        self._update_lock = asyncio.Lock()
        self._probe: asyncio.Task | None = None

    def register(self, app: web.Application) -> None:
        """Add every route to ``app``."""
        r = app.router
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_get("/v1/models", self.models)
        r.add_get("/health", self.health)
        r.add_post("/tokenize", self.tokenize)
        r.add_post("/detokenize", self.detokenize)
        r.add_get("/metrics", self.metrics_route)
        r.add_post("/update_weights_from_disk", self.update_weights_from_disk)
        r.add_post("/update_weights_from_archive", self.update_weights_from_archive)
        r.add_get("/get_policy_version", self.get_policy_version)

        async def close_render_pool(_app: web.Application) -> None:
            self._render_pool.shutdown(wait=False, cancel_futures=True)

        app.on_cleanup.append(close_render_pool)

    # ------------------------------------------------------------------ helpers

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.name:
            raise model_not_found(model, self.name)

    def _expand(self, req: GenerationRequest, field: str) -> tuple[list[list[int]], list[SamplingParams]]:
        """One (prompt, params) pair per choice; choice j of a seeded request uses seed + j (as vLLM)."""
        prompts, params = [], []
        limit = self.engine.lm.max_model_len
        if len(req.prompts) * req.n > MAX_CHOICES:
            raise invalid_param("n", req.n, f"times {len(req.prompts)} prompts must be at most {MAX_CHOICES} choices")
        for p in req.prompts:
            sp = resolve_max_tokens(req.params, len(p.token_ids), limit, field)
            for j in range(req.n):
                prompts.append(p.token_ids)
                params.append(sp if sp.seed is None else replace(sp, seed=sp.seed + j))
        total = sum(sp.max_tokens or 0 for sp in params)
        if total > self.max_request_tokens:
            raise bad_request(f"This request asks for up to {total} generated tokens (n={req.n} × {len(req.prompts)} "
                              f"prompt(s) × max_tokens); the server's limit per request is {self.max_request_tokens}. "
                              "Please reduce n or max_tokens.", "n")
        return prompts, params

    async def _render_chat(self, messages: list[dict], extra: dict[str, Any]) -> list[int]:
        """The chat template applied in the render pool, within the time limit."""
        kwargs = extra.get("chat_template_kwargs") or {}
        template = kwargs.get("chat_template", extra.get("chat_template"))
        if template is not None:
            if not self.trust_request_chat_template:
                raise bad_request("Chat templates supplied by the request are not accepted by this server "
                                  "(start it with --trust-request-chat-template to allow them)", "chat_template")
            if not isinstance(template, str) or len(template) > MAX_TEMPLATE_CHARS:
                raise invalid_param("chat_template", f"<{len(str(template))} chars>",
                                    f"must be a string of at most {MAX_TEMPLATE_CHARS} characters")
            if "chat_template" in extra:
                kwargs = {**kwargs, "chat_template": template}
        args = {k: v for k, v in extra.items() if k != "chat_template"}
        args["chat_template_kwargs"] = kwargs
        loop = asyncio.get_running_loop()
        job = loop.run_in_executor(self._render_pool, functools.partial(self.codec.apply_chat, messages, **args))
        try:
            return await asyncio.wait_for(asyncio.shield(job), self.render_timeout_s)
        except asyncio.TimeoutError:
            raise bad_request(f"Rendering the chat template took longer than {self.render_timeout_s:g} s",
                              "messages") from None

    async def _generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> GenerationResult:
        try:
            return await self.engine.generate(prompts, params)
        except EngineError as exc:
            raise APIError(500, str(exc)) from exc

    async def _stream(self, request: web.Request, req: GenerationRequest, chat: bool) -> web.StreamResponse:
        """Answer with server-sent events as the engine produces tokens (see :mod:`.stream`)."""
        field = "messages" if chat else "prompt"
        prompts, params = self._expand(req, field)
        progress: asyncio.Queue = asyncio.Queue()
        task = asyncio.ensure_future(self.engine.generate(prompts, params, progress=progress))
        streamer = Streamer(req, self.codec, self.name, chat=chat)
        resp: web.StreamResponse | None = None
        try:
            while (item := await progress.get()) is not None:
                version, seqs = item
                if resp is None:  # headers go out once the request runs, with its policy version
                    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                                       "Cache-Control": "no-cache", VERSION_HEADER: str(version)})
                    await resp.prepare(request)
                for chunk in streamer.chunks(seqs):
                    await resp.write(chunk)
            try:
                result = await task
            except EngineError as exc:
                if resp is None:
                    raise APIError(500, str(exc)) from exc
                await resp.write(sse(APIError(500, str(exc)).body()))
                await resp.write(sse("[DONE]"))
                return resp
            if resp is None:
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                                   VERSION_HEADER: str(result.policy_version)})
                await resp.prepare(request)
            final = [(s, len(s.output), s.finish_reason) for s in result.sequences]
            for chunk in streamer.chunks(final) + streamer.tail(result.sequences, result.policy_version):
                await resp.write(chunk)
            await resp.write_eof()
        finally:
            if not task.done():
                task.cancel()
        self.metrics.prompt_tokens.inc(sum(len(p.token_ids) for p in req.prompts))
        return resp

    # ------------------------------------------------------------------ OpenAI routes

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/completions."""
        body = await read_json(request)
        req, raw = parse_completion(body, vocab_size=self.codec.vocab_size, max_logprobs=self.max_logprobs)
        self._check_model(req.model)
        for p in raw:
            if isinstance(p, str):
                req.prompts.append(PromptInput(self.codec.encode(p), p))
            else:
                check_token_ids(p, self.codec.vocab_size)
                req.prompts.append(PromptInput(p))
        if req.stream:
            return await self._stream(request, req, chat=False)
        result = await self._generate(*self._expand(req, "prompt"))
        self.metrics.prompt_tokens.inc(sum(len(p.token_ids) for p in req.prompts))
        return json_response(completion_body(req, result, self.codec, self.name), version=result.policy_version)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions."""
        body = await read_json(request)
        req, messages = parse_chat(body, vocab_size=self.codec.vocab_size, max_logprobs=self.max_logprobs)
        self._check_model(req.model)
        ids = await self._render_chat(messages, req.extra)
        req.prompts.append(PromptInput(ids))
        if req.stream:
            return await self._stream(request, req, chat=True)
        result = await self._generate(*self._expand(req, "messages"))
        self.metrics.prompt_tokens.inc(len(ids))
        return json_response(chat_body(req, result, self.codec, self.name), version=result.policy_version)

    async def models(self, request: web.Request) -> web.Response:
        """GET /v1/models."""
        now = int(time.time())
        card = {
            "id": self.name, "object": "model", "created": now, "owned_by": "rft", "root": self.engine.lm.model_dir,
            "parent": None, "max_model_len": self.engine.lm.max_model_len,
            "permission": [{"id": f"modelperm-{self.name}", "object": "model_permission", "created": now,
                            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                            "organization": "*", "group": None, "is_blocking": False}],
        }
        return json_response({"object": "list", "data": [card]})

    # ------------------------------------------------------------------ health

    async def _probe_once(self) -> None:
        pad = self.engine.lm.pad_token_id
        await self.engine.generate([[pad]], [SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)])

    async def health(self, request: web.Request) -> web.Response:
        """GET /health: 200 only when the engine generated a token within the last seconds or does now."""
        if not self.engine.alive:
            raise APIError(503, "the engine is not running")
        last = self.engine.last_step_ok
        if last is not None and time.monotonic() - last < HEALTH_FRESH_S:
            return web.Response(status=200, text="")
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self._probe_once())
        try:
            await asyncio.wait_for(asyncio.shield(self._probe), self.health_timeout)
        except asyncio.TimeoutError as exc:
            raise APIError(503, f"the engine did not generate a token within {self.health_timeout}s") from exc
        except Exception as exc:  # noqa: BLE001 - any failure to generate is unhealthy
            raise APIError(503, f"the engine cannot generate: {exc}") from exc
        return web.Response(status=200, text="")

    # ------------------------------------------------------------------ tokenizer routes

    async def tokenize(self, request: web.Request) -> web.Response:
        """POST /tokenize with ``prompt`` or chat ``messages``."""
        body = await read_json(request)
        if not isinstance(body, dict):
            raise bad_request("The request body must be a JSON object")
        self._check_model(body.get("model"))
        if "messages" in body:
            messages = parse_messages(body)
            kwargs = body.get("chat_template_kwargs") or {}
            if not isinstance(kwargs, dict):
                raise invalid_param("chat_template_kwargs", kwargs, "must be an object")
            ids = self.codec.apply_chat(
                messages, add_generation_prompt=get_bool(body, "add_generation_prompt", True),
                continue_final_message=get_bool(body, "continue_final_message", False),
                chat_template_kwargs=kwargs, tools=body.get("tools"))
        elif isinstance(body.get("prompt"), str):
            ids = self.codec.encode(body["prompt"], add_special_tokens=get_bool(body, "add_special_tokens", True))
        else:
            raise invalid_param("prompt", body.get("prompt"), "must be a string (or send messages)")
        strs = None
        if get_bool(body, "return_token_strs", False):
            strs = self.codec.tokenizer.convert_ids_to_tokens(ids)
        return json_response({"count": len(ids), "max_model_len": self.engine.lm.max_model_len, "tokens": ids,
                              "token_strs": strs})

    async def detokenize(self, request: web.Request) -> web.Response:
        """POST /detokenize ``{"tokens": [...]}``."""
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("tokens"), list):
            raise invalid_param("tokens", None if not isinstance(body, dict) else body.get("tokens"),
                                "must be a list of token ids")
        self._check_model(body.get("model"))
        ids = body["tokens"]
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise invalid_param("tokens", ids, "must be a list of token ids")
        check_token_ids(ids, self.codec.vocab_size)
        return json_response({"prompt": self.codec.tokenizer.decode(ids)})

    async def metrics_route(self, request: web.Request) -> web.Response:
        """GET /metrics (Prometheus text format)."""
        self.metrics.policy_version.set(self.engine.policy_version)
        self.metrics.set_queue(self.engine.num_running, self.engine.num_waiting)
        resp = web.Response(body=self.metrics.render())
        resp.headers["Content-Type"] = self.metrics.content_type
        return resp

    # ------------------------------------------------------------------ weights

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        """POST /update_weights_from_disk ``{"model_path", "policy_version"?}`` (SGLang's route).

        Loads a full safetensors checkpoint or a PEFT LoRA adapter (merged into the base weights) between
        batches, then sets the policy version (given, or the current one plus one)."""
        body = await read_json(request)
        if not isinstance(body, dict):
            return self._update_failed("The request body must be a JSON object")
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            return self._update_failed("model_path is required (a directory with safetensors weights or a "
                                       "LoRA adapter)")
        try:
            version = get_int(body, "policy_version", None, lo=0)
        except APIError as exc:
            return self._update_failed(exc.message)
        return await self._load(path, version)

    async def _load(self, path: str, version: int | None) -> web.Response:
        """Load the weights at ``path`` between batches and answer as SGLang's update routes."""
        async with self._update_lock:
            return await self._load_locked(path, version)

    async def _load_locked(self, path: str, version: int | None) -> web.Response:
        """:meth:`_load` with the update lock held."""
        try:
            new_version, kind = await self.engine.load_weights(path, version)
        except (WeightLoadError, EngineError, OSError) as exc:
            self.metrics.weight_updates.labels(result="error").inc()
            return self._update_failed(str(exc), status=400 if not isinstance(exc, EngineError) else 500)
        self.metrics.weight_updates.labels(result="ok").inc()
        self.metrics.policy_version.set(new_version)
        log.info("serving policy version %d (%s weights)", new_version, kind)
        return json_response({"success": True, "message": "Succeeded to update model weights.",
                              "num_paused_requests": 0, "policy_version": new_version, "load_format": kind},
                             version=new_version)

    async def update_weights_from_archive(self, request: web.Request) -> web.Response:
        """POST /update_weights_from_archive?policy_version=N, the body a tar archive of a weights
        directory (what ``/update_weights_from_disk`` reads; for a trainer that shares no filesystem
        with this server). The archive is streamed to a temporary directory (at most
        :func:`max_upload_bytes_for` unless the server sets another cap; a 413 above it), unpacked under the
        update lock (an uncompressed tar; its unpacked size under the same cap, checked first) with Python's
        ``data`` filter (no absolute paths, links out of it or devices), loaded as from disk, and deleted."""
        raw = request.query.get("policy_version")
        if raw is not None and not raw.isdigit():
            return self._update_failed(f"policy_version must be a non-negative integer, got {raw[:40]!r}")
        version = None if raw is None else int(raw)
        limit = self.max_upload_bytes
        with tempfile.TemporaryDirectory(prefix="rft-weights-") as tmp:
            archive = Path(tmp) / "upload.tar"
            size = 0
            with archive.open("wb") as f:
                async for chunk in request.content.iter_chunked(1 << 20):
                    size += len(chunk)
                    if size > limit:
                        return self._update_failed(f"The weights archive is larger than the server's cap of {limit} "
                                                   "bytes", status=413)
                    f.write(chunk)
            dest = Path(tmp) / "weights"
            async with self._update_lock:  # one update unpacks at a time: its disk use is bounded once
                try:
                    await asyncio.to_thread(unpack_weights_archive, archive, dest, limit)
                except (tarfile.TarError, OSError, WeightLoadError) as exc:
                    return self._update_failed(f"The body is not a usable tar archive of a weights directory "
                                               f"(uncompressed, one top directory): {exc}")
                return await self._load_locked(str(dest), version)

    def _update_failed(self, message: str, status: int = 400) -> web.Response:
        return json_response({"success": False, "message": message, "policy_version": self.engine.policy_version},
                             status=status)

    async def get_policy_version(self, request: web.Request) -> web.Response:
        """GET /get_policy_version."""
        return json_response({"policy_version": self.engine.policy_version})
