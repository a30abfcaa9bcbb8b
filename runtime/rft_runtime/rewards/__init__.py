"""Rewards: the reward contract, builtin evaluators, custom evaluators, composites and the service.

Contract (contract 3 in docs/architecture.md): ``score(sample, item) -> float | None`` (sync or async); None
means not applicable and is left out of group baselines. See ``types.py``.
"""

from .composite import CompositeEvaluator, Slot
from .config import EvaluatorEntry, RewardConfig, api_key_env_name, from_runtime_config, from_spec, load_reward_config
from .custom import CustomEvaluator, load_function
from .factory import build_composite, build_evaluator
from .options import ConfigError
from .registry import BUILTINS, Evaluator, Registry, UnknownEvaluatorError, register_builtin
from .service import RewardService
from .types import ERROR_KINDS, ErrorKind, EvaluatorError, Item, Sample, ScoreResult, normalise_result

__all__ = [
    "CompositeEvaluator", "Slot", "EvaluatorEntry", "RewardConfig", "api_key_env_name", "load_reward_config",
    "from_runtime_config", "from_spec", "CustomEvaluator", "load_function", "build_composite", "build_evaluator", "ConfigError",
    "BUILTINS", "Evaluator", "Registry", "UnknownEvaluatorError", "register_builtin", "RewardService",
    "ERROR_KINDS", "ErrorKind", "EvaluatorError", "Item", "Sample", "ScoreResult", "normalise_result",
]
