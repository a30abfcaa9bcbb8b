"""Policy-gradient losses, registered in :data:`POLICY_LOSSES`.

Every loss has the signature::

    loss_fn(logprobs[B, T], old_logprobs[B, T], advantages[B] or [B, T], mask[B, T],
            cfg: PolicyLossConfig) -> (per_token_loss[B, T], metrics: dict[str, Tensor])

* ``logprobs`` — log π_θ of the sampled tokens (requires grad); ``old_logprobs`` — log π_old
  (the policy that sampled, or the trainer's recomputation of it), no grad needed.
* ``mask`` — bool/0-1, True on tokens that count (model tokens of valid sequences).
* ``per_token_loss`` is exactly 0 where ``mask`` is False (NaN there in the inputs is harmless);
  reduce it with a :mod:`~rft_runtime.algos.aggregation` mode. The loss is to be *minimised*.
* ``metrics`` — detached 0-dim tensors, means over the masked tokens of this call:
  ``clip_fraction`` (share of tokens whose update is clipped), ``ratio_mean``, ``ratio_max``,
  ``ratio_min``, ``approx_kl`` (k1 estimate of KL(π_old‖π_θ): mean of old − new), plus
  loss-specific entries documented per loss.

All ratios are ``exp`` of log-ratios clamped to ±20.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ._tensor import (
    as_bool_mask,
    check_2d,
    check_same_shape,
    masked_log_ratio,
    masked_max,
    masked_mean,
    masked_min,
    token_advantages,
)
from .registry import Registry

Metrics = dict[str, torch.Tensor]


@dataclass(frozen=True)
class PolicyLossConfig:
    """Clipping constants of the policy losses.

    Attributes:
        clip_low: ε_low; the ratio (or CISPO weight) is clipped below at ``1 - clip_low``. For
            CISPO a value >= 1 means "no lower bound" (MiniMax-M1's setting).
        clip_high: ε_high; clipped above at ``1 + clip_high`` (DAPO's clip-higher when it
            exceeds ``clip_low``).
        dual_clip_c: dual-clip constant c > 1 for negative advantages (Ye et al. 2020): the
            per-token loss is bounded by ``-c * A`` when ``A < 0``. ``None`` disables it. Only
            ``ppo_clip`` uses it.
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip_c: float | None = None

    def __post_init__(self) -> None:
        if not self.clip_low >= 0:
            raise ValueError(f"clip_low must be >= 0, got {self.clip_low}")
        if not self.clip_high >= 0:
            raise ValueError(f"clip_high must be >= 0, got {self.clip_high}")
        if self.dual_clip_c is not None and not self.dual_clip_c > 1.0:
            raise ValueError(f"dual_clip_c must be > 1 (or None), got {self.dual_clip_c}")


class PolicyLoss(Protocol):
    """Callable protocol of a registered policy loss."""

    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        cfg: PolicyLossConfig | None = None,
    ) -> tuple[torch.Tensor, Metrics]: ...


POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")


