"""Algorithm presets: what `trainer.algorithm` means, as pure data (no torch).

A preset names registry entries of the runtime (advantage estimator, policy loss, loss aggregation)
and defaults that the spec may override. The runtime's registries must contain every name used here
(a test checks), and `ALGORITHM_PRESETS` keys equal the CRD enum.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pydantic import BaseModel, ConfigDict

from .spec import RFTJobSpec


@dataclass(frozen=True)
class Preset:
    advantage_estimator: str
    policy_loss: str
    loss_aggregation: str
    clip_low: float
    clip_high: float
    dual_clip_c: Optional[float] = None
    dynamic_sampling: bool = False
    overlong_shaping: bool = False
    reference: str = ""


ALGORITHM_PRESETS: dict[str, Preset] = {
    "grpo": Preset("grpo", "ppo_clip", "token-mean", 0.2, 0.2,
                   reference="Shao et al. 2024, DeepSeekMath (GRPO)"),
    "dr_grpo": Preset("dr_grpo", "ppo_clip", "seq-mean-token-sum-norm", 0.2, 0.2,
                      reference="Liu et al. 2025, Understanding R1-Zero-like training (Dr. GRPO)"),
    "dapo": Preset("grpo", "ppo_clip", "token-mean", 0.2, 0.28, dynamic_sampling=True, overlong_shaping=True,
                   reference="Yu et al. 2025, DAPO (clip-higher, dynamic sampling, token-level loss, overlong shaping)"),
    "gspo": Preset("grpo", "gspo", "seq-mean-token-mean", 3e-4, 4e-4,
                   reference="Zheng et al. 2025, Group Sequence Policy Optimization"),
    "cispo": Preset("grpo", "cispo", "token-mean", 0.99, 4.0,
                    reference="MiniMax 2025, MiniMax-M1 (CISPO): lower bound effectively off, upper bound tuned"),
    "rloo": Preset("rloo", "ppo_clip", "token-mean", 0.2, 0.2,
                   reference="Ahmadian et al. 2024, Back to Basics (RLOO)"),
    "reinforce_pp": Preset("reinforce_pp_baseline", "ppo_clip", "token-mean", 0.2, 0.2,
                           reference="Hu 2025, REINFORCE++ (baseline variant: group mean, then batch whitening)"),
}


class ResolvedAlgorithm(BaseModel):
    """The concrete algorithm a job runs: its preset with the spec's overrides applied."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    advantage_estimator: str
    policy_loss: str
    loss_aggregation: str
    clip_low: float
    clip_high: float
    kl_coef: float
    kl_estimator: str
    kl_placement: str
    dynamic_sampling: bool
    dynamic_sampling_max_rounds: int
    overlong_penalty_factor: float
    old_logprobs: str
    advantage_whitening: str = "token"
    dual_clip_c: Optional[float] = None
    overlong_buffer_tokens: Optional[int] = None
    importance_sampling: Optional[dict] = None

    def to_dict(self) -> dict:
        return self.model_dump()


def resolve_algorithm(spec: RFTJobSpec) -> ResolvedAlgorithm:
    t = spec.trainer
    p = ALGORITHM_PRESETS[t.algorithm]
    ds_enabled = t.dynamic_sampling.enabled if t.dynamic_sampling else p.dynamic_sampling
    ds_rounds = t.dynamic_sampling.max_rounds if t.dynamic_sampling else 3
    if t.overlong is not None:
        buf, factor = t.overlong.buffer_tokens, t.overlong.penalty_factor
    elif p.overlong_shaping and spec.rollout.max_tokens >= 4:
        buf, factor = spec.rollout.max_tokens // 4, 1.0
    else:
        buf, factor = None, 1.0
    return ResolvedAlgorithm(
        name=t.algorithm,
        advantage_estimator=t.advantage_estimator or p.advantage_estimator,
        policy_loss=t.policy_loss or p.policy_loss,
        loss_aggregation=t.loss_aggregation or p.loss_aggregation,
        clip_low=t.clip.low if t.clip else p.clip_low,
        clip_high=t.clip.high if t.clip else p.clip_high,
        dual_clip_c=t.clip.dual_clip_c if t.clip else p.dual_clip_c,
        kl_coef=t.kl.coef, kl_estimator=t.kl.estimator, kl_placement=t.kl.placement,
        dynamic_sampling=ds_enabled, dynamic_sampling_max_rounds=ds_rounds,
        overlong_buffer_tokens=buf, overlong_penalty_factor=factor,
        importance_sampling=t.importance_sampling.model_dump() if t.importance_sampling else None,
        old_logprobs=t.old_logprobs,
        advantage_whitening=t.advantage_whitening,
    )
