"""KL(π_θ ‖ π_ref) estimators, registered in :data:`KL_ESTIMATORS`, and the two ways to use them.

Every estimator has the signature ``kl(logprobs[B, T], ref_logprobs[B, T]) -> kl[B, T]`` and
estimates KL(π ‖ π_ref) per token from tokens sampled from π (Schulman, "Approximating KL
Divergence", 2020), with ``log ρ = log π_ref(y_t) - log π(y_t)`` (clamped to ±20):

* ``k1 = -log ρ`` — unbiased, high variance, can be negative.
* ``k2 = (log ρ)² / 2`` — biased, low variance, >= 0; on-policy its gradient equals the KL's
  gradient in expectation (verl calls it "mse").
* ``k3 = (ρ - 1) - log ρ`` — unbiased, low variance, >= 0 (GRPO's estimator). Clamped to
  [-10, 10] as in verl, so a runaway token cannot blow up the loss.

Usage (both provided):

* in the loss — :func:`kl_in_loss`: ``per_token_loss + β · kl`` then aggregated with the policy
  loss's mode (aggregation is linear, so this equals ``agg(pg) + β · agg(kl)``, as verl/GRPO);
* in the reward — :func:`kl_reward_penalty` gives ``β · kl`` per token computed WITHOUT gradient
  from the rollout (old) logprobs; :func:`apply_kl_to_rewards` subtracts its per-sequence sum from
  the outcome rewards before advantages (PPO/REINFORCE++ style).
"""

from __future__ import annotations

from typing import Protocol

import torch

from ._tensor import LOG_RATIO_CLAMP, as_bool_mask, check_2d, check_same_shape, masked_mean
from .registry import Registry

K3_CLAMP = 10.0


class KLEstimator(Protocol):
    """Callable protocol of a registered KL estimator."""

    def __call__(self, logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor: ...


KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator")


def _log_rho(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    check_same_shape("logprobs", logprobs, ref_logprobs=ref_logprobs)
    return (ref_logprobs - logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 = log π(y) − log π_ref(y) = −log ρ. Shapes: [B, T], [B, T] → [B, T]."""
    return -_log_rho(logprobs, ref_logprobs)


@KL_ESTIMATORS.register("k2")
def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 = ½ (log ρ)², ρ = π_ref(y)/π(y). Shapes: [B, T], [B, T] → [B, T]."""
    return 0.5 * _log_rho(logprobs, ref_logprobs) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 = ρ − 1 − log ρ, ρ = π_ref(y)/π(y), clamped to [-10, 10]. Shapes: [B, T] → [B, T]."""
    lr = _log_rho(logprobs, ref_logprobs)
    return (torch.exp(lr) - 1.0 - lr).clamp(-K3_CLAMP, K3_CLAMP)


def kl_in_loss(
    per_token_loss: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    estimator: str,
    coef: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Add ``coef · kl`` (estimator ``estimator``) to a per-token loss [B, T].

    ``logprobs`` carry the gradient; ``ref_logprobs`` (frozen reference) are detached. Returns the
    new per-token loss (0 off-mask) and metrics ``kl_mean`` (token mean of the estimate, detached)
    and ``kl_coef``. Aggregate the result with the same mode as the policy loss.
    """
    check_2d("per_token_loss", per_token_loss)
    check_same_shape("per_token_loss", per_token_loss, logprobs=logprobs, ref_logprobs=ref_logprobs)
    m = as_bool_mask(mask, per_token_loss)
    zero = torch.zeros_like(logprobs)
    kl = KL_ESTIMATORS.get(estimator)(
        torch.where(m, logprobs, zero), torch.where(m, ref_logprobs.detach(), zero)
    )
    out = torch.where(m, per_token_loss + coef * kl, torch.zeros_like(per_token_loss))
    metrics = {
        "kl_mean": masked_mean(kl.detach(), m),
        "kl_coef": torch.tensor(float(coef), dtype=per_token_loss.dtype, device=per_token_loss.device),
    }
    return out, metrics


@torch.no_grad()
def kl_reward_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    estimator: str,
    coef: float,
) -> torch.Tensor:
    """Per-token reward penalty ``coef · kl`` [B, T] (no gradient), 0 off-mask.

    ``logprobs`` are those of the sampling policy (old or inference logprobs).
    """
    check_2d("logprobs", logprobs)
    m = as_bool_mask(mask, logprobs)
    zero = torch.zeros_like(logprobs)
    kl = KL_ESTIMATORS.get(estimator)(torch.where(m, logprobs, zero), torch.where(m, ref_logprobs, zero))
    return torch.where(m, coef * kl, zero)


def apply_kl_to_rewards(rewards: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """Outcome rewards [B] minus the per-sequence sum of the token penalty [B, T].

    A NaN (None) reward stays NaN: its sequence is excluded from advantages either way.
    """
    check_2d("penalty", penalty)
    if rewards.shape != penalty.shape[:1]:
        raise ValueError(
            f"rewards has shape {tuple(rewards.shape)}, expected [{penalty.shape[0]}] (like penalty)"
        )
    return rewards - penalty.sum(dim=-1).to(rewards.dtype)
