"""DAPO overlong reward shaping (Yu et al. 2025, §3.4, eq. 13 "soft overlong punishment").

With ``L_max = max_tokens`` and ``L_cache = buffer_len``::

    R_length(y) = 0                                    if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
                = -1                                   if |y| > L_max

multiplied by ``penalty_factor`` and added to the task reward.
"""

from __future__ import annotations

from typing import overload

import torch


def _check(max_tokens: int, buffer_len: int, penalty_factor: float) -> None:
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
    if not isinstance(buffer_len, int) or buffer_len < 1:
        raise ValueError(f"buffer_len must be an int >= 1, got {buffer_len!r}")
    if buffer_len >= max_tokens:
        raise ValueError(f"buffer_len ({buffer_len}) must be < max_tokens ({max_tokens})")
    if not penalty_factor >= 0:
        raise ValueError(f"penalty_factor must be >= 0, got {penalty_factor}")


@overload
def overlong_penalty(
    response_len: int, max_tokens: int, buffer_len: int, penalty_factor: float = 1.0
) -> float: ...


@overload
def overlong_penalty(
    response_len: torch.Tensor, max_tokens: int, buffer_len: int, penalty_factor: float = 1.0
) -> torch.Tensor: ...


def overlong_penalty(response_len, max_tokens, buffer_len, penalty_factor=1.0):  # type: ignore[no-untyped-def]
    """The (non-positive) length penalty of DAPO for one length (int → float) or many (Tensor).

    Raises:
        ValueError: ``max_tokens < 1``, ``buffer_len < 1``, ``buffer_len >= max_tokens``,
            ``penalty_factor < 0`` or a negative length.
    """
    _check(max_tokens, buffer_len, penalty_factor)
    start = max_tokens - buffer_len
    if isinstance(response_len, torch.Tensor):
        if bool((response_len < 0).any()):
            raise ValueError("response_len must be >= 0")
        x = response_len.to(torch.float64)
        pen = ((start - x) / buffer_len).clamp(min=-1.0, max=0.0)
        return (pen * penalty_factor).to(torch.get_default_dtype())
    n = int(response_len)
    if n < 0:
        raise ValueError(f"response_len must be >= 0, got {response_len}")
    if n <= start:
        return 0.0
    if n > max_tokens:
        return -float(penalty_factor)
    return (start - n) / buffer_len * float(penalty_factor)


def apply_overlong_penalty(
    rewards: torch.Tensor,
    response_len: torch.Tensor,
    max_tokens: int,
    buffer_len: int,
    penalty_factor: float = 1.0,
) -> torch.Tensor:
    """``rewards [N] + overlong_penalty(response_len [N])``; a NaN (None) reward stays NaN."""
    if rewards.shape != response_len.shape:
        raise ValueError(
            f"response_len has shape {tuple(response_len.shape)}, expected {tuple(rewards.shape)}"
        )
    return rewards + overlong_penalty(response_len, max_tokens, buffer_len, penalty_factor).to(rewards.dtype)
