"""Loss aggregation modes, registered in :data:`LOSS_AGGREGATIONS`.

Every mode has the signature::

    aggregate(per_token_loss[B, T], mask[B, T], global_normaliser: float | None = None,
              max_len: int | None = None) -> scalar Tensor

and an attribute ``unit`` ("token" or "sequence") saying what its normaliser counts.

Gradient accumulation (documented choice): the normaliser is the count over the GLOBAL batch —
every micro-batch of the optimiser step (and every data-parallel rank) — computed once, before
micro-batching, with :func:`compute_global_normaliser`. Each micro-batch then returns
``(sum of its terms) / global_normaliser``, so the sum of the micro-batch losses (and of their
gradients) equals the loss of the whole batch in one piece: 1×8 equals 8×1 up to float rounding.
Do not divide by the number of micro-batches; with DDP (which averages gradients over ranks)
multiply the loss by the world size. With ``global_normaliser=None`` the count of this call's
inputs is used (correct only without accumulation). Per-micro-batch token counts — what some
trainers do — make long and short micro-batches weigh the same, which is not the same objective.

What counts: a token counts where ``mask`` is True; a sequence counts when it has at least one
masked-in token (a sequence whose reward is None is fully masked and does not count).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, Protocol

import torch

from ._tensor import as_bool_mask, check_2d
from .registry import Registry

Unit = Literal["token", "sequence"]


class LossAggregation(Protocol):
    """Callable protocol of a registered loss aggregation (with its normaliser ``unit``)."""

    unit: Unit

    def __call__(
        self,
        per_token_loss: torch.Tensor,
        mask: torch.Tensor,
        global_normaliser: float | None = None,
        max_len: int | None = None,
    ) -> torch.Tensor: ...


LOSS_AGGREGATIONS: Registry[LossAggregation] = Registry("loss aggregation")


def _register(name: str, unit: Unit):  # type: ignore[no-untyped-def]
    def decorator(fn):  # type: ignore[no-untyped-def]
        fn.unit = unit
        return LOSS_AGGREGATIONS.register(name, fn)

    return decorator


def _prep(per_token_loss: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    check_2d("per_token_loss", per_token_loss)
    m = as_bool_mask(mask, per_token_loss)
    return torch.where(m, per_token_loss, torch.zeros_like(per_token_loss)), m


def _norm(
    global_normaliser: float | None, local: torch.Tensor, field: str = "global_normaliser"
) -> torch.Tensor | float:
    if global_normaliser is None:
        return local.clamp(min=1)
    if not float(global_normaliser) > 0:
        raise ValueError(f"{field} must be > 0, got {global_normaliser}")
    return float(global_normaliser)


@_register("token-mean", "token")
def token_mean(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    global_normaliser: float | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Token mean (DAPO, Yu et al. 2025, eq. 8): ``L = Σ_i Σ_t l_{i,t} / N_tokens``.

    ``N_tokens`` = valid tokens of the global batch (``global_normaliser``). Every token weighs the
    same, so long responses weigh more. Shapes: [B, T], [B, T] → scalar.
    """
    loss, m = _prep(per_token_loss, mask)
    return loss.sum() / _norm(global_normaliser, m.sum().to(loss.dtype))


@_register("seq-mean-token-sum", "sequence")
def seq_mean_token_sum(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    global_normaliser: float | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Sequence mean of token sums: ``L = (1/N_seq) Σ_i Σ_t l_{i,t}``.

    ``N_seq`` = sequences with >= 1 valid token in the global batch. Shapes: [B, T] → scalar.
    """
    loss, m = _prep(per_token_loss, mask)
    return loss.sum() / _norm(global_normaliser, m.any(dim=-1).sum().to(loss.dtype))


@_register("seq-mean-token-mean", "sequence")
def seq_mean_token_mean(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    global_normaliser: float | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Sequence mean of token means (GRPO, Shao et al. 2024, eq. 3; GSPO):
    ``L = (1/N_seq) Σ_i (1/|y_i|) Σ_t l_{i,t}``.

    ``|y_i|`` = valid tokens of sequence i (always local: a sequence is never split across
    micro-batches); ``N_seq`` = sequences with >= 1 valid token in the global batch.
    Shapes: [B, T] → scalar.
    """
    loss, m = _prep(per_token_loss, mask)
    lens = m.sum(dim=-1).to(loss.dtype)
    per_seq = loss.sum(dim=-1) / lens.clamp(min=1)
    return per_seq.sum() / _norm(global_normaliser, (lens > 0).sum().to(loss.dtype))


@_register("seq-mean-token-sum-norm", "sequence")
def seq_mean_token_sum_norm(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    global_normaliser: float | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025, eq. for the unbiased objective):
    ``L = (1/N_seq) Σ_i Σ_t l_{i,t} / L_max``.

    ``L_max`` (``max_len``) is a constant — the generation budget (maxOutputTokens) — never the
    padded width of a micro-batch, so the objective does not depend on padding or response length
    (verl divides by the padded width ``T``, which changes with micro-batching). ``max_len`` is
    required. ``N_seq`` = sequences with >= 1 valid token in the global batch.
    Shapes: [B, T] → scalar.
    """
    if max_len is None:
        raise ValueError(
            "max_len is required for seq-mean-token-sum-norm (a constant such as maxOutputTokens)"
        )
    if not int(max_len) > 0:
        raise ValueError(f"max_len must be > 0, got {max_len}")
    loss, m = _prep(per_token_loss, mask)
    n = _norm(global_normaliser, m.any(dim=-1).sum().to(loss.dtype))
    return loss.sum() / int(max_len) / n


def compute_global_normaliser(mode: str, masks: torch.Tensor | Iterable[torch.Tensor]) -> float:
    """The normaliser of aggregation ``mode`` over a whole batch, for gradient accumulation.

    Args:
        mode: a key of :data:`LOSS_AGGREGATIONS`.
        masks: the loss mask of the global batch [B, T], or the masks of all its micro-batches.

    Returns:
        valid-token count (unit "token") or count of sequences with >= 1 valid token
        (unit "sequence"); at least 1.0 so that an all-masked batch gives a zero loss.
    """
    unit = LOSS_AGGREGATIONS.get(mode).unit
    parts = [masks] if isinstance(masks, torch.Tensor) else list(masks)
    total = 0
    for m in parts:
        check_2d("mask", m)
        mb = m if m.dtype == torch.bool else m != 0
        total += int(mb.sum()) if unit == "token" else int(mb.any(dim=-1).sum())
    return float(max(total, 1))


def aggregate_loss(
    mode: str,
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    global_normaliser: float | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Look up ``mode`` in :data:`LOSS_AGGREGATIONS` and apply it."""
    return LOSS_AGGREGATIONS.get(mode)(per_token_loss, mask, global_normaliser, max_len)
