"""The reward contract (contract 3 in docs/architecture.md, example 8).

An evaluator scores one sample of one task: ``score(sample, item) -> float | None`` (sync or async).
``None`` means "not applicable": the sample is left out of its group's baseline. Evaluators may also
return a bool, a :class:`ScoreResult` or a dict with ``reward``/``score``; :func:`normalise_result`
turns any of these into a :class:`ScoreResult`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from rft_runtime.types import Sample, _field, _Mappable

__all__ = [
    "ErrorKind", "ERROR_KINDS", "Sample", "Item", "ScoreResult", "EvaluatorError", "normalise_result",
]

ErrorKind = Literal["timeout", "runtime_error", "parse_error"]
ERROR_KINDS: tuple[str, ...] = ("timeout", "runtime_error", "parse_error")


@dataclass
class Item(_Mappable):
    """The task a sample answers: its ``ground_truth`` (any JSON value), ``metadata`` and ``domain``."""

    ground_truth: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    domain: str = "default"
    task_id: str | None = None
    messages: list[dict[str, Any]] | None = None

    @classmethod
    def from_any(cls, obj: Any) -> "Item":
        """An Item from an Item, a dict, a ``rft_runtime.data.Task`` or any object with these fields."""
        if isinstance(obj, Item):
            return obj
        if obj is None:
            return cls()
        metadata = _field(obj, "metadata") or {}
        if not isinstance(metadata, Mapping):
            raise ValueError("item: field 'metadata' must be an object")
        domain = _field(obj, "domain") or "default"
        if not isinstance(domain, str):
            raise ValueError("item: field 'domain' must be a string")
        messages = _field(obj, "messages")
        if messages is None and isinstance(_field(obj, "prompt"), str):
            messages = [{"role": "user", "content": _field(obj, "prompt")}]
        task_id = _field(obj, "task_id")
        return cls(
            ground_truth=_field(obj, "ground_truth"),
            metadata=dict(metadata),
            domain=domain,
            task_id=None if task_id is None else str(task_id),
            messages=messages,
        )


class EvaluatorError(Exception):
    """Raised by an evaluator when it cannot score: ``kind`` is the error flag to report.

    The composite applies the ``onError`` policy to it (reward 0.0, or excluded as None), exactly as
    it does for timeouts and unexpected exceptions.
    """

    def __init__(self, kind: ErrorKind, message: str) -> None:
        if kind not in ERROR_KINDS:
            raise ValueError(f"EvaluatorError kind must be one of {ERROR_KINDS}, got {kind!r}")
        super().__init__(message)
        self.kind = kind


@dataclass
class ScoreResult:
    """The outcome of scoring one sample.

    ``reward`` is a finite float or None (not applicable); ``error`` is None or one of
    ``timeout``, ``runtime_error``, ``parse_error``; ``metrics`` are numbers for logging.
    """

    reward: float | None
    reason: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    error: ErrorKind | None = None

    def __post_init__(self) -> None:
        if self.error is not None and self.error not in ERROR_KINDS:
            raise ValueError(f"ScoreResult.error must be None or one of {ERROR_KINDS}, got {self.error!r}")
        if self.reward is not None:
            if isinstance(self.reward, bool) or not isinstance(self.reward, (int, float)):
                raise ValueError(f"ScoreResult.reward must be a float or None, got {type(self.reward).__name__}")
            if not math.isfinite(self.reward):
                raise ValueError(f"ScoreResult.reward must be finite, got {self.reward}")
            self.reward = float(self.reward)
        for key, value in self.metrics.items():
            if isinstance(value, bool):
                self.metrics[key] = float(value)
            elif not isinstance(value, (int, float)):
                raise ValueError(f"ScoreResult.metrics[{key!r}] must be a number, got {type(value).__name__}")
            else:
                self.metrics[key] = float(value)

    def to_dict(self) -> dict[str, Any]:
        """The wire form of contract 3."""
        return {"reward": self.reward, "reason": self.reason, "metrics": dict(self.metrics), "error": self.error}

    @classmethod
    def failure(cls, kind: ErrorKind, reason: str, reward: float | None = 0.0) -> "ScoreResult":
        """A result carrying an error flag (reward 0.0 unless told otherwise)."""
        return cls(reward=reward, reason=reason, error=kind)


def _number(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"{what} is not finite ({value})")
        return float(value)
    raise ValueError(f"{what} must be a number, bool or None, got {type(value).__name__}")


def normalise_result(value: Any) -> ScoreResult:
    """Turns whatever an evaluator returned into a :class:`ScoreResult`.

    Accepted: None, a bool (1.0/0.0), an int/float (finite), a ScoreResult, a dict with ``reward``
    (or ``score``) and optional ``reason``/``metrics``/``error``, or an object with ``score`` and
    optional ``reason``/``metrics`` attributes (Eval Protocol's EvaluateResult shape).
    Raises ValueError for anything else, including NaN and infinities.
    """
    if isinstance(value, ScoreResult):
        return value
    if value is None or isinstance(value, (bool, int, float)):
        return ScoreResult(reward=_number(value, "reward"))
    if isinstance(value, Mapping):
        if "reward" in value:
            reward = value["reward"]
        elif "score" in value:
            reward = value["score"]
        else:
            raise ValueError("evaluator returned a dict without 'reward' (or 'score')")
        metrics = value.get("metrics") or {}
        if not isinstance(metrics, Mapping):
            raise ValueError("evaluator result field 'metrics' must be an object")
        return ScoreResult(reward=_number(reward, "reward"), reason=str(value.get("reason") or ""),
                           metrics=_metric_numbers(metrics), error=value.get("error"))
    if hasattr(value, "score"):
        metrics = getattr(value, "metrics", None) or {}
        return ScoreResult(reward=_number(value.score, "score"),
                           reason=str(getattr(value, "reason", "") or ""),
                           metrics=_metric_numbers(metrics) if isinstance(metrics, Mapping) else {})
    raise ValueError(f"evaluator returned {type(value).__name__}; expected float, bool, None, dict or ScoreResult")


def _metric_numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Keeps numeric metrics; nested results (``{"score": x}``) contribute their score."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, (bool, int, float)):
            out[str(key)] = float(value)
        elif isinstance(value, Mapping) and isinstance(value.get("score"), (int, float)):
            out[str(key)] = float(value["score"])
        elif isinstance(getattr(value, "score", None), (int, float)):
            out[str(key)] = float(value.score)
    return out
