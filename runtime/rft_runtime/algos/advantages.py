"""Outcome advantage estimators, registered in :data:`ADVANTAGE_ESTIMATORS`.

Every estimator has the signature::

    estimator(rewards: Tensor[N], group_ids: Sequence[str], valid: Tensor[N] | None = None,
              cfg: AdvantageConfig | None = None) -> AdvantageOutput(advantages[N], valid[N])

* ``rewards`` — one float per sequence; ``NaN`` stands for a ``None`` reward ("not applicable").
* ``group_ids`` — one key per sequence, ``"{task_id}:{trajectory.name}"`` (see :func:`group_key`);
  sequences with equal keys form a group (the n samples of one prompt).
* ``valid`` — optional extra bool mask (False = leave this sequence out, like a ``None`` reward).

Rules shared by all estimators (documented choices):

* A sequence whose reward is ``None``/NaN (or whose ``valid`` is False) is left out of its group's
  baseline and statistics, gets advantage exactly 0, and is reported ``valid=False`` in the output:
  the trainer must drop it from the loss mask (so it does not count in the aggregation normaliser).
* A group with fewer than 2 valid members has no baseline: its valid member gets advantage 0 (and
  stays ``valid=True``). verl instead uses mean 0 / std 1 for singleton groups (advantage = raw
  reward); we do not, because a lone sample carries no group-relative signal.
* Statistics are computed in float64 and the result is cast back to the rewards' dtype.
* ``±inf`` rewards are an error (``ValueError``), not a silent NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch

from .registry import Registry


def group_key(task_id: str, trajectory_name: str) -> str:
    """The group key for advantages: ``"{task_id}:{trajectory.name}"`` (rLLM's convention)."""
    return f"{task_id}:{trajectory_name}"


@dataclass(frozen=True)
class AdvantageConfig:
    """Numerical constants of the estimators.

    Attributes:
        std_eps: added to the group std in ``grpo`` (``(r - mean) / (std + std_eps)``). We use
            verl's 1e-6; TRL uses 1e-4, which gives measurably smaller advantages for groups with
            tiny spread (for std 1e-3 the advantage is 0.999 of the exactly normalised value with
            1e-6, but 0.909 with 1e-4).
        whiten_eps: added to the batch variance in ``reinforce_pp_baseline``
            (``x / sqrt(var + whiten_eps)``), as verl's ``masked_whiten`` (1e-8).
        whiten: the unit ``reinforce_pp_baseline`` whitens over: ``token`` (verl and OpenRLHF: the
            sequence score broadcast to its response tokens, so a long response weighs more in the
            batch statistics) or ``sequence`` (every sequence weighs once).
    """

    std_eps: float = 1e-6
    whiten_eps: float = 1e-8
    whiten: str = "token"

    def __post_init__(self) -> None:
        if not self.std_eps >= 0:
            raise ValueError(f"std_eps must be >= 0, got {self.std_eps}")
        if not self.whiten_eps >= 0:
            raise ValueError(f"whiten_eps must be >= 0, got {self.whiten_eps}")
        if self.whiten not in ("token", "sequence"):
            raise ValueError(f"whiten must be 'token' or 'sequence', got {self.whiten!r}")


class AdvantageOutput(NamedTuple):
    """Per-sequence advantages [N] (0 where invalid) and the validity mask [N] (bool)."""

    advantages: torch.Tensor
    valid: torch.Tensor


class AdvantageEstimator(Protocol):
    """Callable protocol of a registered advantage estimator."""

    def __call__(
        self,
        rewards: torch.Tensor,
        group_ids: Sequence[str],
        valid: torch.Tensor | None = None,
        cfg: AdvantageConfig | None = None,
        token_counts: torch.Tensor | None = None,
    ) -> AdvantageOutput: ...


ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")


class _Groups(NamedTuple):
    """Internal: float64 rewards (0 where invalid), validity, group index per sequence, counts."""

    r: torch.Tensor  # [N] float64, invalid entries set to 0
    valid: torch.Tensor  # [N] bool
    index: torch.Tensor  # type: ignore[assignment]  # [N] long, group index (shadows tuple.index)
    count: torch.Tensor  # type: ignore[assignment]  # [G] float64, valid members per group (shadows tuple.count)
    n_groups: int


def _prepare(
    rewards: torch.Tensor, group_ids: Sequence[str], valid: torch.Tensor | None
) -> _Groups:
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 1:
        shape = tuple(rewards.shape) if isinstance(rewards, torch.Tensor) else type(rewards).__name__
        raise ValueError(f"rewards must be a 1-D tensor [N], got {shape}")
    if not rewards.is_floating_point():
        raise ValueError(f"rewards must be a float tensor (NaN = None), got {rewards.dtype}")
    n = rewards.shape[0]
    if len(group_ids) != n:
        raise ValueError(f"group_ids has {len(group_ids)} entries, rewards has {n}")
    if bool(torch.isinf(rewards).any()):
        raise ValueError("rewards must be finite, or NaN for a None reward; got ±inf")
    ok = ~torch.isnan(rewards)
    if valid is not None:
        if valid.shape != rewards.shape:
            raise ValueError(f"valid has shape {tuple(valid.shape)}, expected {tuple(rewards.shape)}")
        ok = ok & valid.to(torch.bool)
    index_of: dict[str, int] = {}
    idx = [index_of.setdefault(g, len(index_of)) for g in group_ids]
    index = torch.tensor(idx, dtype=torch.long, device=rewards.device)
    zero = torch.zeros((), dtype=torch.float64, device=rewards.device)
    r = torch.where(ok, rewards.to(torch.float64), zero)
    count = torch.zeros(len(index_of), dtype=torch.float64, device=rewards.device)
    count.index_add_(0, index, ok.to(torch.float64))
    return _Groups(r, ok, index, count, len(index_of))


def _group_mean(g: _Groups) -> torch.Tensor:
    """Per-sequence mean of the valid rewards of its group [N] (0 for empty groups)."""
    total = torch.zeros(g.n_groups, dtype=torch.float64, device=g.r.device).index_add_(0, g.index, g.r)
    return (total / g.count.clamp(min=1))[g.index]


def _group_std(g: _Groups, mean: torch.Tensor) -> torch.Tensor:
    """Per-sequence Bessel-corrected std of its group's valid rewards [N] (0 for groups < 2)."""
    dev = torch.where(g.valid, g.r - mean, torch.zeros_like(g.r))
    ss = torch.zeros(g.n_groups, dtype=torch.float64, device=g.r.device).index_add_(0, g.index, dev * dev)
    var = ss / (g.count - 1).clamp(min=1)
    return var.sqrt()[g.index]


def _finish(adv: torch.Tensor, g: _Groups, rewards: torch.Tensor) -> AdvantageOutput:
    """Zero advantages of invalid sequences and of groups with < 2 valid members; cast back."""
    enough = g.count[g.index] >= 2
    adv = torch.where(g.valid & enough, adv, torch.zeros_like(adv))
    return AdvantageOutput(adv.to(rewards.dtype), g.valid.clone())


@ADVANTAGE_ESTIMATORS.register("grpo")
def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: Sequence[str],
    valid: torch.Tensor | None = None,
    cfg: AdvantageConfig | None = None,
    token_counts: torch.Tensor | None = None,  # unused: every sequence weighs once here
) -> AdvantageOutput:
    """GRPO (Shao et al. 2024, DeepSeekMath, eq. for outcome supervision).

    ``A_i = (r_i - mean(r_group)) / (std(r_group) + eps)`` with the Bessel-corrected (unbiased,
    ``n - 1``) std over the group's valid rewards and ``eps = cfg.std_eps`` (1e-6, verl's value;
    TRL uses 1e-4). Shapes: rewards [N] → advantages [N], valid [N].
    """
    cfg = cfg or AdvantageConfig()
    g = _prepare(rewards, group_ids, valid)
    mean = _group_mean(g)
    std = _group_std(g, mean)
    return _finish((g.r - mean) / (std + cfg.std_eps), g, rewards)


