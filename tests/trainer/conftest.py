"""Fixtures for trainer tests: a random tiny model (no warm start) and synthetic episodes."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402

from rft_runtime.types import Episode  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised tiny Qwen2 model directory (deterministic, built in ~1 s)."""
    from rft_runtime.model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture
def tiny_model(tiny_model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def make_episode(task_key: str, idx: int, *, reward: float | None, prompt_len: int = 5, resp_len: int = 4,
                 version: int = 0, seed: int = 0, steps: int = 1, shared_prompt: bool = False) -> Episode:
    """A single- or multi-turn episode with random token ids (bytes of the tokenizer)."""
    return Episode.model_validate(episode_json(task_key, idx, reward=reward, prompt_len=prompt_len,
                                               resp_len=resp_len, version=version, seed=seed, steps=steps,
                                               shared_prompt=shared_prompt))


def episode_json(task_key: str, idx: int, *, reward: float | None, prompt_len: int = 5, resp_len: int = 4,
                 version: int = 0, seed: int = 0, steps: int = 1, shared_prompt: bool = False) -> dict[str, Any]:
    """The same episode in its JSON form (as a rollout worker posts it). With ``shared_prompt`` every
    episode of ``task_key`` (and ``seed``) has the same prompt, as the samples of a GRPO group do."""
    prng = random.Random(f"{task_key}:{seed}" if shared_prompt else f"{task_key}:{idx}:{seed}")
    prompt = [prng.randrange(3, 250) for _ in range(prompt_len)]
    rng = random.Random(f"{task_key}:{idx}:{seed}:r") if shared_prompt else prng
    out_steps = []
    context = list(prompt)
    for _ in range(steps):
        resp = [rng.randrange(3, 250) for _ in range(resp_len)]
        out_steps.append({"prompt_ids": list(context), "response_ids": resp,
                          "logprobs": [-rng.uniform(0.1, 3.0) for _ in resp], "response_mask": [1] * resp_len,
                          "finish_reason": "stop", "truncated": False, "policy_version": version})
        context = context + resp + [rng.randrange(3, 250) for _ in range(2)]  # 2 environment tokens
    return {"id": f"{task_key}:{idx}", "task_id": task_key, "rollout_idx": idx,
            "trajectories": [{"name": "default", "steps": out_steps, "reward": reward}], "metrics": {}}


class FakeGroup:
    """What the coordinator hands the trainer: a key and its episodes."""

    def __init__(self, key: str, episodes: list[Episode]) -> None:
        self.key = key
        self.episodes = episodes


def make_groups(n_groups: int = 2, n: int = 4, *, seed: int = 0, steps: int = 1,
                shared_prompt: bool = False) -> list[FakeGroup]:
    """Groups with rewards that vary within each group (so advantages are non-zero); with
    ``shared_prompt`` the episodes of a group share its prompt."""
    groups = []
    for g in range(n_groups):
        key = f"t{g}@{g}"
        eps = [make_episode(key, i, reward=float((i + g) % 2), resp_len=3 + (i % 3), seed=seed, steps=steps,
                            shared_prompt=shared_prompt)
               for i in range(n)]
        groups.append(FakeGroup(key, eps))
    return groups


@pytest.fixture
def groups():
    """The :func:`make_groups` builder."""
    return make_groups


@pytest.fixture
def episode():
    """The :func:`make_episode` builder."""
    return make_episode
