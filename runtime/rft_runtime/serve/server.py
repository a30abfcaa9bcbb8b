"""The builtin server's app factory and CLI: ``rft serve --model DIR --host H --port P``.

Every route but ``/health`` and ``/metrics`` (generation, tokenization, model list, weight loading)
requires the job's token (:mod:`rft_runtime.auth`); without ``$RFT_JOB_TOKEN`` the CLI refuses to
start on a cluster.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from aiohttp import web

from .. import auth
from ..model.weights_files import current_published
from .errors import APIError
from .metrics import ServeMetrics
from .routes import VERSION_HEADER, ServeRoutes, max_body_bytes

if TYPE_CHECKING:
    from aiohttp.typedefs import Middleware

    from .engine import Engine

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

UNPUBLISHED = -1
"""The policy version ``rft serve --weights-dir`` reports until it serves a published one: never a
version the trainer grants, so its samples are refused and the trainer loads the current version."""


def _error_middleware(metrics: ServeMetrics, engine: Engine) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        start = time.perf_counter()
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
        try:
            resp = await handler(request)
        except APIError as exc:
            resp = web.json_response(exc.body(), status=exc.status)
        except web.HTTPNotFound:
            resp = web.json_response({"detail": "Not Found"}, status=404)
        except web.HTTPMethodNotAllowed:
            resp = web.json_response({"detail": "Method Not Allowed"}, status=405)
        except web.HTTPException:
            raise
        except Exception as exc:  # noqa: BLE001 - answer 500 with vLLM's body instead of a bare traceback
            log.exception("unhandled error on %s", request.path)
            resp = web.json_response(APIError(500, f"{type(exc).__name__}: {exc}").body(), status=500)
        if VERSION_HEADER not in resp.headers:
            resp.headers[VERSION_HEADER] = str(engine.policy_version)
        metrics.observe_request(route, resp.status, time.perf_counter() - start)
        return resp

    return middleware


def create_app(engine: Engine, served_model_name: str, *, health_timeout: float = 10.0,
               stop_engine_on_cleanup: bool = False, token: str | None = None,
               weights_dir: str | Path | None = None, **limits: Any) -> web.Application:
    """The aiohttp application serving ``engine`` as ``served_model_name``.

    The engine thread starts with the app; it stops with the app only if ``stop_engine_on_cleanup``.
    ``token``: the job token every route but ``/health`` and ``/metrics`` requires (None: open).
    ``weights_dir``: where the trainer publishes policy versions; the version it last published to
    every replica (:func:`current_published`) is loaded before the server accepts a connection, so
    a replica that starts or restarts is Ready only once it serves the current policy.
    ``limits`` go to :class:`ServeRoutes` (``trust_request_chat_template``, ``render_timeout_s``,
    ``max_request_tokens``); the body cap is :func:`~.routes.max_body_bytes`.
    """
    metrics = engine.metrics if isinstance(engine.metrics, ServeMetrics) else ServeMetrics()
    engine.metrics = metrics
    app = web.Application(middlewares=[auth.middleware(token), _error_middleware(metrics, engine)],
                          client_max_size=max_body_bytes(engine.lm.max_model_len))
    ServeRoutes(engine, served_model_name, metrics, health_timeout=health_timeout, **limits).register(app)

    async def on_startup(_app: web.Application) -> None:
        engine.start()
        await engine.ready()  # an engine process that fails to load its model ends the server here
        current = current_published(weights_dir) if weights_dir is not None else None
        if current is not None:
            version, path = current
            loaded, kind = await engine.load_weights(str(path), version)
            metrics.policy_version.set(loaded)
            log.info("loaded the current policy version %d (%s weights) from %s", loaded, kind, path)

    async def on_shutdown(_app: web.Application) -> None:
        # aiohttp has closed the listening sockets and the idle connections by now: from here on nothing
        # new is served (the replica's outage, when it is being replaced, starts with this line)
        log.info("stopped accepting connections; finishing the requests in flight")

    async def on_cleanup(_app: web.Application) -> None:
        if stop_engine_on_cleanup:
            engine.stop()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    return app


def build_parser() -> argparse.ArgumentParser:
    """Arguments of ``rft serve``."""
    p = argparse.ArgumentParser(prog="rft serve", description="Serve a model with a vLLM-compatible OpenAI API.")
    p.add_argument("--model", required=True, help="Hugging Face model directory, or builtin:<name>")
    p.add_argument("--host", default=os.environ.get("RFT_BIND_HOST", "0.0.0.0"),
                   help="listen address (default: $RFT_BIND_HOST, else 0.0.0.0)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="model name clients use (default: --model)")
    p.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    p.add_argument("--max-batch-size", type=int, default=32, help="sequences decoded together")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    p.add_argument("--policy-version", type=int, default=0, help="policy version of the initial weights")
    p.add_argument("--weights-dir", default=None,
                   help="where a trainer publishes policy versions: load the current one before serving "
                        "(until one is loaded, the initial weights report policy version -1)")
    p.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=True,
                   help="run the engine in its own process, so that it and the HTTP front end (which keeps "
                        "only the tokenizer) do not share a GIL (default); --no-engine-process: one process")
    p.add_argument("--enforce-eager", action="store_true",
                   help="never replay decode iterations from CUDA graphs (as vLLM's flag; on a GPU they are by default)")
    p.add_argument("--engine-pacing", choices=["auto", "never"], default=None,
                   help="auto: a small batch waits an iteration's time when the machine's CPUs are all taken, so "
                        "that the processes feeding the engine run (the default, or $RFT_ENGINE_PACING); never")
    p.add_argument("--kv-cache-dtype", choices=["auto", "float32", "float16", "bfloat16"], default=None,
                   help="the KV cache's element type: auto (the model's dtype; the default, or "
                        "$RFT_ENGINE_KV_CACHE_DTYPE), or float16 / bfloat16 under a float32 model: half the "
                        "memory and the bytes decode attention reads, keys and values rounded as they are stored")
    p.add_argument("--health-timeout", type=float, default=10.0, help="seconds /health waits for a token")
    p.add_argument("--trust-request-chat-template", action="store_true",
                   help="accept chat templates supplied by requests (refused by default)")
    p.add_argument("--log-level", default="INFO")
    return p


# rft serve's options that `rft run` sets itself, each from what it names, so that spec.inference.extraArgs
# cannot set them there
SET_BY_RFT_RUN = {
    "--model": "spec.model", "--served-model-name": "metadata.name", "--dtype": "spec.model.dtype",
    "--max-model-len": "spec.inference.maxModelLen", "--host": "the address rft run binds",
    "--port": "the port rft run binds", "--threads": "rft run --threads",
    "--engine-process": "rft run --engine-process", "--no-engine-process": "rft run --engine-process",
    "--policy-version": "the trainer's publications", "--weights-dir": "the trainer's publications",
    "--log-level": "rft run's own logging",
}


class ExtraArgsError(ValueError):
    """``spec.inference.extraArgs`` that the builtin engine under ``rft run`` cannot take (the message says
    which and why)."""


class _Refusing(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse exits; rft run reports it against the field instead
        raise ExtraArgsError(message)


def engine_settings(extra_args: list[str]) -> dict[str, Any]:
    """What ``spec.inference.extraArgs`` sets on the builtin engine, for ``rft run`` to apply as ``rft serve``
    would from its command line (on a cluster they are appended to it): the keyword arguments of
    :func:`build_engine` (``max_batch_size``, ``cuda_graphs``, ``pacing``, ``kv_cache_dtype``), of
    :func:`create_app` (``health_timeout``, ``trust_request_chat_template``) and ``device``; only those given.
    An option ``rft run`` sets itself (:data:`SET_BY_RFT_RUN`), one ``rft serve`` does not know, or a bad value
    raises :class:`ExtraArgsError` naming it."""
    for arg in extra_args:
        name = arg.split("=", 1)[0]
        if name in SET_BY_RFT_RUN:
            raise ExtraArgsError(f"{name}: rft run sets it from {SET_BY_RFT_RUN[name]}; remove it")
    full = build_parser()
    p = _Refusing(prog="spec.inference.extraArgs", add_help=False, allow_abbrev=False)
    for action in full._actions:
        if action.option_strings and not set(action.option_strings) & (set(SET_BY_RFT_RUN) | {"-h", "--help"}):
            p._add_action(action)
    given = p.parse_args(extra_args)
    defaults = full.parse_args(["--model", "m"])
    out: dict[str, Any] = {}
    names = {"max_batch_size": "max_batch_size", "kv_cache_dtype": "kv_cache_dtype", "engine_pacing": "pacing",
             "health_timeout": "health_timeout", "trust_request_chat_template": "trust_request_chat_template",
             "device": "device"}
    for attr, key in names.items():
        if getattr(given, attr) != getattr(defaults, attr):
            out[key] = getattr(given, attr)
    if given.enforce_eager:
        out["cuda_graphs"] = "never"
    if "max_batch_size" in out and out["max_batch_size"] < 1:
        raise ExtraArgsError(f"--max-batch-size must be at least 1, got {out['max_batch_size']}")
    return out


def build_engine(model_dir: str, *, engine_process: bool, max_batch_size: int, load_kwargs: dict,
                 policy_version: int = 0, threads: int | None = None, log_file: str | None = None,
                 log_level: str = "INFO", torch_free: bool = False, cuda_graphs: str | None = None,
                 pacing: str | None = None, kv_cache_dtype: str | None = None) -> Any:
    """The engine serving ``model_dir`` (``load_kwargs``: :func:`~.model.load_model`'s; ``cuda_graphs`` and
    ``kv_cache_dtype``: :class:`~.runner.SlotRunner`'s, ``pacing``: :class:`~.engine.Engine`'s, None for their defaults): in a child
    process (:mod:`.procengine`, launched now, so that the model loads there while this process loads
    the tokenizer; ``log_file``/``log_level``: its logging) or in this process. ``torch_free`` (with
    ``engine_process``): this process is only the front end and never imports torch
    (:func:`~.procengine.served_model`), which ``rft serve`` asks for."""
    if engine_process:
        from .procengine import ProcessEngine, served_model

        engine = ProcessEngine(None, model_dir, max_batch_size=max_batch_size, policy_version=policy_version,
                               threads=threads, load_kwargs=load_kwargs, log_file=log_file, log_level=log_level,
                               cuda_graphs=cuda_graphs, pacing=pacing, kv_cache_dtype=kv_cache_dtype)
        engine.launch()
        engine.lm = served_model(model_dir, load_kwargs.get("max_model_len"), torch_free=torch_free)
        return engine
    from .engine import Engine
    from .model import load_model

    return Engine(load_model(model_dir, **load_kwargs), max_batch_size=max_batch_size, policy_version=policy_version,
                  cuda_graphs=cuda_graphs, pacing=pacing, kv_cache_dtype=kv_cache_dtype)


def main(argv: list[str] | None = None) -> int:
    """Run the server until interrupted (SIGINT/SIGTERM stop it gracefully)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        token = auth.server_token("rft serve")
    except auth.MissingToken as exc:
        log.error("%s", exc)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads and not args.engine_process:  # the engine process sets its own
        import torch

        torch.set_num_threads(args.threads)
    if args.model.startswith("builtin:"):
        from ..model import resolve_builtin_model

        args.served_model_name = args.served_model_name or args.model
        args.model = str(resolve_builtin_model(args.model))
    # With a trainer publishing: the initial weights are no policy version until the current one is
    # loaded (at startup, or by the trainer), so a replica never passes its initial weights off as a
    # version the trainer published (they may differ: a warm start).
    initial_version = UNPUBLISHED if args.weights_dir else args.policy_version
    engine = build_engine(args.model, engine_process=args.engine_process, max_batch_size=args.max_batch_size,
                          policy_version=initial_version, threads=args.threads, log_level=args.log_level,
                          torch_free=True, cuda_graphs="never" if args.enforce_eager else None,
                          pacing=args.engine_pacing, kv_cache_dtype=args.kv_cache_dtype,
                          load_kwargs={"dtype": args.dtype, "device": args.device,
                                       "max_model_len": args.max_model_len})
    lm = engine.lm
    device, dtype = (args.device, args.dtype) if args.engine_process else (lm.device, lm.dtype)
    name = args.served_model_name or args.model
    app = create_app(engine, name, health_timeout=args.health_timeout, stop_engine_on_cleanup=True, token=token,
                     weights_dir=args.weights_dir, trust_request_chat_template=args.trust_request_chat_template)
    log.info("serving %s as %r on %s:%d (device %s, dtype %s, max_model_len %d, max_batch_size %d)",
             args.model, name, args.host, args.port, device, dtype, lm.max_model_len, args.max_batch_size)
    # handler_cancellation: a client that disconnects cancels its request, freeing its batch rows
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None, handler_cancellation=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
