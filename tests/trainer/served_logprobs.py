"""What an inference server samples for a fixed prompt, and the trainer-side recomputation of those
log-probs: the check that a server serves exactly the weights the trainer published."""

from __future__ import annotations

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
