"""The running batch: sequences that are being decoded together, and the model calls that advance them.

Each engine iteration (see :mod:`rft_runtime.serve.engine`) calls :meth:`RunningBatch.step` with the
sequences admitted since the last one. ``step`` runs one decode forward for the sequences already
running and one prefill forward for the newcomers (identical prompts are prefilled once), merges the
newcomers' KV cache into the batch, samples one token for every sequence, and retires finished ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from transformers import DynamicCache

from .kv_cache import PaddedKV
from .protocol import SamplingParams
from .sampler import make_generator, prompt_logprobs, sample_step


@dataclass
class Sequence:
    """One completion being generated, and everything the response needs about it."""

    prompt: list[int]
    params: SamplingParams
    owner: Any = None  # the engine's request record
    index: int = 0  # position in the owner's outputs
    generator: torch.Generator | None = None
    output: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    prompt_logprobs: list[dict | None] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    @property
    def finished(self) -> bool:
        """True once a finish reason is set."""
        return self.finish_reason is not None


class RunningBatch:
    """Sequences in flight with their shared, left-padded KV cache."""

    def __init__(self, model: Any, *, pad_token_id: int, eos_token_ids: frozenset[int], device: torch.device,
                 decode_text: Callable[[list[int]], str] | None = None):
        self.model = model
        self.pad_token_id = pad_token_id
        self.eos_token_ids = eos_token_ids
        self.device = device
        self.decode_text = decode_text
        self.seqs: list[Sequence] = []
        self.kv: PaddedKV | None = None
        self.next_pos = torch.zeros(0, dtype=torch.long, device=device)  # position of the token fed next
        self.pending = torch.zeros(0, dtype=torch.long, device=device)  # sampled, not yet in the cache

    def __len__(self) -> int:
        return len(self.seqs)

    def clear(self) -> None:
        """Drop every sequence and the cache (after an error)."""
        self.seqs, self.kv = [], None
        self.next_pos = self.next_pos[:0]
        self.pending = self.pending[:0]

    # ------------------------------------------------------------------ model calls

    def _decode_logits(self) -> torch.Tensor:
        assert self.kv is not None
        mask = self.kv.append_column()
        out = self.model(input_ids=self.pending.unsqueeze(1), attention_mask=mask,
                         position_ids=self.next_pos.unsqueeze(1), past_key_values=self.kv.cache,
                         use_cache=True, logits_to_keep=1)
        self.next_pos = self.next_pos + 1
        return out.logits[:, -1, :]

    def _prefill(self, seqs: list[Sequence]) -> tuple[PaddedKV, torch.Tensor, torch.Tensor]:
        """Prefill the distinct prompts of ``seqs``; returns their cache, last logits and next positions,
        one row per sequence."""
        uniq: dict[tuple[int, ...], int] = {}
        rows = [uniq.setdefault(tuple(s.prompt), len(uniq)) for s in seqs]
        prompts = list(uniq)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        need_all = any(s.params.prompt_logprobs is not None for s in seqs)
        cache = DynamicCache()
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                         use_cache=True, logits_to_keep=0 if need_all else 1)
        logits = out.logits
        computed: dict[tuple[int, int], list[dict | None]] = {}
        for s, r in zip(seqs, rows):
            k = s.params.prompt_logprobs
            if k is not None:
                if (r, k) not in computed:
                    computed[(r, k)] = prompt_logprobs(logits[r, width - len(s.prompt):], s.prompt, k)
                s.prompt_logprobs = computed[(r, k)]
        kv = PaddedKV(cache, mask)
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        if rows != list(range(len(prompts))):
            kv.select(index)
        lens = torch.tensor([len(s.prompt) for s in seqs], dtype=torch.long, device=self.device)
        return kv, logits[:, -1, :].index_select(0, index), lens

    # ------------------------------------------------------------------ one iteration

    def step(self, newcomers: list[Sequence]) -> list[Sequence]:
        """Advance every sequence by one token (admitting ``newcomers``); return those that finished."""
        parts = []
        if self.seqs:
            parts.append(self._decode_logits())
        if newcomers:
            for s in newcomers:
                if s.generator is None:
                    s.generator = make_generator(s.params.seed, self.device)
            kv, logits, lens = self._prefill(newcomers)
            parts.append(logits)
            if self.kv is None or not self.seqs:
                self.kv = kv
            else:
                self.kv.extend(kv)
            self.seqs = self.seqs + newcomers
            self.next_pos = torch.cat([self.next_pos, lens])
        if not parts:
            return []
        logits = torch.cat(parts) if len(parts) > 1 else parts[0]
        chosen = sample_step(logits, [s.params for s in self.seqs], [s.generator for s in self.seqs])
        finished = []
        for i, s in enumerate(self.seqs):
            s.output.append(chosen.tokens[i])
            s.logprobs.append(chosen.logprobs[i])
            if s.params.logprobs:
                s.top.append(chosen.top[i] or [])
            self._check_finish(s)
            if s.finished:
                finished.append(i)
        self.pending = torch.tensor(chosen.tokens, dtype=torch.long, device=self.device)
        return self.retire(finished) if finished else []

    def retire(self, rows: list[int]) -> list[Sequence]:
        """Remove the given rows from the batch (finished or cancelled) and return their sequences."""
        gone = set(rows)
        keep = [i for i in range(len(self.seqs)) if i not in gone]
        removed = [self.seqs[i] for i in rows]
        if not keep:
            self.clear()
            return removed
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        assert self.kv is not None
        self.kv.select(index)
        self.seqs = [self.seqs[i] for i in keep]
        self.next_pos = self.next_pos.index_select(0, index)
        self.pending = self.pending.index_select(0, index)
        return removed

    def _check_finish(self, s: Sequence) -> None:
        t = s.output[-1]
        p = s.params
        if t in self.eos_token_ids and not p.ignore_eos:
            s.finish_reason, s.stop_reason = "stop", None
        elif t in p.stop_token_ids:
            s.finish_reason, s.stop_reason = "stop", t
        elif p.stop and self.decode_text is not None and (hit := _find_stop(self.decode_text(s.output), p.stop)):
            s.finish_reason, s.stop_reason = "stop", hit
        elif p.max_tokens is not None and len(s.output) >= p.max_tokens:
            s.finish_reason = "length"


def _find_stop(text: str, stops: tuple[str, ...]) -> str | None:
    hits = [(text.find(s), s) for s in stops if s in text]
    return min(hits)[1] if hits else None
