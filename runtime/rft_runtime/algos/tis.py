"""Train/inference mismatch correction: truncated (or masked) importance sampling.

The inference engine (vLLM, SGLang, our builtin server) samples with π_inf, which differs from the
trainer's π_old numerically (kernels, precision, batching), or by a version when rollouts are
stale. The policy loss is written for samples of π_old, so each token's loss is re-weighted by
``w = π_old(y) / π_inf(y)``, truncated for variance (TIS; Yao et al. 2025, "Your Efficient RL
Framework Secretly Brings You Off-Policy RL Training"; IcePop / MIS for the masking variant).

Levels: ``token`` — ``r_t = exp(log π_old(y_t) − log π_inf(y_t))``; ``sequence`` — one ratio per
sequence, ``R_i = exp(Σ_t (log π_old − log π_inf))`` (the exact sequence importance ratio,
log-sum clamped to ±20), broadcast to its tokens.

Modes, registered in :data:`TIS_MODES` as ``mode(ratio, cap, lower) -> (weight, affected)``:
``truncate`` — ``w = min(r, cap)``; ``mask`` — ``w = r`` when ``lower <= r <= cap``, else 0 (the
token or sequence is dropped from the gradient).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from ._tensor import (
    LOG_RATIO_CLAMP,
    as_bool_mask,
    check_2d,
    check_same_shape,
    masked_log_ratio,
    masked_max,
    masked_mean,
)
from .registry import Registry, check_choice

TIS_LEVELS: tuple[str, ...] = ("token", "sequence")


class TISMode(Protocol):
    """Callable protocol of a registered TIS mode: ratio → (weight, affected bool)."""

    def __call__(
        self, ratio: torch.Tensor, cap: float, lower: float | None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


TIS_MODES: Registry[TISMode] = Registry("TIS mode")


@TIS_MODES.register("truncate")
def tis_truncate(ratio: torch.Tensor, cap: float, lower: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated IS: ``w = min(r, cap)``; affected where ``r > cap``. Shapes: any → same."""
    if lower is not None:
        raise ValueError("lower applies only to mode 'mask'; truncate has no lower bound")
    return ratio.clamp(max=cap), ratio > cap


@TIS_MODES.register("mask")
def tis_mask(ratio: torch.Tensor, cap: float, lower: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked IS: ``w = r · 1[lower <= r <= cap]`` (lower defaults to 0). Shapes: any → same."""
    keep = ratio <= cap
    if lower is not None:
        keep = keep & (ratio >= lower)
    return torch.where(keep, ratio, torch.zeros_like(ratio)), ~keep


class TISOutput(NamedTuple):
    """Weights [B, T] (detached, 0 off-mask) that multiply the per-token loss, and metrics."""

    weights: torch.Tensor
    metrics: dict[str, torch.Tensor]


@torch.no_grad()
def tis_weights(
    old_logprobs: torch.Tensor,
    inference_logprobs: torch.Tensor,
    mask: torch.Tensor,
    level: str = "token",
    mode: str = "truncate",
    cap: float = 2.0,
    lower: float | None = None,
) -> TISOutput:
    """Importance weights correcting the inference/trainer mismatch.

    Args:
        old_logprobs: [B, T] log π_old of the sampled tokens, computed by the trainer.
        inference_logprobs: [B, T] log π_inf returned by the inference engine (processed, i.e.
            after temperature — the token contract).
        mask: [B, T] True on model tokens that count.
        level: ``"token"`` or ``"sequence"``.
        mode: a key of :data:`TIS_MODES` (``"truncate"`` or ``"mask"``).
        cap: upper threshold (>= 1), e.g. 2.0 as in the TIS paper.
        lower: lower threshold in (0, 1] for ``mask`` mode only (e.g. ``1 / cap``); default none.

    Returns:
        :class:`TISOutput` — ``weights`` [B, T] and metrics ``mismatch_kl_k1`` and
        ``mismatch_kl_k3`` (token-mean estimates of KL(π_inf ‖ π_old) from tokens sampled by π_inf),
        ``ratio_mean``/``ratio_max`` (over tokens or sequences, per level), ``weight_mean``,
        ``fraction_truncated`` and ``fraction_masked`` (share of tokens, or of sequences at
        sequence level, that the mode changed; the other mode's entry is 0; ``fraction_affected``
        is the same share whatever the mode).
    """
    check_2d("old_logprobs", old_logprobs)
    check_same_shape("old_logprobs", old_logprobs, inference_logprobs=inference_logprobs)
    check_choice("level", level, TIS_LEVELS)
    mode_fn = TIS_MODES.get(mode)
    if not cap >= 1.0:
        raise ValueError(f"cap must be >= 1, got {cap}")
    if lower is not None and not 0.0 < lower <= 1.0:
        raise ValueError(f"lower must be in (0, 1], got {lower}")
    m = as_bool_mask(mask, old_logprobs)
    log_r = masked_log_ratio(old_logprobs.detach(), inference_logprobs.detach(), m)
    r_tok = torch.exp(log_r)
    f = old_logprobs.dtype
    if level == "token":
        w, affected = mode_fn(r_tok, cap, lower)
        unit_mask, ratio = m, r_tok
    else:
        seq_r = torch.exp(log_r.sum(dim=-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))  # [B]
        w_seq, affected = mode_fn(seq_r, cap, lower)
        w = w_seq.unsqueeze(-1).expand_as(log_r)
        unit_mask, ratio = m.any(dim=-1), seq_r
    weights = torch.where(m, w, torch.zeros_like(w)).contiguous()
    frac = masked_mean(affected.to(f), unit_mask)
    zero = torch.zeros((), dtype=f, device=old_logprobs.device)
    metrics = {
        "mismatch_kl_k1": masked_mean(-log_r, m),
        "mismatch_kl_k3": masked_mean(r_tok - 1.0 - log_r, m),
        "ratio_mean": masked_mean(ratio, unit_mask),
        "ratio_max": masked_max(ratio, unit_mask),
        "weight_mean": masked_mean(weights, m),
        "fraction_affected": frac,
        "fraction_truncated": frac if mode == "truncate" else zero,
        "fraction_masked": frac if mode == "mask" else zero,
    }
    return TISOutput(weights, metrics)
