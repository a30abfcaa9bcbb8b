"""Token selection and processed logprobs for one decode step of a batch.

Processed logprobs follow vLLM's ``--logprobs-mode processed_logprobs``:

* sampling rows (temperature >= 1e-5): ``log_softmax(filter(logits / T))`` where ``filter`` sets the
  logits outside top-k / top-p to ``-inf`` (so filtered tokens get ``-inf`` and the kept ones are
  renormalised);
* greedy rows (temperature < 1e-5): ``log_softmax(logits)``, no filtering (vLLM's greedy path).

Sampling inverts each row's cumulative distribution at one uniform ``u`` in (0, 1): the token is the
first whose cumulative probability exceeds ``u`` times the row's total (an exact sample from
``probs``; a token of probability 0 is never chosen). ``u`` is a counter-based hash of (the
sequence's seed, the index of the token being sampled) -- splitmix64, in Python integers, one per
row -- so a seeded sequence gives the same tokens whatever else is in the batch, without a generator
per row, and the iteration draws one number per row instead of one per vocabulary entry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from .protocol import SamplingParams


@dataclass
class StepSample:
    """What one step chose for each row (Python lists, ready to append)."""

    tokens: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]] | None]  # per row, top-k (id, logprob) or None when not asked


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Mask logits outside each row's top-k and top-p (nucleus) sets with ``-inf``.

    ``top_k[b]`` equal to the vocabulary size and ``top_p[b] == 1`` disable the filters for row ``b``.
    Ties with the k-th largest logit are kept. The nucleus keeps the smallest set of largest logits whose
    probability mass reaches ``p`` (at least one token).
    """
    if top_k is None and top_p is None:
        return logits
    vocab = logits.shape[-1]
    ordered, order = logits.sort(dim=-1, descending=False)
    if top_k is not None:
        kth = ordered.gather(1, (vocab - top_k).clamp(0, vocab - 1).unsqueeze(1))
        ordered = ordered.masked_fill(ordered < kth, float("-inf"))
    if top_p is not None:
        cum = ordered.softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= (1.0 - top_p).unsqueeze(1)
        drop[:, -1] = False
        ordered = ordered.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, ordered)


def processed_logprobs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Processed logprobs ``[B, V]`` (float32) for rows with the given sampling parameters."""
    logits = logits.float()
    vocab = logits.shape[-1]
    greedy = [p.greedy for p in params]
    temps = [1.0 if g else p.temperature for g, p in zip(greedy, params)]
    scaled = logits if all(t == 1.0 for t in temps) else \
        logits / torch.tensor(temps, dtype=torch.float32, device=logits.device).unsqueeze(1)
    ks = [vocab if (g or p.top_k <= 0) else min(p.top_k, vocab) for g, p in zip(greedy, params)]
    ps = [1.0 if g else p.top_p for g, p in zip(greedy, params)]
    top_k = torch.tensor(ks, device=logits.device) if any(k < vocab for k in ks) else None
    top_p = torch.tensor(ps, dtype=torch.float32, device=logits.device) if any(p < 1.0 for p in ps) else None
    return torch.log_softmax(filter_top_k_top_p(scaled, top_k, top_p), dim=-1)


_M64 = (1 << 64) - 1


def _i64(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN = _i64(0x9E3779B97F4A7C15)
_C1, _C2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_STEP = _i64(0xD1B54A32D192ED03)
_U_BITS = 40  # a uniform's resolution: 2**-40, and u <= 1 - 2**-41, so u * total stays below total in float64


def _mix_int(x: int) -> int:
    """splitmix64's finaliser of one value, in Python integers (modulo 2**64; signed int64 result)."""
    x &= _M64
    x = ((x ^ (x >> 30)) * _C1) & _M64
    x = ((x ^ (x >> 27)) * _C2) & _M64
    return _i64(x ^ (x >> 31))


def row_keys(seeds: list[int], steps: list[int]) -> list[int]:
    """Each row's hash key ``mix(seed * golden + step * step_constant + 1)`` (int64), in Python: a batch
    has few rows, and per-row tensor work would cost more in dispatch than it computes."""
    return [_mix_int(s * _GOLDEN + t * _STEP + 1) for s, t in zip(seeds, steps)]


def row_uniforms(seeds: list[int], steps: list[int]) -> list[float]:
    """Each row's uniform in (0, 1): the top :data:`_U_BITS` bits of its key, centred in their interval."""
    scale = 1.0 / (1 << _U_BITS)
    return [(((k & _M64) >> (64 - _U_BITS)) + 0.5) * scale for k in row_keys(seeds, steps)]


