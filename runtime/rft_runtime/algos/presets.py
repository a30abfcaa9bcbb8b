"""Algorithm presets, registered in :data:`ALGORITHMS` (the ``trainer.algorithm`` CRD enum).

A preset names the registered parts and their defaults; the trainer may override any default
(e.g. ``preset.policy_loss_config(clip_high=0.3)``). The values equal the API's
``rft_api.presets.ALGORITHM_PRESETS``, so the manifest's
defaults and the runtime's cannot drift apart: the entries are registered from that table.

| preset       | advantages            | policy loss | aggregation             | clip low/high |
|--------------|-----------------------|-------------|-------------------------|---------------|
| grpo         | grpo                  | ppo_clip    | token-mean              | 0.2 / 0.2     |
| dr_grpo      | dr_grpo               | ppo_clip    | seq-mean-token-sum-norm | 0.2 / 0.2     |
| dapo         | grpo                  | ppo_clip    | token-mean              | 0.2 / 0.28    |
| gspo         | grpo                  | gspo        | seq-mean-token-mean     | 3e-4 / 4e-4   |
| cispo        | grpo                  | cispo       | token-mean              | 0.99 / 4.0    |
| rloo         | rloo                  | ppo_clip    | token-mean              | 0.2 / 0.2     |
| reinforce_pp | reinforce_pp_baseline | ppo_clip    | token-mean              | 0.2 / 0.2     |

Notes: ``grpo`` aggregates with token-mean (verl's default and DAPO's finding) rather than the
paper's per-sequence mean (``seq-mean-token-mean``; choose it with ``loss_aggregation``). Dual clip
is off by default everywhere (set ``dual_clip_c``, e.g. verl's 3.0). ``cispo``'s weight lies in
[0.01, 5.0]: lower bound effectively off as in MiniMax-M1, cap 5 as TRL's default absolute cap.
``dapo`` alone turns on dynamic sampling and overlong shaping. All presets are group-relative
(samplesPerPrompt >= 2): ``reinforce_pp`` uses REINFORCE++-*baseline*, which subtracts the group
mean.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .advantages import ADVANTAGE_ESTIMATORS
from .aggregation import LOSS_AGGREGATIONS
from .policy_losses import POLICY_LOSSES, PolicyLossConfig
from .registry import Registry


class _Keep:
    """Sentinel type: "keep the preset's value"."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP = _Keep()


@dataclass(frozen=True)
class AlgorithmPreset:
    """One named algorithm: which registered parts it combines, and its defaults.

    Attributes:
        name: the registry key (``trainer.algorithm``).
        advantage_estimator: key of ``ADVANTAGE_ESTIMATORS``.
        policy_loss: key of ``POLICY_LOSSES``.
        loss_aggregation: key of ``LOSS_AGGREGATIONS`` (default; may be overridden).
        clip_low, clip_high, dual_clip_c: defaults of :class:`PolicyLossConfig`.
        dynamic_sampling: DAPO dynamic sampling on by default.
        overlong_shaping: DAPO overlong reward shaping on by default.
        group_relative: advantages need >= 2 samples per prompt.
        reference: the paper the preset follows.
    """

    name: str
    advantage_estimator: str
    policy_loss: str
    loss_aggregation: str
    clip_low: float
    clip_high: float
    dual_clip_c: float | None
    dynamic_sampling: bool
    overlong_shaping: bool
    group_relative: bool
    reference: str

    def __post_init__(self) -> None:
        ADVANTAGE_ESTIMATORS.get(self.advantage_estimator)
        POLICY_LOSSES.get(self.policy_loss)
        LOSS_AGGREGATIONS.get(self.loss_aggregation)
        self.policy_loss_config()  # validates the clip constants

    @property
    def min_samples_per_prompt(self) -> int:
        """2 for group-relative presets, else 1."""
        return 2 if self.group_relative else 1

    def policy_loss_config(
        self,
        clip_low: float | None = None,
        clip_high: float | None = None,
        dual_clip_c: float | None | _Keep = KEEP,
    ) -> PolicyLossConfig:
        """The preset's :class:`PolicyLossConfig` with optional overrides.

        ``clip_low``/``clip_high``: ``None`` keeps the preset default (handy for optional manifest
        fields). ``dual_clip_c``: omitted keeps the default; ``None`` disables dual clip.
        """
        return PolicyLossConfig(
            clip_low=self.clip_low if clip_low is None else clip_low,
            clip_high=self.clip_high if clip_high is None else clip_high,
            dual_clip_c=self.dual_clip_c if isinstance(dual_clip_c, _Keep) else dual_clip_c,
        )

    def with_overrides(self, **changes: object) -> AlgorithmPreset:
        """A copy with fields replaced (validated again); unknown fields raise ``TypeError``."""
        return replace(self, **changes)  # type: ignore[arg-type]


ALGORITHMS: Registry[AlgorithmPreset] = Registry("algorithm", entry_type=AlgorithmPreset)


def _register_api_presets() -> None:
    """Register one preset per entry of the API's table, the single source of truth.

    ``rft_api.presets`` is pure data (the operator needs it without torch); here each entry is
    checked against the registries (``__post_init__``) and gets its runtime helpers.
    """
    from rft_api.constants import GROUP_RELATIVE_ALGORITHMS
    from rft_api.presets import ALGORITHM_PRESETS

    for name, p in ALGORITHM_PRESETS.items():
        ALGORITHMS.register(name, AlgorithmPreset(
            name=name, advantage_estimator=p.advantage_estimator, policy_loss=p.policy_loss,
            loss_aggregation=p.loss_aggregation, clip_low=p.clip_low, clip_high=p.clip_high,
            dual_clip_c=p.dual_clip_c, dynamic_sampling=p.dynamic_sampling,
            overlong_shaping=p.overlong_shaping, group_relative=name in GROUP_RELATIVE_ALGORITHMS,
            reference=p.reference,
        ))


_register_api_presets()


def get_algorithm(name: str) -> AlgorithmPreset:
    """The preset ``name``; unknown names raise an error listing the known ones."""
    return ALGORITHMS.get(name)
