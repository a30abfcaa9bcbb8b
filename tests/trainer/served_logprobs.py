"""The builtin inference server for trainer tests, what a server samples for a fixed prompt, and the
trainer-side recomputation of those log-probs: the check that a server serves exactly the weights the
trainer published."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import httpx
import torch

PROMPT = [1, 120, 121, 122, 2, 1]


def sample(url: str, model: str) -> tuple[list[int], list[float]]:
    """Six tokens sampled at temperature 1 with a fixed seed: (token ids, processed log-probs)."""
    r = httpx.post(url + "/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": 6, "temperature": 1.0,
                                                 "seed": 7, "logprobs": 1, "return_token_ids": True,
                                                 "ignore_eos": True}, timeout=60)
    r.raise_for_status()
    choice = r.json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def local_logprobs(model: torch.nn.Module, ids: list[int]) -> list[float]:
    """The log-probs ``model`` gives ``ids`` after :data:`PROMPT`."""
    with torch.no_grad():
        x = torch.tensor([PROMPT + ids])
        lp = torch.log_softmax(model(input_ids=x).logits[0, :-1].float(), -1)
        return [float(lp[len(PROMPT) - 1 + i, t]) for i, t in enumerate(ids)]


@contextlib.contextmanager
def builtin_server(model_dir: Path, served_model: str, max_batch_size: int) -> Iterator[str]:
    """``rft serve``'s app on ``model_dir`` in this process, on a free loopback port; yields its URL."""
    from rft_runtime.coordinator.server import AppThread
    from rft_runtime.serve.engine import Engine
    from rft_runtime.serve.model import load_model
    from rft_runtime.serve.server import create_app

    engine = Engine(load_model(str(model_dir)), max_batch_size=max_batch_size)
    app = AppThread(create_app(engine, served_model, stop_engine_on_cleanup=True)).start()
    try:
        yield f"http://127.0.0.1:{app.port}"
    finally:
        app.stop()
