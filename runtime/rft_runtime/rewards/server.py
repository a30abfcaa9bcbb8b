"""``rft reward --config FILE [--host H] [--port P]``: the reward API over HTTP (aiohttp).

Routes: ``POST /v1/score`` (see ``wire.py``), ``GET /health`` (200 with the evaluator names once
every evaluator is built, which includes the code sandbox's isolation probe), ``GET /metrics``
(Prometheus text format). ``/v1/score`` requires the job's token (:mod:`rft_runtime.auth`); without
``$RFT_JOB_TOKEN`` the server refuses to start on a cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys

from aiohttp import web

from rft_api.runtime import BIND_HOST_ENV

from .. import auth
from .config import load_reward_config
from .factory import build_composite
from .options import ConfigError
from .service import RewardService
from .wire import RequestError, is_group, parse_request, result_json

__all__ = ["make_app", "main", "DEFAULT_PORT", "SERVICE_KEY"]

DEFAULT_PORT = 8081
SERVICE_KEY: web.AppKey[RewardService] = web.AppKey("reward_service", RewardService)
log = logging.getLogger("rft.reward")


async def _score(request: web.Request) -> web.Response:
    service = request.app[SERVICE_KEY]
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        return web.json_response({"error": "request body is not valid JSON"}, status=400)
    try:
        entries = parse_request(body)
    except RequestError as exc:
        return web.json_response({"error": str(exc)}, status=400)
    if is_group(body) and entries:  # one task's samples together (groupwise evaluators see them at once)
        results = await service.score_group([s for _, s, _ in entries], entries[0][2])
    else:
        results = await asyncio.gather(*(service.score(s, i) for _, s, i in entries))
    payload = {"results": [result_json(eid, r) for (eid, _, _), r in zip(entries, results)]}
    return web.json_response(payload)


async def _health(request: web.Request) -> web.Response:
    service = request.app[SERVICE_KEY]
    return web.json_response({"status": "ok", "evaluators": service.evaluator.names})


async def _metrics(request: web.Request) -> web.Response:
    service = request.app[SERVICE_KEY]
    return web.Response(body=service.metrics.render(), content_type="text/plain", charset="utf-8")


def make_app(service: RewardService, max_request_mb: int = 256, *, token: str | None = None) -> web.Application:
    """The aiohttp application serving ``service`` (closed with the app); ``token``: the job token
    ``/v1/score`` requires (None: open, see :mod:`rft_runtime.auth`)."""
    app = web.Application(client_max_size=max_request_mb << 20, middlewares=[auth.middleware(token)])
    app[SERVICE_KEY] = service
    app.router.add_post("/v1/score", _score)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)

    async def close(_: web.Application) -> None:
        await service.aclose()

    app.on_cleanup.append(close)
    return app


async def _serve(service: RewardService, host: str, port: int, token: str | None) -> None:
    runner = web.AppRunner(make_app(service, token=token), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    log.info("reward server on http://%s:%d (evaluators: %s)", host, port, ", ".join(service.evaluator.names))
    print(json.dumps({"event": "listening", "host": host, "port": port, "evaluators": service.evaluator.names}),
          flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


TERMINATION_LOG = "/dev/termination-log"


def _termination_message(reason: str) -> None:
    """Kubernetes shows this file's text as the container's termination reason (when it exists)."""
    try:
        with open(TERMINATION_LOG, "w") as fh:
            fh.write(reason[:4096])
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``rft reward``; returns the exit code (2 for a bad config)."""
    parser = argparse.ArgumentParser(prog="rft reward", description="serve the reward API (contract 3)")
    parser.add_argument("--config", required=True, help="the job's runtime config (config.json)")
    parser.add_argument("--host", default=os.environ.get(BIND_HOST_ENV, "0.0.0.0"),
                        help="listen address (default: $RFT_BIND_HOST, else 0.0.0.0)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        token = auth.server_token("rft reward")
        cfg = load_reward_config(args.config)
        service = RewardService(build_composite(cfg), concurrency=cfg.concurrency)
    except (ConfigError, RuntimeError) as exc:
        reason = f"rft reward: {exc}".replace("\n", " ")
        print(reason, file=sys.stderr)
        _termination_message(reason)
        return 2
    asyncio.run(_serve(service, args.host, args.port, token))
    return 0


if __name__ == "__main__":
    sys.exit(main())
