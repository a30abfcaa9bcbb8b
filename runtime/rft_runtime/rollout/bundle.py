"""Evaluator bundles: the user's `rollout(task, client)` and/or `score(sample, item)`.

Reference forms accepted by `load_bundle` (see docs/evaluator-bundles.md):
- `pkg.module` or `/path/bundle.py`: the module's top-level `rollout` and/or `score` (a reference
  containing a path separator is a file even without the `.py` suffix, like a ConfigMap key);
- `pkg.module:name` or `/path/bundle.py:name`: `name` is either a function (the rollout function)
  or an object (class, instance, namespace) with `rollout` and/or `score` attributes.
Parsing and loading are shared with custom reward evaluators: `rft_runtime.usercode`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

from .. import usercode
from ..usercode import UserCodeError, is_coroutine_callable, takes_positional
from .errors import BundleError


@dataclass(frozen=True)
class EvaluatorBundle:
    """A loaded bundle. Either function may be sync or async; at least one is set."""

    source: str
    rollout: Callable[..., Any] | None = None
    score: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        if self.rollout is None and self.score is None:
            raise BundleError(f"bundle {self.source!r} defines neither rollout(task, client) nor score(sample, item)")
        if self.rollout is not None:
            _check_signature(self.source, "rollout", self.rollout, ("task", "client"))
        if self.score is not None:
            _check_signature(self.source, "score", self.score, ("sample", "item"))

    @property
    def rollout_is_async(self) -> bool:
        """True when `rollout` is a coroutine function."""
        return is_coroutine_callable(self.rollout)

    @property
    def score_is_async(self) -> bool:
        """True when `score` is a coroutine function."""
        return is_coroutine_callable(self.score)


def load_bundle(ref: str) -> EvaluatorBundle:
    """Load a bundle from `module[:name]` or `path.py[:name]`; raises BundleError with the reason."""
    if not isinstance(ref, str) or not ref.strip():
        raise BundleError("bundle reference must be a non-empty string")
    try:
        parsed = usercode.parse_reference(ref)
        if parsed.attribute is not None and "." in parsed.attribute:
            raise UserCodeError(ref, f"{parsed.attribute!r} must be a single name (a function or an object "
                                     "with rollout/score), not a dotted path")
        _, module, obj = usercode.resolve(parsed)
    except UserCodeError as e:
        raise BundleError(f"bundle {e}") from e
    attr = parsed.attribute
    if attr is None:
        return EvaluatorBundle(ref, rollout=getattr(module, "rollout", None), score=getattr(module, "score", None))
    if inspect.isfunction(obj) or inspect.ismethod(obj):
        return EvaluatorBundle(ref, rollout=obj)
    rollout, score = getattr(obj, "rollout", None), getattr(obj, "score", None)
    if rollout is None and score is None:
        raise BundleError(f"bundle {ref!r}: {attr!r} is neither a function nor an object with rollout/score")
    return EvaluatorBundle(ref, rollout=rollout, score=score)


def _check_signature(source: str, what: str, fn: Any, params: tuple[str, str]) -> None:
    if not callable(fn):
        raise BundleError(f"bundle {source!r}: {what} is not callable")
    if not takes_positional(fn, len(params)):
        raise BundleError(
            f"bundle {source!r}: {what} must accept two positional arguments {what}({', '.join(params)})"
        )