def _inputs(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate shapes; return (bool mask, masked log-ratio, token advantages zeroed off-mask)."""
    check_2d("logprobs", logprobs)
    check_same_shape("logprobs", logprobs, old_logprobs=old_logprobs)
    m = as_bool_mask(mask, logprobs)
    log_ratio = masked_log_ratio(logprobs, old_logprobs.detach(), m)
    adv = token_advantages(advantages.detach().to(logprobs.dtype), logprobs)
    adv = torch.where(m, adv, torch.zeros_like(adv))
    return m, log_ratio, adv


def _ratio_metrics(ratio: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor) -> Metrics:
    r = ratio.detach()
    return {
        "ratio_mean": masked_mean(r, mask),
        "ratio_max": masked_max(r, mask),
        "ratio_min": masked_min(r, mask),
        "approx_kl": masked_mean(-log_ratio.detach(), mask),
    }


def _zero_off_mask(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, loss, torch.zeros_like(loss))


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: PolicyLossConfig | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """PPO clipped surrogate (Schulman et al. 2017) with clip-higher (DAPO) and dual clip.

    ``r_t = exp(log π_θ - log π_old)``;
    ``L_t = max(-A_t r_t, -A_t clip(r_t, 1 - ε_low, 1 + ε_high))``; with dual clip (A_t < 0):
    ``L_t = min(L_t, -c A_t)``. This is the token objective of GRPO (Shao et al. 2024) and DAPO
    (Yu et al. 2025, eq. 8). Shapes: [B, T] inputs, advantages [B] or [B, T] → loss [B, T].
    Extra metrics: ``clip_fraction_low`` (A<0, r<1-ε_low), ``clip_fraction_high`` (A>0,
    r>1+ε_high), ``dual_clip_fraction``.
    """
    cfg = cfg or PolicyLossConfig()
    m, log_ratio, adv = _inputs(logprobs, old_logprobs, advantages, mask)
    ratio = torch.exp(log_ratio)
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    loss = torch.maximum(pg1, pg2)
    clipped = pg2 > pg1
    dual = torch.zeros_like(m)
    if cfg.dual_clip_c is not None:
        pg3 = -adv * cfg.dual_clip_c
        dual = (adv < 0) & (loss > pg3)
        loss = torch.where(adv < 0, torch.minimum(loss, pg3), loss)
    metrics = _ratio_metrics(ratio, log_ratio, m)
    f = logprobs.dtype
    metrics.update(
        clip_fraction=masked_mean((clipped | dual).to(f), m),
        clip_fraction_low=masked_mean((clipped & (adv < 0)).to(f), m),
        clip_fraction_high=masked_mean((clipped & (adv > 0)).to(f), m),
        dual_clip_fraction=masked_mean(dual.to(f), m),
    )
    return _zero_off_mask(loss, m), metrics


@POLICY_LOSSES.register("gspo")
def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: PolicyLossConfig | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"), GSPO-token form.

    Sequence ratio ``s_i = exp((1/|y_i|) Σ_t log(π_θ(y_t)/π_old(y_t)))`` (length-normalised);
    token ratio ``s_{i,t} = sg[s_i] · π_θ(y_t) / sg[π_θ(y_t)]`` (equal to s_i in value, gradient
    ``s_i ∇log π_θ(y_t)``); ``L_{i,t} = max(-A_{i,t} s_{i,t}, -A_{i,t} clip(s_{i,t}, 1-ε_low,
    1+ε_high))``. With per-sequence advantages and ``seq-mean-token-mean`` aggregation this is
    exactly GSPO's sequence objective (paper eq. 5/7). Shapes: [B, T] inputs, advantages [B] or
    [B, T] → loss [B, T]. Ratio metrics are over sequences (the sequence ratio s_i).
    """
    cfg = cfg or PolicyLossConfig()
    m, log_ratio, adv = _inputs(logprobs, old_logprobs, advantages, mask)
    seq_log_ratio = masked_mean(log_ratio, m, dim=-1)  # [B]
    lp = torch.where(m, logprobs, torch.zeros_like(logprobs))
    log_s = lp - lp.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(log_s)
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    loss = torch.maximum(pg1, pg2)
    clipped = pg2 > pg1
    has_tokens = m.any(dim=-1)
    seq_ratio = torch.exp(seq_log_ratio.detach())
    metrics: Metrics = {
        "ratio_mean": masked_mean(seq_ratio, has_tokens),
        "ratio_max": masked_max(seq_ratio, has_tokens),
        "ratio_min": masked_min(seq_ratio, has_tokens),
        "approx_kl": masked_mean(-log_ratio.detach(), m),
        "clip_fraction": masked_mean(clipped.to(logprobs.dtype), m),
    }
    return _zero_off_mask(loss, m), metrics


@POLICY_LOSSES.register("cispo")
def cispo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: PolicyLossConfig | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """CISPO (MiniMax-M1, 2025, eq. 4-5): REINFORCE with a clipped, stop-gradient IS weight.

    ``r_t = π_θ/π_old``; ``w_t = sg[clip(r_t, 1 - ε_low, 1 + ε_high)]``;
    ``L_t = -w_t · A_t · log π_θ(y_t)``. Every token keeps its gradient (no token is dropped, unlike
    PPO clipping); only its weight is bounded. Convention: verl's, the weight is clipped to
    ``[1 - clip_low, 1 + clip_high]`` (``clip_low >= 1`` = no lower bound, as in the paper). TRL
    instead caps the weight at an absolute value (``min(r_t, epsilon_high)``, e.g. 5.0); TRL's cap
    c equals ours with ``clip_high = c - 1`` and ``clip_low >= 1``. Shapes: [B, T] inputs,
    advantages [B] or [B, T] → loss [B, T]. ``clip_fraction`` = share of tokens whose weight was
    clipped (their gradient is scaled, not removed).
    """
    cfg = cfg or PolicyLossConfig()
    m, log_ratio, adv = _inputs(logprobs, old_logprobs, advantages, mask)
    ratio = torch.exp(log_ratio)
    low, high = max(1.0 - cfg.clip_low, 0.0), 1.0 + cfg.clip_high
    weight = ratio.clamp(low, high).detach()
    lp = torch.where(m, logprobs, torch.zeros_like(logprobs))
    loss = -adv * weight * lp
    clipped = (ratio < low) | (ratio > high)
    metrics = _ratio_metrics(ratio, log_ratio, m)
    metrics["clip_fraction"] = masked_mean(clipped.to(logprobs.dtype), m)
    return _zero_off_mask(loss, m), metrics


@POLICY_LOSSES.register("reinforce")
def reinforce_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: PolicyLossConfig | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """REINFORCE (Williams 1992) with an unclipped importance ratio.

    ``L_t = -A_t · r_t``, ``r_t = π_θ/π_old``; its gradient ``-A_t r_t ∇log π_θ`` is plain
    REINFORCE (``-A_t ∇log π_θ``) when on-policy (r = 1) and importance-corrected otherwise. No
    clipping (``cfg`` is accepted and ignored). Shapes: [B, T] inputs, advantages [B] or [B, T] →
    loss [B, T]. ``clip_fraction`` is always 0.
    """
    m, log_ratio, adv = _inputs(logprobs, old_logprobs, advantages, mask)
    ratio = torch.exp(log_ratio)
    metrics = _ratio_metrics(ratio, log_ratio, m)
    metrics["clip_fraction"] = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    return _zero_off_mask(-adv * ratio, m), metrics


def compute_policy_loss(
    name: str,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: PolicyLossConfig | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Look up ``name`` in :data:`POLICY_LOSSES` and apply it."""
    return POLICY_LOSSES.get(name)(logprobs, old_logprobs, advantages, mask, cfg)
