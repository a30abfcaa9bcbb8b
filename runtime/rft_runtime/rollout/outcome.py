"""What one rollout ended with: its trajectories, the bundle's return value, reward and errors.

Also the sample view handed to `score(sample, item)` and the interpretation of what `rollout` and
`score` return (see docs/evaluator-bundles.md).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from rft_runtime.rewards.types import normalise_result
from rft_runtime.types import ErrorFlags, Sample, TerminationReason

from .recorder import RecordedSample, RecordedTrajectory

RESULT_KEYS = frozenset({"reward", "metrics", "metadata", "output"})


def score_view(eid: str, last: RecordedSample, output: Any) -> Sample:
    """What ``score(sample, item)`` receives: the engine's :class:`~rft_runtime.types.Sample` of the
    rollout's last reply with its conversation filled in (``messages``, ``text`` of the reply), ``id``
    the episode id and ``output`` what the bundle's ``rollout`` returned."""
    return dataclasses.replace(
        last.sample,
        id=eid,
        text=last.message.get("content") or "",
        messages=[dict(m) for m in last.conversation.messages],
        output=output,
    )


@dataclass
class RunOutcome:
    """The state of one rollout after it ran (and after scoring)."""

    trajectories: list[RecordedTrajectory]
    output: Any = None
    reward: float | None = None
    has_reward: bool = False
    reason: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    errors: ErrorFlags = field(default_factory=ErrorFlags)
    termination: TerminationReason | None = None

    def fail(self, message: str, *, timeout: bool = False, runtime_error: bool = False,
             parse_error: bool = False) -> None:
        """Record an error (the first message wins); rollout errors unless another flag is given."""
        flags = {"timeout": timeout, "runtime_error": runtime_error, "parse_error": parse_error}
        update: dict[str, Any] = {k: True for k, v in flags.items() if v} or {"rollout_error": True}
        update["message"] = self.errors.message or message
        self.errors = self.errors.model_copy(update=update)
        if self.termination is None:
            self.termination = "timeout" if timeout else "error"

    @property
    def samples(self) -> list[RecordedSample]:
        """Every recorded sample, in recording order."""
        return sorted((s for t in self.trajectories for s in t.samples), key=lambda s: s.index)

    def apply_output(self, out: Any) -> None:
        """Interpret `rollout`'s return value: None, a reward, a dict of known keys, or an output."""
        try:
            if out is None:
                return
            if isinstance(out, (int, float)):
                self.reward, self.has_reward = _finite(out, "rollout reward"), True
                return
            if isinstance(out, Mapping):
                unknown = sorted(set(out) - RESULT_KEYS)
                if unknown:
                    raise ValueError(f"rollout returned unknown key(s) {unknown}; allowed: {sorted(RESULT_KEYS)}")
                if "reward" in out:
                    self.reward = None if out["reward"] is None else _finite(out["reward"], "rollout reward")
                    self.has_reward = True
                self.metrics.update(_numbers(out.get("metrics") or {}, "rollout metrics"))
                meta = out.get("metadata") or {}
                if not isinstance(meta, Mapping):
                    raise ValueError("rollout returned 'metadata' that is not a dict")
                self.metadata.update(meta)
                self.output = out.get("output")
                return
            self.output = out
        except ValueError as e:
            self.reward, self.has_reward = None, False
            self.fail(f"rollout_error: {e}")

    def apply_score(self, value: Any) -> None:
        """Interpret what a scorer returned (anything `rft_runtime.rewards.normalise_result` takes)."""
        try:
            result = normalise_result(value)
        except ValueError as e:
            self.fail(f"score_error: {e}", parse_error=True)
            return
        self.reward, self.has_reward = result.reward, True
        self.reason = result.reason or None
        self.metrics.update(result.metrics)
        if result.error is not None:
            self.fail(f"score_error: {result.reason or result.error}", **{result.error: True})


def _finite(v: Any, what: str) -> float:
    if not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{what} must be a finite number or None, got {v!r}")
    return float(v)


def _numbers(d: Any, what: str) -> dict[str, float]:
    if not isinstance(d, Mapping):
        raise ValueError(f"{what} must be a dict of numbers")
    return {str(k): _finite(v, f"{what}[{k!r}]") for k, v in d.items()}
