"""Custom evaluators: the user's ``score(sample, item)`` (sync or async) from a module or a file.

References: ``"pkg.module:function"``, ``"file:/path/eval.py:function"``, ``"/path/eval.py:function"``
or ``"/path/eval.py"`` (function ``score``), or ``path`` + ``function``. A dotted function name
(``Class.method``) walks attributes. An object that is not callable but has a ``score`` attribute
(an instance, a namespace) contributes that attribute.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from types import ModuleType
from typing import Any, Callable

from .options import ConfigError

__all__ = ["load_function", "parse_reference", "CustomEvaluator"]


def parse_reference(ref: str) -> tuple[str, str | None, str]:
    """(``"module"`` | ``"file"``, module name or None, path or "") plus the function, as
    ``(kind, target, function)``. Raises ConfigError on a malformed reference."""
    if not isinstance(ref, str) or not ref.strip():
        raise ConfigError("evaluator reference must be a non-empty string like 'pkg.module:score'")
    ref = ref.strip()
    if ref.startswith("file:"):
        ref = ref[len("file:"):]
    head, sep, tail = ref.rpartition(":")
    if sep and head and all(p.isidentifier() for p in tail.split(".")):
        target, function = head, tail
    else:
        target, function = ref, "score"
    if target.endswith(".py") or os.sep in target:
        return "file", target, function
    if not all(p.isidentifier() for p in target.split(".")):
        raise ConfigError(f"evaluator reference {ref!r}: {target!r} is neither a module name nor a .py path")
    return "module", target, function


def _load_file(path: str) -> ModuleType:
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise ConfigError(f"evaluator file {full} does not exist")
    name = "rft_evaluator_" + hashlib.sha256(full.encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, full)
    if spec is None or spec.loader is None:
        raise ConfigError(f"evaluator file {full} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ConfigError(f"evaluator file {full} failed to load: {type(exc).__name__}: {exc}") from exc
    return module


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ConfigError(f"cannot import evaluator module {name!r}: {exc}") from exc


def load_function(ref: str | None = None, *, path: str | None = None, function: str = "score") -> Callable[..., Any]:
    """The scoring callable named by ``ref`` (or by ``path`` + ``function``); checks that it takes
    ``(sample, item)``. Raises ConfigError with the reason."""
    if ref is not None:
        kind, target, function = parse_reference(ref)
        module = _load_file(target) if kind == "file" else _import(target)
        where = ref
    elif path is not None:
        module = _load_file(path)
        where = f"{path}:{function}"
    else:
        raise ConfigError("a custom evaluator needs 'entrypoint' (module:function) or 'file' (+ 'function')")
    obj: Any = module
    for part in function.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"evaluator {where!r}: {getattr(obj, '__name__', obj)!r} has no attribute {part!r}")
        obj = getattr(obj, part)
    if not callable(obj) and hasattr(obj, "score"):
        obj = obj.score
    if not callable(obj):
        raise ConfigError(f"evaluator {where!r} is not callable")
    try:
        inspect.signature(obj).bind(None, None)
    except TypeError:
        raise ConfigError(f"evaluator {where!r} must accept two positional arguments: score(sample, item)") from None
    except ValueError:
        pass  # no signature available (C functions): trust the call
    return obj


class CustomEvaluator:
    """Wraps a user function so the composite can call it; ``is_async`` tells how."""

    def __init__(self, fn: Callable[..., Any], source: str) -> None:
        self.fn = fn
        self.source = source
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))

    def score(self, sample: Any, item: Any) -> Any:
        """Calls the user's function (returns a coroutine when it is async)."""
        return self.fn(sample, item)

    def __repr__(self) -> str:
        return f"CustomEvaluator({self.source!r})"