def inverse_cdf(probs: torch.Tensor, uniforms: list[float]) -> torch.Tensor:
    """Row ``b``'s token: the first index whose cumulative probability exceeds ``uniforms[b]`` times the row's
    total (``[B]`` long). The sum runs in float64, so its rounding stays far below the float32
    probabilities' own; the total (not 1) is the scale, so a row whose float32 probabilities do not sum to exactly 1 is sampled exactly
    as they are, and an index of probability 0 never exceeds its predecessor, so it is never chosen."""
    cum = probs.cumsum(dim=-1, dtype=torch.float64)
    target = torch.tensor(uniforms, dtype=torch.float64, device=probs.device).mul_(cum[:, -1])
    return torch.searchsorted(cum, target.unsqueeze(1), right=True).squeeze(1)


def new_seed() -> int:
    """A seed for a request that gave none (fresh entropy)."""
    return int.from_bytes(os.urandom(8), "little") >> 1


def seed_of(params: SamplingParams) -> int:
    """The seed a sequence samples with: the request's (as a signed 64-bit value) or a fresh one."""
    return _i64(params.seed & _M64) if params.seed is not None else new_seed()


def _unfiltered(params: list[SamplingParams], vocab: int) -> bool:
    """No row filters by top-k or top-p."""
    return all(p.greedy or ((p.top_k <= 0 or p.top_k >= vocab) and p.top_p >= 1.0) for p in params)


def sample_step(logits: torch.Tensor, params: list[SamplingParams], seeds: list[int], steps: list[int],
                kernels: Any = None) -> StepSample:
    """Choose one token per row and report its processed logprob and the requested top alternatives.

    ``seeds[b]`` is row ``b``'s seed (see :func:`seed_of`), ``steps[b]`` the index of the token it samples
    now (its number of generated tokens so far). ``kernels``: the engine's native kernels
    (:class:`~rft_runtime.serve.native.Kernels`), which compute the same in one call for float32 CPU logits
    where no row filters by top-k or top-p."""
    if kernels is not None and logits.dtype == torch.float32 and logits.device.type == "cpu" \
            and _unfiltered(params, logits.shape[-1]):
        greedy = [p.greedy for p in params]
        logprobs, tokens, chosen_l = kernels.sample(logits, [1.0 if g else p.temperature for g, p in zip(greedy, params)],
                                                    greedy, seeds, steps)
        return StepSample(tokens=tokens, logprobs=chosen_l, top=_top(logprobs, params))
    logprobs = processed_logprobs(logits, params)
    sampling = [not p.greedy for p in params]
    if any(sampling):
        dev = logits.device
        sampled = inverse_cdf(logprobs.exp(), row_uniforms(seeds, steps))
        chosen = sampled if all(sampling) else \
            torch.where(torch.tensor(sampling, device=dev), sampled, logprobs.argmax(dim=-1))
    else:
        chosen = logprobs.argmax(dim=-1)
    chosen_lp = logprobs.gather(1, chosen.unsqueeze(1)).squeeze(1)
    return StepSample(tokens=chosen.tolist(), logprobs=chosen_lp.tolist(), top=_top(logprobs, params))


def _top(logprobs: torch.Tensor, params: list[SamplingParams]) -> list[list[tuple[int, float]] | None]:
    """Each row's requested top alternatives ``(id, logprob)``, or None where it asked for none."""
    kmax = max((p.logprobs or 0) for p in params)
    top: list[list[tuple[int, float]] | None] = [None] * len(params)
    if kmax > 0:
        vals, idx = logprobs.topk(kmax, dim=-1)
        vals_l, idx_l = vals.tolist(), idx.tolist()
        for i, p in enumerate(params):
            if p.logprobs:
                top[i] = list(zip(idx_l[i][: p.logprobs], vals_l[i][: p.logprobs]))
    return top


def prompt_logprobs(logits: torch.Tensor, prompt: list[int], k: int) -> list[dict | None]:
    """Raw (temperature-free) logprobs of each prompt token given its prefix, as vLLM reports them.

    ``logits[t]`` predicts ``prompt[t + 1]``. Entry 0 is None; entry ``t`` is
    ``{token_id: (logprob, rank)}`` for the prompt token first, then the top ``k`` alternatives.
    vLLM computes prompt logprobs before temperature in both logprobs modes.
    """
    n = len(prompt)
    out: list[dict | None] = [None]
    if n < 2:
        return out
    lp = torch.log_softmax(logits[: n - 1].float(), dim=-1)
    target = torch.tensor(prompt[1:], device=lp.device)
    tok_lp = lp.gather(1, target.unsqueeze(1))
    ranks = (lp > tok_lp).sum(dim=-1) + 1
    tok_l, rank_l = tok_lp.squeeze(1).tolist(), ranks.tolist()
    if k > 0:
        vals, idx = lp.topk(k, dim=-1)
        vals_l, idx_l = vals.tolist(), idx.tolist()
    for t in range(n - 1):
        entry = {prompt[t + 1]: (tok_l[t], rank_l[t])}
        if k > 0:
            for r, (tid, v) in enumerate(zip(idx_l[t], vals_l[t])):
                entry.setdefault(tid, (v, r + 1))
        out.append(entry)
    return out
