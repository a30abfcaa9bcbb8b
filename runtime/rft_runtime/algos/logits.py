"""Memory-aware log-probabilities and entropy from logits.

``logprobs_from_logits`` never materialises ``log_softmax`` of the whole [B, T, V] logits: the
forward pass works on blocks of ``chunk_rows`` rows (one row = one position's V logits) and keeps
only the per-row log-sum-exp [B·T]; the backward pass recomputes the softmax block by block and
writes straight into the gradient (which autograd needs anyway). Peak extra memory is one block,
independent of B·T. Math runs in at least float32 (bf16/fp16 logits are upcast per block); the
result has dtype ``promote(logits.dtype, float32)``.

Temperature: ``log softmax(logits / τ)`` gathered at the sampled ids — the "processed" logprobs
the inference engine returns (token contract), so ratios against inference logprobs are unbiased.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.autograd.function import once_differentiable

DEFAULT_CHUNK_ROWS = 512


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _row_blocks(logits: torch.Tensor, chunk_rows: int) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield (first row, block [n, V]) over the rows of ``logits`` [..., V] without a full copy."""
    v = logits.shape[-1]
    if logits.is_contiguous() or logits.dim() <= 2:
        flat = logits.reshape(-1, v)
        for s in range(0, flat.shape[0], chunk_rows):
            yield s, flat[s : s + chunk_rows]
        return
    start = 0
    for i in range(logits.shape[0]):  # e.g. logits[:, :-1]: each logits[i] is contiguous
        sub = logits[i].reshape(-1, v)
        for s in range(0, sub.shape[0], chunk_rows):
            yield start + s, sub[s : s + chunk_rows]
        start += sub.shape[0]


class _LogprobsFromLogits(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, ids: torch.Tensor, temperature: float, chunk_rows: int):  # type: ignore[no-untyped-def]
        ct = _compute_dtype(logits.dtype)
        flat_ids = ids.reshape(-1)
        n = flat_ids.shape[0]
        out = torch.empty(n, dtype=ct, device=logits.device)
        lse = torch.empty(n, dtype=ct, device=logits.device)
        for s, block in _row_blocks(logits, chunk_rows):
            e = s + block.shape[0]
            z = block.to(ct) / temperature
            blk_lse = torch.logsumexp(z, dim=-1)
            out[s:e] = z.gather(-1, flat_ids[s:e, None]).squeeze(-1) - blk_lse
            lse[s:e] = blk_lse
        ctx.save_for_backward(logits, flat_ids, lse)
        ctx.temperature = temperature
        ctx.chunk_rows = chunk_rows
        return out.view(ids.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[no-untyped-def]
        logits, flat_ids, lse = ctx.saved_tensors
        t = ctx.temperature
        ct = lse.dtype
        g = grad_out.reshape(-1).to(ct)
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        grad_flat = grad.view(-1, logits.shape[-1])
        for s, block in _row_blocks(logits, ctx.chunk_rows):
            e = s + block.shape[0]
            p = torch.exp(block.to(ct) / t - lse[s:e, None])  # softmax(z)
            gb = p.mul_(-g[s:e, None])
            gb.scatter_add_(-1, flat_ids[s:e, None], g[s:e, None])
            grad_flat[s:e] = gb.div_(t).to(logits.dtype)
        return grad, None, None, None


def logprobs_from_logits(
    logits: torch.Tensor,
    ids: torch.Tensor,
    temperature: float = 1.0,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> torch.Tensor:
    """``log_softmax(logits / temperature)`` gathered at ``ids``.

    Args:
        logits: [..., V] (e.g. [B, T, V], already aligned so that position t predicts ids[..., t]).
        ids: [...] long token ids.
        temperature: > 0; the sampling temperature.
        chunk_rows: rows per block (bounds the temporary memory to chunk_rows × V).

    Returns:
        [...] log-probabilities, differentiable w.r.t. ``logits`` (first order).
    """
    if logits.shape[:-1] != ids.shape:
        raise ValueError(
            f"ids has shape {tuple(ids.shape)}, expected {tuple(logits.shape[:-1])} (logits[..., V])"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    if ids.dtype != torch.long:
        ids = ids.long()
    return _LogprobsFromLogits.apply(logits, ids, float(temperature), int(chunk_rows))


def entropy_from_logits(
    logits: torch.Tensor,
    temperature: float = 1.0,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> torch.Tensor:
    """Entropy of ``softmax(logits / temperature)`` per position: ``H = lse(z) − Σ_v p_v z_v``.

    Shapes: [..., V] → [...]. Computed block by block; use under ``torch.no_grad()`` for metrics
    (with grad, autograd keeps each block's intermediates, as for an unchunked computation).
    Result dtype ``promote(logits.dtype, float32)``.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    ct = _compute_dtype(logits.dtype)
    parts = []
    for _, block in _row_blocks(logits, chunk_rows):
        z = block.to(ct) / temperature
        lse = torch.logsumexp(z, dim=-1)
        p = torch.softmax(z, dim=-1)
        parts.append(lse - (p * z).sum(dim=-1))
    if not parts:
        return torch.empty(logits.shape[:-1], dtype=ct, device=logits.device)
    return torch.cat(parts).view(logits.shape[:-1])
