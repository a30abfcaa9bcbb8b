"""The running batch: sequences being generated together, and the iteration that advances them.

Each engine iteration (see :mod:`rft_runtime.serve.engine`) calls :meth:`RunningBatch.step` with the
sequences admitted since the last one. ``step`` runs **one** forward pass
(:class:`~rft_runtime.serve.runner.SlotRunner`) carrying the last sampled token of every decoding
sequence and chunks of the prompts still being prefilled (at most ``prefill_tokens`` tokens per
iteration, decodes included), samples one token for every sequence that has a next-token
distribution, and retires finished ones. Each sequence holds a slot of a preallocated KV cache from
admission to retirement: nothing is concatenated, padded or copied when sequences join or leave.

Sequences admitted together with the same prompt (a request's ``n`` choices, or identical prompts of
different requests) share one prefill: the first one (the leader) computes the prompt's KV and its
last logits; the others copy its prompt KV into their slots and sample from the same logits.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .runner import Chunk, SlotRunner
from .sampler import prompt_logprobs, sample_step, seed_of
from .sequence import Sequence

DEFAULT_PREFILL_TOKENS = 2048  # tokens per iteration (decodes plus prompt chunks)


class RunningBatch:
    """Sequences in flight, each in its own slot of a preallocated KV cache."""

    def __init__(self, model: Any, *, pad_token_id: int, eos_token_ids: frozenset[int], device: torch.device,
                 decode_text: Callable[[list[int]], str] | None = None, max_slots: int = 32,
                 max_len: int | None = None, prefill_tokens: int = DEFAULT_PREFILL_TOKENS,
                 kernels: str | None = None, cuda_graphs: str | None = None, kv_cache_dtype: str | None = None):
        self.runner = SlotRunner(model, kernels=kernels, cuda_graphs=cuda_graphs, kv_cache_dtype=kv_cache_dtype)
        self.pad_token_id = pad_token_id
        self.eos_token_ids = eos_token_ids
        self.device = device
        self.decode_text = decode_text
        self.prefill_tokens = max(1, prefill_tokens)
        if max_len is None:
            cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
            max_len = int(getattr(cfg, "max_position_embeddings", 0) or 4096)
        self.cache = self.runner.make_cache(max_slots, max_len)
        self.seqs: list[Sequence] = []
        self.last_sampled: list[Sequence] = []  # sequences that got a token in the last iteration

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def free_slots(self) -> int:
        """Sequences that can still join."""
        return self.cache.free_slots

    def clear(self) -> None:
        """Drop every sequence (after an error)."""
        self.seqs = []
        self.cache.reset()

    # ------------------------------------------------------------------ admission

    def _admit(self, newcomers: list[Sequence]) -> None:
        if len(newcomers) > self.cache.free_slots:
            raise RuntimeError(f"{len(newcomers)} sequences joined a batch with {self.cache.free_slots} free slots")
        leaders: dict[tuple, Sequence] = {}
        for s in newcomers:
            s.slot = self.cache.alloc()
            s.seed = seed_of(s.params)
            s.computed = 0
            s.leader, s.followers, s.prompt_chunks = None, [], []
            if not s.prompt:
                raise ValueError("a prompt needs at least one token")
            key = (tuple(s.prompt), s.params.prompt_logprobs)
            lead = leaders.setdefault(key, s)
            if lead is not s:
                s.leader = lead
                lead.followers.append(s)
        self.seqs.extend(newcomers)

    # ------------------------------------------------------------------ one iteration

    @torch.inference_mode()
    def step(self, newcomers: list[Sequence]) -> list[Sequence]:
        """Advance every sequence by one iteration (admitting ``newcomers``); return those that finished.

        Runs in inference mode (no autograd bookkeeping on any tensor: about 15 % of a small batch's
        iteration on a CPU); the KV cache only ever changes in here."""
        if newcomers:
            self._admit(newcomers)
        self.last_sampled = []
        if not self.seqs:
            return []
        decoding = sorted((s for s in self.seqs if s.output), key=lambda s: s.slot)
        chunks = self._prefill_chunks(len(decoding))
        rows, samplers, completing = self._logit_rows(decoding, chunks)
        logits = self.runner.forward(self.cache, [s.slot for s in decoding], [s.output[-1] for s in decoding],
                                     [s.computed for s in decoding], [c for _, c in chunks], rows)
        for s in decoding:
            s.computed += 1
        for (s, c) in chunks:
            s.computed += len(c.tokens)
        samplers.extend(self._complete_prefills(logits, completing))
        if not samplers:
            return []
        return self._sample(logits, samplers)

    def _prefill_chunks(self, decodes: int) -> list[tuple[Sequence, Chunk]]:
        """The prompt chunks this iteration prefills, in admission order: what fits in ``prefill_tokens``
        beside the ``decodes`` decoding sequences (at least one token), a prompt cut where it runs out."""
        prefilling = [s for s in self.seqs if not s.output and s.leader is None and s.computed < len(s.prompt)]
        budget = max(self.prefill_tokens - decodes, 1)
        chunks: list[tuple[Sequence, Chunk]] = []
        for s in prefilling:
            if budget <= 0:
                break
            take = s.prompt[s.computed: s.computed + budget]
            chunks.append((s, Chunk(slot=s.slot, tokens=take, start=s.computed)))
            budget -= len(take)
        return chunks

    @staticmethod
    def _logit_rows(decoding: list[Sequence], chunks: list[tuple[Sequence, Chunk]]
                    ) -> tuple[list[int], list[tuple[Sequence, int]], list[tuple[Sequence, int, int]]]:
        """Which packed rows' logits the forward returns (every decoding sequence's; every prompt token's
        of a chunk asking for prompt log-probs; else a prompt's last), the decoding sequences' rows among
        them (sampled now), and per chunk whose logits are returned: its sequence (a leader), the first of
        its rows among them and how many."""
        rows: list[int] = list(range(len(decoding)))  # packed rows whose logits are needed
        samplers: list[tuple[Sequence, int]] = [(s, i) for i, s in enumerate(decoding)]
        completing: list[tuple[Sequence, int, int]] = []  # leader, first row of its logits, chunk length
        off = len(decoding)
        for s, c in chunks:
            n = len(c.tokens)
            done = c.start + n == len(s.prompt)
            if s.params.prompt_logprobs is not None:
                first = len(rows)
                rows.extend(range(off, off + n))
                completing.append((s, first, n))
            elif done:
                completing.append((s, len(rows), 1))
                rows.append(off + n - 1)
            off += n
        return rows, samplers, completing

    def _complete_prefills(self, logits: torch.Tensor, completing: list[tuple[Sequence, int, int]]
                           ) -> list[tuple[Sequence, int]]:
        """Keep each chunk's prompt logits; for each prompt now whole, its prompt log-probs, its followers
        given its prompt KV; return the sequences that sample their first token and their logits' row."""
        samplers: list[tuple[Sequence, int]] = []
        for s, first, n in completing:
            if s.params.prompt_logprobs is not None:
                s.prompt_chunks.append(logits[first:first + n])
            if s.computed < len(s.prompt):
                continue
            last = first + n - 1
            if s.params.prompt_logprobs is not None:
                full = torch.cat(s.prompt_chunks) if len(s.prompt_chunks) > 1 else s.prompt_chunks[0]
                s.prompt_logprobs = prompt_logprobs(full, s.prompt, s.params.prompt_logprobs)
                s.prompt_chunks = []
            samplers.append((s, last))
            for f in s.followers:
                self.cache.copy_prefix(s.slot, f.slot, len(s.prompt))
                f.computed = len(s.prompt)
                f.leader = None
                f.prompt_logprobs = s.prompt_logprobs
                samplers.append((f, last))
            s.followers = []
        return samplers

    def _sample(self, logits: torch.Tensor, samplers: list[tuple[Sequence, int]]) -> list[Sequence]:
        """Sample one token for each of ``samplers`` (a sequence, its row of ``logits``), append it, and
        retire the sequences that finished; return those."""
        index = [r for _, r in samplers]
        picked = logits if len(index) == logits.shape[0] and index == list(range(len(index))) \
            else logits.index_select(0, torch.tensor(index, dtype=torch.long, device=logits.device))
        seqs = [s for s, _ in samplers]
        self.last_sampled = seqs
        chosen = sample_step(picked, [s.params for s in seqs], [s.seed for s in seqs], [len(s.output) for s in seqs],
                             self.runner.kernels)
        finished = []
        for i, s in enumerate(seqs):
            s.output.append(chosen.tokens[i])
            s.logprobs.append(chosen.logprobs[i])
            if s.params.logprobs:
                s.top.append(chosen.top[i] or [])
            self._check_finish(s)
            if s.finished:
                finished.append(s)
        if finished:
            gone = set(map(id, finished))
            self._remove([i for i, s in enumerate(self.seqs) if id(s) in gone])
        return finished

    # ------------------------------------------------------------------ leaving

    def retire(self, rows: list[int]) -> list[Sequence]:
        """Remove the sequences at ``rows`` of :attr:`seqs` (cancelled) and return them."""
        return self._remove(rows)

    def _remove(self, rows: list[int]) -> list[Sequence]:
        gone = set(rows)
        removed = [self.seqs[i] for i in rows]
        for s in removed:
            self.cache.release(s.slot)
            if s.followers:  # a leader leaving before its prefill finished hands it to a follower
                heir, rest = s.followers[0], s.followers[1:]
                if id(heir) not in {id(r) for r in removed}:
                    heir.leader, heir.followers, heir.computed = None, [f for f in rest], 0
                    for f in rest:
                        f.leader = heir
                s.followers = []
        self.seqs = [s for i, s in enumerate(self.seqs) if i not in gone]
        # followers whose leader left with them are re-homed above; any orphan restarts its own prefill
        for s in self.seqs:
            if s.leader is not None and s.leader not in self.seqs:
                s.leader, s.computed = None, 0
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
