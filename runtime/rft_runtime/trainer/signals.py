"""From rewards to advantages for one step, and the statistics reported about them.

Order (as in the algorithms library): task rewards → DAPO overlong shaping (when configured) →
KL-in-reward penalty (when ``kl.placement == "reward"``) → advantage estimator (registry). A
``None`` reward stays NaN throughout and is excluded from baselines (its advantage is 0 and the
sequence is masked out of the loss).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from ..algos import (
    AdvantageConfig,
    AdvantageOutput,
    apply_kl_to_rewards,
    apply_overlong_penalty,
    compute_advantages,
    kl_reward_penalty,
    rewards_tensor,
)
from .batch import TrainBatch, TrainSequence


def shaped_rewards(
    seqs: Sequence[TrainSequence],
    algorithm: Any,
    max_tokens: int,
    *,
    batch: TrainBatch | None = None,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rewards [N] (NaN for None) after overlong shaping and KL-in-reward."""
    r = rewards_tensor([s.reward for s in seqs], dtype=torch.float64)
    if algorithm.overlong_buffer_tokens:
        lens = torch.tensor([s.model_tokens for s in seqs], dtype=torch.long)
        r = apply_overlong_penalty(r, lens, max_tokens, int(algorithm.overlong_buffer_tokens),
                                   float(algorithm.overlong_penalty_factor)).to(torch.float64)
    if algorithm.kl_coef > 0 and algorithm.kl_placement == "reward":
        if batch is None or old_logprobs is None or ref_logprobs is None:
            raise ValueError("KL in the reward needs the batch, old and reference log-probs")
        pen = kl_reward_penalty(old_logprobs, ref_logprobs, batch.loss_mask, algorithm.kl_estimator,
                                float(algorithm.kl_coef))
        r = apply_kl_to_rewards(r, pen.to(torch.float64))
    return r


def advantages(seqs: Sequence[TrainSequence], rewards: torch.Tensor, algorithm: Any) -> AdvantageOutput:
    """The registry estimator of the algorithm over groups ``"{task_key}:{trajectory}"`` (token
    counts are the model tokens of each sequence, for estimators that weigh by tokens).

    A step-wise trajectory's later samples (``trajectory_step > 0``) take its first sample's advantage:
    the estimator sees each trajectory once (with the model tokens of all its samples), so a trajectory
    of several calls weighs in its group's baseline as much as one of a single call (rLLM's broadcast)."""
    lead_of: dict[tuple[str, str], int] = {}
    leads: list[int] = []
    follows: list[int] = []
    tokens: list[float] = []
    for i, s in enumerate(seqs):
        key = (s.episode_id, s.group)
        if s.trajectory_step == 0 or key not in lead_of:
            lead_of[key] = len(leads)
            leads.append(i)
            tokens.append(0.0)
        follows.append(lead_of[key])
        tokens[lead_of[key]] += s.model_tokens
    idx = torch.tensor(leads, dtype=torch.long)
    out = compute_advantages(algorithm.advantage_estimator, rewards[idx], [seqs[i].group for i in leads],
                             cfg=AdvantageConfig(whiten=algorithm.advantage_whitening),
                             token_counts=torch.tensor(tokens, dtype=torch.float64))
    back = torch.tensor(follows, dtype=torch.long)
    return AdvantageOutput(out.advantages.to(torch.float32)[back], out.valid[back])


def _stats(prefix: str, values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / n
    return {f"{prefix}_mean": mean, f"{prefix}_std": math.sqrt(var), f"{prefix}_min": min(values),
            f"{prefix}_max": max(values)}


def reward_metrics(seqs: Sequence[TrainSequence], evaluators: Sequence[str] = ()) -> dict[str, float]:
    """Reward statistics over every sequence generated in the step (``reward_mean``,
    ``reward_std``, ``reward_min``, ``reward_max``, ``reward_none_frac``) and per evaluator
    (``reward/<name>``: the mean of each evaluator's own reward, from the episode metrics the
    reward composite writes under the evaluator's name) and per task domain (``domain/<d>/mean``,
    ``domain/<d>/std`` of the rewards; ``domain/<d>/samples``, ``domain/<d>/response_len_mean`` and
    ``domain/<d>/truncated_frac`` of every sequence); ``rollout/retokenize_drift`` when the episodes
    measured it (``rollout.tokens: recompute``)."""
    vals = [s.reward for s in seqs if s.reward is not None]
    out = _stats("reward", vals)
    out["reward_none_frac"] = 1.0 - len(vals) / max(len(seqs), 1)
    per_eval: dict[str, list[float]] = {}
    seen: set[str] = set()
    for s in seqs:
        if s.episode_id in seen:
            continue
        seen.add(s.episode_id)
        for name in evaluators:
            v = s.metrics.get(name)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
                per_eval.setdefault(name, []).append(float(v))
    for name, vs in per_eval.items():
        out[f"reward/{name}"] = sum(vs) / len(vs)
    drift = [s.metrics["retokenize_drift"] for s in {s.episode_id: s for s in seqs}.values()
             if "retokenize_drift" in s.metrics]
    if drift:  # rollout.tokens recompute: the share of rebuilt turns whose ids are not those sampled
        out["rollout/retokenize_drift"] = sum(drift) / len(drift)
    per_domain: dict[str, list[float]] = {}
    domain_seqs: dict[str, list[TrainSequence]] = {}
    for s in seqs:
        domain_seqs.setdefault(s.domain, []).append(s)
        if s.reward is not None:
            per_domain.setdefault(s.domain, []).append(s.reward)
    for domain, vs in sorted(per_domain.items()):
        stats = _stats("x", vs)
        out[f"domain/{domain}/mean"], out[f"domain/{domain}/std"] = stats["x_mean"], stats["x_std"]
    for domain, ds in sorted(domain_seqs.items()):  # how each domain's samples looked
        out[f"domain/{domain}/samples"] = float(len(ds))
        out[f"domain/{domain}/response_len_mean"] = sum(s.model_tokens for s in ds) / len(ds)
        out[f"domain/{domain}/truncated_frac"] = sum(bool(s.truncated) for s in ds) / len(ds)
    return out


def advantage_metrics(adv: AdvantageOutput) -> dict[str, float]:
    """Statistics of the valid advantages (``adv_mean``, ``adv_std``, ``adv_min``, ``adv_max``,
    ``adv_abs_mean``, ``adv_zero_frac``, ``adv_valid_frac``)."""
    v = adv.advantages[adv.valid].double().tolist()
    out = _stats("adv", v)
    if v:
        out["adv_abs_mean"] = sum(abs(x) for x in v) / len(v)
        out["adv_zero_frac"] = sum(1 for x in v if x == 0.0) / len(v)
    out["adv_valid_frac"] = float(adv.valid.float().mean()) if adv.valid.numel() else 0.0
    return out


def length_metrics(seqs: Sequence[TrainSequence]) -> dict[str, float]:
    """Response length statistics (model tokens) and the share truncated at maxTokens."""
    lens = [float(s.model_tokens) for s in seqs]
    out = _stats("response_len", lens)
    out["truncated_frac"] = sum(1 for s in seqs if s.truncated) / max(len(seqs), 1)
    return out


def staleness_metrics(seqs: Sequence[TrainSequence], current_version: int) -> dict[str, float]:
    """How many versions behind the policy that sampled each sequence is."""
    st = [float(current_version - s.version) for s in seqs if s.version is not None]
    if not st:
        return {}
    return {"staleness_mean": sum(st) / len(st), "staleness_max": max(st)}
