"""Helpers for the builtin inference server tests: fixtures on disk, a server thread, reference logprobs."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from aiohttp import web  # noqa: E402

from rft_runtime.serve.engine import Engine  # noqa: E402
from rft_runtime.serve.model import load_model  # noqa: E402
from rft_runtime.serve.server import create_app  # noqa: E402

CONTRACTS = Path(os.environ.get("RFT_VLLM_CONTRACTS", Path(__file__).resolve().parents[1] / "contracts" / "vllm"))
if not CONTRACTS.is_dir():
    CONTRACTS = Path(__file__).resolve().parents[3] / "shared" / "contracts" / "vllm"
TINY = CONTRACTS / "tiny-qwen2"
# The chat-template prompt of the fixtures ("what is 2 + 3?" as a user message).
CHAT_PROMPT = [1, 87, 85, 262, 201, 269, 272, 223, 20, 270, 223, 21, 33, 2, 201, 1, 67, 85, 85, 266, 86, 67, 80, 86,
               201]

torch.set_num_threads(1)  # 2 shared cores: more threads only spin


def fixture(case: str, mode: str = "processed_logprobs") -> dict:
    """A recorded vLLM request/response pair."""
    return json.loads((CONTRACTS / f"{mode}__{case}.json").read_text())


class ServerThread:
    """An aiohttp server for one engine, running its own event loop in a background thread."""

    def __init__(self, engine: Engine, name: str = "tiny", health_timeout: float = 10.0, **limits: Any):
        self.engine = engine
        self.limits = limits
        self.name = name
        self.health_timeout = health_timeout
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stopped: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stopped = asyncio.Event()
        try:
            app = create_app(self.engine, self.name, health_timeout=self.health_timeout, stop_engine_on_cleanup=True,
                             **self.limits)
            runner = web.AppRunner(app, handler_cancellation=True)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            host, port = runner.addresses[0][:2]
            self.url = f"http://{host}:{port}"
        except BaseException as exc:  # noqa: BLE001
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        await self._stopped.wait()
        await runner.cleanup()

    def start(self) -> "ServerThread":
        """Start and wait until the socket listens."""
        self._thread.start()
        if not self._ready.wait(60):
            raise TimeoutError("server did not start within 60 s")
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        """Stop the server and its engine."""
        if self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(30)


def start_server(model_dir: Path = TINY, *, max_batch_size: int = 8, **kw) -> ServerThread:
    """Load ``model_dir`` and serve it as ``tiny`` on 127.0.0.1 (a free port)."""
    lm = load_model(model_dir, device="cpu")
    return ServerThread(Engine(lm, max_batch_size=max_batch_size), **kw).start()


def recompute_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """``log_softmax(logits / T)`` over the vocabulary at each completion position ``[len(completion), V]``."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    t = 1.0 if temperature < 1e-5 else temperature
    lp = torch.log_softmax(logits / t, dim=-1)
    return lp[len(prompt) - 1: len(prompt) - 1 + len(completion)]
