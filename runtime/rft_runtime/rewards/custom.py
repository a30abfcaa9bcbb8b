"""Custom evaluators: the user's ``score(sample, item)`` (sync or async) from a module or a file.

References: ``"pkg.module:function"``, ``"file:/path/eval.py:function"``, ``"/path/eval.py:function"``
or ``"/path/eval.py"`` (function ``score``), or ``path`` + ``function``. A dotted function name
(``Class.method``) walks attributes. An object that is not callable but has a ``score`` attribute
(an instance, a namespace) contributes that attribute. A path containing a separator is a file
even without ``.py`` (a ConfigMap key). Loading is shared with evaluator bundles:
:mod:`rft_runtime.usercode`.
"""

from __future__ import annotations

from typing import Any, Callable

from .. import usercode
from ..usercode import UserCodeError, is_coroutine_callable, takes_positional
from .options import ConfigError

__all__ = ["load_function", "parse_reference", "CustomEvaluator"]

_WHAT = "evaluator"  # the word rft_runtime.usercode puts in its messages


def parse_reference(ref: str) -> tuple[str, str | None, str]:
    """(``"module"`` | ``"file"``, module name or None, path or "") plus the function, as
    ``(kind, target, function)``. Raises ConfigError on a malformed reference."""
    try:
        parsed = usercode.parse_reference(_strip_file_prefix(ref), what=_WHAT)
    except UserCodeError as exc:
        raise ConfigError(str(exc)) from None
    return parsed.kind, parsed.target, parsed.attribute or "score"


def _strip_file_prefix(ref: Any) -> Any:
    if isinstance(ref, str) and ref.strip().startswith("file:"):
        return ref.strip()[len("file:"):]
    return ref


def load_function(ref: str | None = None, *, path: str | None = None, function: str = "score") -> Callable[..., Any]:
    """The scoring callable named by ``ref`` (or by ``path`` + ``function``); checks that it takes
    ``(sample, item)``. Raises ConfigError with the reason."""
    try:
        if ref is not None:
            where = ref
            _, _, obj = usercode.resolve(_strip_file_prefix(ref), default="score", what=_WHAT)
        elif path is not None:
            where = f"{path}:{function}"
            module = usercode.load_file(path, reference=where, what=_WHAT)
            obj = usercode.get_attribute(module, function, reference=where, owner=path)
        else:
            raise ConfigError("a custom evaluator needs 'entrypoint' (module:function) or 'file' (+ 'function')")
    except UserCodeError as exc:
        raise ConfigError(str(exc)) from exc
    if not callable(obj) and hasattr(obj, "score"):
        obj = obj.score
    if not callable(obj):
        raise ConfigError(f"evaluator {where!r} is not callable")
    if not takes_positional(obj, 2):
        raise ConfigError(f"evaluator {where!r} must accept two positional arguments: score(sample, item)")
    return obj


class CustomEvaluator:
    """Wraps a user function so the composite can call it; ``is_async`` tells how."""

    def __init__(self, fn: Callable[..., Any], source: str) -> None:
        self.fn = fn
        self.source = source
        self.is_async = is_coroutine_callable(fn)

    def score(self, sample: Any, item: Any) -> Any:
        """Calls the user's function (returns a coroutine when it is async)."""
        return self.fn(sample, item)

    def __repr__(self) -> str:
        return f"CustomEvaluator({self.source!r})"
