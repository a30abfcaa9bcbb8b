"""Shared pieces of the authentication attack tests: the three data-plane servers of a job, real, on
loopback, each requiring job A's token; and their routes as the apps register them (so a route added
later is attacked too without editing the tests)."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from aiohttp import web  # noqa: E402

from rft_runtime.auth import OPEN_PATHS  # noqa: E402
from rft_runtime.coordinator import Coordinator, CoordinatorConfig, CoordinatorService  # noqa: E402
from rft_runtime.coordinator.http import create_app as coordinator_app  # noqa: E402
from rft_runtime.coordinator.server import AppThread  # noqa: E402
from rft_runtime.rewards import RewardService  # noqa: E402
from rft_runtime.rewards.server import make_app as reward_app  # noqa: E402

TOKEN_A = secrets.token_urlsafe(32)
"""Job A's token: the servers require it."""
TOKEN_B = secrets.token_urlsafe(32)
"""Job B's token: valid for another job, worthless here."""
TINY = Path(__file__).resolve().parents[1] / "contracts" / "vllm" / "tiny-qwen2"


@dataclass(frozen=True)
class Route:
    server: str
    method: str
    path: str

    def __str__(self) -> str:
        return f"{self.server} {self.method} {self.path}"


def routes_of(server: str, app: web.Application) -> list[Route]:
    """Every route ``app`` registers (HEAD aliases left out)."""
    out = []
    for r in app.router.routes():
        if r.method == "HEAD" or r.resource is None:
            continue
        out.append(Route(server, r.method, r.resource.canonical))
    return out


def data_plane(routes: list[Route]) -> list[Route]:
    return [r for r in routes if r.path not in OPEN_PATHS]


def coordinator_server(token: str | None = TOKEN_A) -> tuple[AppThread, web.Application]:
    from prometheus_client import CollectorRegistry

    svc = CoordinatorService(Coordinator(CoordinatorConfig(n=2, lease_timeout_s=5.0)))
    svc.submit([{"task_id": "secret-task", "prompt": "what is 2+2?", "ground_truth": "4"}], seeds=[1])
    app = coordinator_app(svc, CollectorRegistry(), token=token)
    return AppThread(app).start(), app


def reward_server(token: str | None = TOKEN_A) -> tuple[AppThread, web.Application]:
    app = reward_app(RewardService.from_config({"builtin": "math"}), token=token)
    return AppThread(app).start(), app


def inference_server(token: str | None = TOKEN_A) -> tuple[AppThread, web.Application]:
    from rft_runtime.serve.engine import Engine
    from rft_runtime.serve.model import load_model
    from rft_runtime.serve.server import create_app

    engine = Engine(load_model(TINY, device="cpu"), max_batch_size=2)
    app = create_app(engine, "tiny", stop_engine_on_cleanup=True, token=token)
    return AppThread(app).start(), app
