"""Registry of builtin evaluators, keyed by the name used in the RFTJob (``evaluator.builtin``).

Like the algorithm registries: typed, duplicates refused, unknown names listed in the error. The keys
equal the CRD enum ``BuiltinEvaluatorName`` (a test checks this).
"""

from __future__ import annotations

from typing import Any, Callable, Generic, Mapping, Protocol, TypeVar, runtime_checkable

from .types import Item, Sample

__all__ = ["Evaluator", "EvaluatorFactory", "Registry", "UnknownEvaluatorError", "BUILTINS", "register_builtin"]


@runtime_checkable
class Evaluator(Protocol):
    """What the composite calls. ``score`` may be sync or async and may return a float, bool, None,
    dict or ScoreResult (see ``normalise_result``). ``aclose`` (optional) releases resources."""

    def score(self, sample: Sample, item: Item) -> Any: ...


EvaluatorFactory = Callable[[Mapping[str, Any]], Evaluator]
"""Builds an evaluator from its camelCase ``config`` dict; raises ConfigError naming a bad field."""

T = TypeVar("T")


class UnknownEvaluatorError(KeyError):
    """An evaluator name that is not registered; the message lists the known names."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class Registry(Generic[T]):
    """A name → value map that refuses duplicates and lists the known names on a miss."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str, value: T) -> T:
        """Adds ``name``; raises ValueError if it is already registered."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string")
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items[name] = value
        return value

    def get(self, name: str) -> T:
        """The value for ``name``; raises UnknownEvaluatorError listing the registered names."""
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "(none)"
            raise UnknownEvaluatorError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items


BUILTINS: Registry[EvaluatorFactory] = Registry("builtin evaluator")


def register_builtin(name: str) -> Callable[[EvaluatorFactory], EvaluatorFactory]:
    """Class/function decorator: ``@register_builtin("math")`` on a factory taking the config dict."""

    def deco(factory: EvaluatorFactory) -> EvaluatorFactory:
        BUILTINS.register(name, factory)
        return factory

    return deco
