"""Evaluator bundles: the user's `rollout(task, client)` and/or `score(sample, item)`.

Reference forms accepted by `load_bundle` (see docs/evaluator-bundles.md):
- `pkg.module` or `/path/bundle.py`: the module's top-level `rollout` and/or `score` (a reference
  containing a path separator is a file even without the `.py` suffix, like a ConfigMap key);
- `pkg.module:name` or `/path/bundle.py:name`: `name` is either a function (the rollout function)
  or an object (class, instance, namespace) with `rollout` and/or `score` attributes.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

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
        return _is_async(self.rollout)

    @property
    def score_is_async(self) -> bool:
        """True when `score` is a coroutine function."""
        return _is_async(self.score)


def load_bundle(ref: str) -> EvaluatorBundle:
    """Load a bundle from `module[:name]` or `path.py[:name]`; raises BundleError with the reason."""
    if not isinstance(ref, str) or not ref.strip():
        raise BundleError("bundle reference must be a non-empty string")
    target, attr = _split(ref.strip())
    is_file = target.endswith(".py") or os.sep in target  # a ConfigMap key may lack the .py suffix
    module = _load_file(target, ref) if is_file else _import(target, ref)
    if attr is None:
        return EvaluatorBundle(ref, rollout=getattr(module, "rollout", None), score=getattr(module, "score", None))
    if not hasattr(module, attr):
        raise BundleError(f"bundle {ref!r}: {target} has no attribute {attr!r}")
    obj = getattr(module, attr)
    if inspect.isfunction(obj) or inspect.ismethod(obj):
        return EvaluatorBundle(ref, rollout=obj)
    rollout, score = getattr(obj, "rollout", None), getattr(obj, "score", None)
    if rollout is None and score is None:
        raise BundleError(f"bundle {ref!r}: {attr!r} is neither a function nor an object with rollout/score")
    return EvaluatorBundle(ref, rollout=rollout, score=score)


def _split(ref: str) -> tuple[str, str | None]:
    # A Windows-style drive letter is not a concern here; the last ':' separates the attribute.
    head, sep, tail = ref.rpartition(":")
    if sep and tail.isidentifier() and head:
        return head, tail
    return ref, None


def _import(name: str, ref: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise BundleError(f"bundle {ref!r}: cannot import module {name!r}: {e}") from e


def _load_file(path: str, ref: str) -> ModuleType:
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise BundleError(f"bundle {ref!r}: file {full} does not exist")
    name = "rft_bundle_" + hashlib.sha256(full.encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.machinery.SourceFileLoader(name, full)
    spec = importlib.util.spec_from_file_location(name, full, loader=loader)
    if spec is None or spec.loader is None:
        raise BundleError(f"bundle {ref!r}: {full} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(full)
    if folder not in sys.path:
        sys.path.append(folder)  # sibling helper modules of a ConfigMap bundle
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise BundleError(f"bundle {ref!r}: executing {full} failed: {type(e).__name__}: {e}") from e
    return module


def _check_signature(source: str, what: str, fn: Any, params: tuple[str, str]) -> None:
    if not callable(fn):
        raise BundleError(f"bundle {source!r}: {what} is not callable")
    try:
        inspect.signature(fn).bind(*params)
    except TypeError:
        raise BundleError(
            f"bundle {source!r}: {what} must accept two positional arguments {what}({', '.join(params)})"
        ) from None
    except ValueError:
        return  # builtins without a signature: trust the call


def _is_async(fn: Any) -> bool:
    return fn is not None and (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)))
