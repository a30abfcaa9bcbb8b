"""Building evaluators from configuration entries."""

from __future__ import annotations

from typing import Any

from . import builtins as _builtins  # noqa: F401  (registers the builtins)
from .composite import CompositeEvaluator, Slot
from .config import EvaluatorEntry, RewardConfig
from .custom import CustomEvaluator, load_function
from .eval_protocol import EvalProtocolEvaluator
from .options import ConfigError
from .registry import BUILTINS

__all__ = ["build_evaluator", "build_composite"]


def build_evaluator(entry: EvaluatorEntry) -> Any:
    """The evaluator object for one entry; ConfigError names the entry on bad settings."""
    try:
        if entry.kind == "builtin":
            assert entry.builtin is not None
            return BUILTINS.get(entry.builtin)(entry.config)
        if entry.kind == "eval_protocol":
            return EvalProtocolEvaluator.load(path=entry.path, module=entry.entrypoint, test=entry.function or None)
        if entry.kind == "entrypoint":
            return CustomEvaluator(load_function(entry.entrypoint), entry.entrypoint or "")
        return CustomEvaluator(load_function(path=entry.path, function=entry.function), f"{entry.path}:{entry.function}")
    except ConfigError as exc:
        raise ConfigError(f"evaluator {entry.name!r}: {exc}") from None


def build_composite(config: RewardConfig) -> CompositeEvaluator:
    """A CompositeEvaluator for a whole reward config."""
    slots = [Slot(name=e.name, evaluator=build_evaluator(e), weight=e.weight,
                  timeout_seconds=e.timeout_seconds or config.timeout_seconds,
                  domains=frozenset(e.domains) if e.domains is not None else None, reward_range=e.reward_range)
             for e in config.evaluators]
    return CompositeEvaluator(slots, on_error=config.on_error, sync_workers=max(4, config.concurrency))