@ADVANTAGE_ESTIMATORS.register("dr_grpo")
def dr_grpo_advantages(
    rewards: torch.Tensor,
    group_ids: Sequence[str],
    valid: torch.Tensor | None = None,
    cfg: AdvantageConfig | None = None,
    token_counts: torch.Tensor | None = None,  # unused: every sequence weighs once here
) -> AdvantageOutput:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): no std normalisation.

    ``A_i = r_i - mean(r_group)`` over the group's valid rewards. Shapes: rewards [N] → [N].
    """
    g = _prepare(rewards, group_ids, valid)
    return _finish(g.r - _group_mean(g), g, rewards)


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo_advantages(
    rewards: torch.Tensor,
    group_ids: Sequence[str],
    valid: torch.Tensor | None = None,
    cfg: AdvantageConfig | None = None,
    token_counts: torch.Tensor | None = None,  # unused: every sequence weighs once here
) -> AdvantageOutput:
    """RLOO (Ahmadian et al. 2024, "Back to Basics"; Kool et al. 2019): leave-one-out baseline.

    ``A_i = r_i - (1 / (n - 1)) * sum_{j != i} r_j = n / (n - 1) * (r_i - mean(r_group))`` with n
    the number of valid rewards in the group. Shapes: rewards [N] → [N].
    """
    g = _prepare(rewards, group_ids, valid)
    total = torch.zeros(g.n_groups, dtype=torch.float64, device=g.r.device).index_add_(0, g.index, g.r)
    n = g.count[g.index]
    baseline = (total[g.index] - g.r) / (n - 1).clamp(min=1)
    return _finish(g.r - baseline, g, rewards)


@ADVANTAGE_ESTIMATORS.register("reinforce_pp_baseline")
def reinforce_pp_baseline_advantages(
    rewards: torch.Tensor,
    group_ids: Sequence[str],
    valid: torch.Tensor | None = None,
    cfg: AdvantageConfig | None = None,
    token_counts: torch.Tensor | None = None,
) -> AdvantageOutput:
    """REINFORCE++-baseline (Hu et al. 2025, "REINFORCE++"): group mean removed, batch whitened.

    ``x_i = r_i - mean(r_group)``; then ``A_i = (x_i - μ) / sqrt(σ² + eps)`` with the batch
    statistics over every valid sequence of a group with >= 2 valid members (``eps = cfg.whiten_eps``):

    - ``cfg.whiten == "token"`` (verl's and OpenRLHF's ``masked_whiten`` of the token-broadcast
      scores): weights ``w_i = token_counts[i]`` (response tokens), ``μ = Σ w_i x_i / Σ w_i``,
      ``σ² = Σ w_i (x_i - μ)² / (Σ w_i - 1)``;
    - ``cfg.whiten == "sequence"``: ``w_i = 1`` (each sequence weighs once), same formulas.

    Singleton groups are excluded from the batch statistics and keep advantage 0; fewer than 2 units
    (tokens or sequences) in the statistics → all advantages 0. Shapes: rewards [N], token_counts
    [N] (required for ``token``) → [N].
    """
    cfg = cfg or AdvantageConfig()
    g = _prepare(rewards, group_ids, valid)
    x = g.r - _group_mean(g)
    used = g.valid & (g.count[g.index] >= 2)
    if cfg.whiten == "token":
        if token_counts is None or token_counts.shape != x.shape:
            raise ValueError("reinforce_pp_baseline with token whitening needs token_counts of shape [N]")
        w = token_counts.to(torch.float64) * used
    else:
        w = used.to(torch.float64)
    total = w.sum()
    if total < 2:
        return _finish(torch.zeros_like(x), g, rewards)
    mu = (w * x).sum() / total
    var = (w * (x - mu) ** 2).sum() / (total - 1)
    return _finish((x - mu) / torch.sqrt(var + cfg.whiten_eps), g, rewards)


def compute_advantages(
    name: str,
    rewards: torch.Tensor,
    group_ids: Sequence[str],
    valid: torch.Tensor | None = None,
    cfg: AdvantageConfig | None = None,
    token_counts: torch.Tensor | None = None,
) -> AdvantageOutput:
    """Look up estimator ``name`` in :data:`ADVANTAGE_ESTIMATORS` and apply it (``token_counts``:
    response tokens per sequence, used by estimators that weigh by tokens)."""
    fn: Callable[..., AdvantageOutput] = ADVANTAGE_ESTIMATORS.get(name)
    return fn(rewards, group_ids, valid, cfg, token_counts=token_counts)


def rewards_tensor(rewards: Sequence[float | None], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Convert Python rewards (``None`` = not applicable) to a float tensor with NaN for None."""
    return torch.tensor([float("nan") if r is None else float(r) for r in rewards], dtype=dtype)
