"""RL algorithm library (pure torch): registries keyed by name, as in verl's ``core_algos``.

Registries (unknown names raise :class:`UnknownNameError` listing the known ones; registering a
name twice raises :class:`DuplicateRegistrationError`):

* :data:`ADVANTAGE_ESTIMATORS` — ``grpo``, ``dr_grpo``, ``rloo``, ``reinforce_pp_baseline``
* :data:`POLICY_LOSSES` — ``ppo_clip``, ``gspo``, ``cispo``, ``reinforce``
* :data:`LOSS_AGGREGATIONS` — ``token-mean``, ``seq-mean-token-sum``, ``seq-mean-token-mean``,
  ``seq-mean-token-sum-norm``
* :data:`KL_ESTIMATORS` — ``k1``, ``k2``, ``k3``
* :data:`TIS_MODES` — ``truncate``, ``mask`` (levels :data:`TIS_LEVELS`: ``token``, ``sequence``)

The algorithm presets (``trainer.algorithm``: which estimator, loss and aggregation, with which
defaults) are data in the API, :data:`rft_api.presets.ALGORITHM_PRESETS`, resolved per job by
:func:`rft_api.presets.resolve_algorithm`; a test checks that every name they use is registered here.

One optimiser step, in order: rewards (+ :func:`apply_overlong_penalty`, + KL-in-reward) →
:func:`filter_groups` / :class:`DynamicSampler` → advantages (``valid`` masks the loss) →
:func:`compute_global_normaliser` over the whole batch → per micro-batch:
:func:`logprobs_from_logits` → policy loss → × :func:`tis_weights` → (+ :func:`kl_in_loss`) →
aggregation with the global normaliser → backward.
"""

from ._tensor import masked_mean, masked_sum
from .advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageConfig,
    AdvantageEstimator,
    AdvantageOutput,
    compute_advantages,
    group_key,
    rewards_tensor,
)
from .aggregation import LOSS_AGGREGATIONS, LossAggregation, aggregate_loss, compute_global_normaliser
from .dynamic_sampling import (
    DynamicSampler,
    FilterResult,
    SamplingResult,
    filter_groups,
    has_signal,
    rewards_of,
)
from .kl import KL_ESTIMATORS, KLEstimator, apply_kl_to_rewards, kl_in_loss, kl_reward_penalty
from .logits import entropy_from_logits, logprobs_from_logits
from .overlong import apply_overlong_penalty, overlong_penalty
from .policy_losses import POLICY_LOSSES, PolicyLoss, PolicyLossConfig, compute_policy_loss
from .registry import DuplicateRegistrationError, Registry, UnknownNameError
from .tis import TIS_LEVELS, TIS_MODES, TISOutput, tis_weights

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "TIS_LEVELS",
    "TIS_MODES",
    "AdvantageConfig",
    "AdvantageEstimator",
    "AdvantageOutput",
    "DuplicateRegistrationError",
    "DynamicSampler",
    "FilterResult",
    "KLEstimator",
    "LossAggregation",
    "PolicyLoss",
    "PolicyLossConfig",
    "Registry",
    "SamplingResult",
    "TISOutput",
    "UnknownNameError",
    "aggregate_loss",
    "apply_kl_to_rewards",
    "apply_overlong_penalty",
    "compute_advantages",
    "compute_global_normaliser",
    "compute_policy_loss",
    "entropy_from_logits",
    "filter_groups",
    "group_key",
    "has_signal",
    "kl_in_loss",
    "kl_reward_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "overlong_penalty",
    "rewards_of",
    "rewards_tensor",
    "tis_weights",
]
