"""What a request's completions are while they are generated and once they are done: plain data,
shared by the engine and the HTTP front end (which, with the engine in its own process, never
imports torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .protocol import SamplingParams

if TYPE_CHECKING:
    import torch


@dataclass(eq=False)
class Sequence:
    """One completion being generated, and everything the response needs about it."""

    prompt: list[int]
    params: SamplingParams
    owner: Any = None  # the engine's request record
    index: int = 0  # position in the owner's outputs
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    prompt_logprobs: list[dict | None] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    # engine state
    slot: int = -1
    computed: int = 0  # tokens of this sequence already in its KV slot
    seed: int = 0
    leader: "Sequence | None" = None  # the sequence prefilling the prompt this one shares
    followers: list["Sequence"] = field(default_factory=list)
    prompt_chunks: list["torch.Tensor"] = field(default_factory=list)  # prompt logits (prompt_logprobs only)

    @property
    def finished(self) -> bool:
        """True once a finish reason is set."""
        return self.finish_reason is not None


@dataclass
class GenerationResult:
    """Finished sequences of one request, in submission order, and the policy version that made them."""

    sequences: list[Sequence]
    policy_version: int
