"""Sampling parameters sent to the engine, and the token-contract check of one sampled completion."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..types import Sample
from .errors import TokenContractError

FINISH_REASONS = ("stop", "length")
# Request fields the processor owns; `SamplingParams.extra` may not override them.
RESERVED_FIELDS = frozenset({
    "model", "prompt", "n", "logprobs", "return_token_ids", "return_tokens_as_token_ids", "seed",
    "max_tokens", "temperature", "top_p", "top_k", "echo", "stream", "best_of", "prompt_logprobs",
})


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings for `/v1/completions` (vLLM field names).

    `top_p`/`top_k` are sent only when set. `logprobs` is the number of top alternatives asked for;
    the sampled token's own logprob comes back either way, and 1 is the default because some
    OpenAI-compatible servers read `logprobs: 0` as "no logprobs". `extra` is merged into the
    request body unchanged (e.g. `{"min_tokens": 2}`).
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int = 1
    ignore_eos: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"sampling.max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            raise ValueError(f"sampling.temperature must be >= 0, got {self.temperature!r}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or (self.top_k < 1 and self.top_k != -1)):
            raise ValueError(f"sampling.top_k must be -1 (off) or >= 1, got {self.top_k!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"sampling.seed must be a non-negative integer, got {self.seed!r}")
        if not isinstance(self.logprobs, int) or self.logprobs < 0:
            raise ValueError(f"sampling.logprobs must be an integer >= 0, got {self.logprobs!r}")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"sampling.stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        clash = sorted(RESERVED_FIELDS & set(self.extra))
        if clash:
            raise ValueError(f"sampling.extra may not set {clash}: the processor owns these request fields")

    def request_fields(self, seed: int | None) -> dict[str, Any]:
        """The body fields for one token-id request (without model/prompt/n), `seed` replacing `self.seed`."""
        body = {"logprobs": self.logprobs, "return_token_ids": True, "return_tokens_as_token_ids": True,
                **self.sampling_fields(seed)}
        body.update(self.extra)
        return body

    def sampling_fields(self, seed: int | None) -> dict[str, Any]:
        """The fields that set the sampling distribution and length (vLLM names; the same on the
        completions and the chat route), without `extra`."""
        body: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": self.temperature}
        if self.top_p is not None:
            body["top_p"] = self.top_p
        if self.top_k is not None:
            body["top_k"] = self.top_k
        if seed is not None:
            body["seed"] = seed
        if self.stop_token_ids:
            body["stop_token_ids"] = list(self.stop_token_ids)
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body


def engine_sample(
    *,
    prompt_ids: list[int],
    completion_ids: list[int],
    logprobs: list[float],
    finish_reason: str,
    policy_version: int | None,
    text: str = "",
    seed: int | None = None,
    stop_reason: int | str | None = None,
    server: str = "",
) -> Sample:
    """The :class:`~rft_runtime.types.Sample` of one engine choice, with the token contract checked
    (docs/architecture.md, contract 1): ids are token ids, ``logprobs[i]`` is the engine's processed
    logprob of ``completion_ids[i]`` (finite, ≤ 0), the finish reason is ``stop`` or ``length``.
    Raises :class:`TokenContractError` naming what is wrong."""
    check_ids("prompt_ids", prompt_ids)
    check_ids("completion_ids", completion_ids)
    if len(logprobs) != len(completion_ids):
        raise TokenContractError(f"sample has {len(completion_ids)} completion ids but {len(logprobs)} logprobs")
    for i, lp in enumerate(logprobs):
        if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp) or lp > 1e-4:
            raise TokenContractError(f"logprobs[{i}] = {lp!r} is not a finite log-probability")
    if finish_reason not in FINISH_REASONS:
        raise TokenContractError(f"finish_reason must be one of {FINISH_REASONS}, got {finish_reason!r}")
    return Sample(
        text=text, prompt_ids=list(prompt_ids), completion_ids=list(completion_ids),
        logprobs=[float(lp) for lp in logprobs], finish_reason=finish_reason,
        truncated=finish_reason == "length", policy_version=policy_version, seed=seed,
        stop_reason=stop_reason, server=server,
    )


def check_ids(name: str, ids: Any) -> None:
    """Raise TokenContractError unless `ids` is a list of non-negative ints."""
    if not isinstance(ids, list):
        raise TokenContractError(f"{name} must be a list of token ids, got {type(ids).__name__}")
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise TokenContractError(f"{name}[{i}] = {t!r} is not a token id")
