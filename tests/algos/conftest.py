"""Fixtures for the algorithm library tests: thread limits, seeds, a tiny real Qwen2 model."""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    """The machine is shared: keep torch to one intra-op thread."""
    torch.set_num_threads(1)


@dataclass
class TinyBatch:
    """Token ids [B, L] right-padded, attention mask [B, L], response mask on targets [B, L-1]."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor  # aligned with targets input_ids[:, 1:]
    prompt_len: int
    response_lens: list[int]


def make_tiny_model(seed: int = 0, dtype: torch.dtype = torch.float64):  # type: ignore[no-untyped-def]
    """A seeded 2-layer Qwen2ForCausalLM (vocab 64, hidden 32) built offline."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    model = Qwen2ForCausalLM(cfg).to(dtype)
    model.train()
    return model


def make_batch(seed: int, n: int = 8, prompt_len: int = 4, max_resp: int = 9, vocab: int = 64) -> TinyBatch:
    """``n`` sequences: a random prompt and a random response of 3..max_resp tokens (right pad)."""
    g = torch.Generator().manual_seed(seed)
    lens = [int(x) for x in torch.randint(3, max_resp + 1, (n,), generator=g)]
    total = prompt_len + max(lens)
    ids = torch.zeros(n, total, dtype=torch.long)
    attn = torch.zeros(n, total, dtype=torch.long)
    resp = torch.zeros(n, total - 1, dtype=torch.bool)
    for i, rl in enumerate(lens):
        ids[i, : prompt_len + rl] = torch.randint(1, vocab, (prompt_len + rl,), generator=g)
        attn[i, : prompt_len + rl] = 1
        resp[i, prompt_len - 1 : prompt_len - 1 + rl] = True  # targets are ids[:, 1:]
    return TinyBatch(ids, attn, resp, prompt_len, lens)


def slice_batch(b: TinyBatch, rows: list[int]) -> TinyBatch:
    """Rows of a batch, trimmed to their own longest sequence (micro-batches pad differently)."""
    lens = [b.response_lens[i] for i in rows]
    total = b.prompt_len + max(lens)
    return TinyBatch(
        b.input_ids[rows, :total],
        b.attention_mask[rows, :total],
        b.response_mask[rows, : total - 1],
        b.prompt_len,
        lens,
    )


def sequence_logprobs(model: torch.nn.Module, b: TinyBatch, temperature: float = 1.0) -> torch.Tensor:
    """Log-probs [B, L-1] of ``input_ids[:, 1:]`` under ``model`` (through ``logprobs_from_logits``)."""
    from rft_runtime.algos import logprobs_from_logits

    logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits
    return logprobs_from_logits(logits[:, :-1], b.input_ids[:, 1:], temperature=temperature)


@pytest.fixture
def tiny() -> SimpleNamespace:
    """Helpers for tiny-model tests: ``model(seed, dtype)``, ``batch(seed, n, ...)``,
    ``slice(batch, rows)``, ``logprobs(model, batch, temperature)``."""
    return SimpleNamespace(
        model=make_tiny_model, batch=make_batch, slice=slice_batch, logprobs=sequence_logprobs
    )
