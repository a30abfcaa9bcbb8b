"""Shape checks and masked reductions shared by the algorithm modules (internal)."""

from __future__ import annotations

import torch

# exp() of a log-ratio larger than this overflows float32 soon after; every ratio is computed from a
# log-ratio clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] (verl uses the same bound, 20).
LOG_RATIO_CLAMP = 20.0


def as_bool_mask(mask: torch.Tensor, like: torch.Tensor, name: str = "mask") -> torch.Tensor:
    """Return ``mask`` as a bool tensor after checking it has the shape of ``like``."""
    if mask.shape != like.shape:
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, expected {tuple(like.shape)}")
    return mask if mask.dtype == torch.bool else mask != 0


def check_2d(name: str, t: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``t`` is a [B, T] tensor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must have shape [B, T], got {tuple(t.shape)}")


def check_same_shape(ref_name: str, ref: torch.Tensor, **others: torch.Tensor) -> None:
    """Raise ``ValueError`` naming the first tensor whose shape differs from ``ref``."""
    for name, t in others.items():
        if t.shape != ref.shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)}, expected {tuple(ref.shape)} (like {ref_name})"
            )


def token_advantages(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Broadcast per-sequence advantages [B] to [B, T]; pass [B, T] through after a shape check."""
    if advantages.dim() == 1:
        if advantages.shape[0] != like.shape[0]:
            raise ValueError(
                f"advantages has shape {tuple(advantages.shape)}, expected [{like.shape[0]}] "
                f"or {list(like.shape)}"
            )
        return advantages.unsqueeze(-1).expand_as(like)
    if advantages.shape != like.shape:
        raise ValueError(
            f"advantages has shape {tuple(advantages.shape)}, expected [{like.shape[0]}] "
            f"or {list(like.shape)}"
        )
    return advantages


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is true (masked entries may hold NaN; they are ignored)."""
    zeroed = torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))
    return zeroed.sum() if dim is None else zeroed.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over ``mask``; 0 where nothing is selected."""
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1).to(values.dtype)


def _masked_extreme(values: torch.Tensor, mask: torch.Tensor, largest: bool) -> torch.Tensor:
    """Max (or min) of ``values`` over ``mask`` without a host sync; 0 when nothing is selected."""
    if values.numel() == 0:
        return torch.zeros((), dtype=values.dtype, device=values.device)
    inf = float("-inf") if largest else float("inf")
    fill = torch.full((), inf, dtype=values.dtype, device=values.device)
    picked = torch.where(mask, values, fill)
    out = picked.amax() if largest else picked.amin()
    return torch.where(mask.any(), out, torch.zeros_like(out))


def masked_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Max of ``values`` over ``mask``; 0 when nothing is selected."""
    return _masked_extreme(values, mask, largest=True)


def masked_min(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Min of ``values`` over ``mask``; 0 when nothing is selected."""
    return _masked_extreme(values, mask, largest=False)


def masked_log_ratio(
    logprobs: torch.Tensor, base_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``logprobs - base_logprobs`` clamped to ±LOG_RATIO_CLAMP, 0 at masked positions."""
    diff = torch.where(mask, logprobs - base_logprobs, torch.zeros_like(logprobs))
    return diff.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
