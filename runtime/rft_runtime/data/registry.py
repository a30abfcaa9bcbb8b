"""Registry of builtin datasets, keyed by name.

A builder is ``fn(n: int, seed: int, **options) -> list[Task]``: it must return exactly ``n`` tasks
and the same tasks for the same ``(n, seed, options)``. Duplicate names are refused and an unknown
name is answered with the list of known ones.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from .task import DatasetError, Task

__all__ = ["DatasetBuilder", "register_dataset", "get_dataset", "list_datasets", "load_builtin"]


class DatasetBuilder(Protocol):
    """Signature of a builtin dataset builder."""

    def __call__(self, n: int, seed: int, **options: Any) -> list[Task]: ...


_REGISTRY: dict[str, DatasetBuilder] = {}


def register_dataset(name: str) -> Callable[[DatasetBuilder], DatasetBuilder]:
    """Decorator registering a builder under ``name``; a second registration of a name raises."""

    def deco(fn: DatasetBuilder) -> DatasetBuilder:
        if not name or not isinstance(name, str):
            raise ValueError("dataset name must be a non-empty string")
        if name in _REGISTRY:
            raise ValueError(f"builtin dataset {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return deco


def list_datasets() -> list[str]:
    """Names of the builtin datasets, sorted."""
    return sorted(_REGISTRY)


def get_dataset(name: str) -> DatasetBuilder:
    """The builder registered under ``name``; raises :class:`DatasetError` listing known names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise DatasetError(
            f"unknown builtin dataset {name!r}; known datasets: {', '.join(list_datasets())}"
        ) from None


def load_builtin(name: str, n: int, seed: int = 0, **options: Any) -> list[Task]:
    """Build ``n`` tasks of builtin dataset ``name`` with ``seed`` (deterministic)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise DatasetError(f"builtin dataset {name!r}: field 'n' must be an integer >= 0, got {n!r}")
    tasks = get_dataset(name)(n, seed, **options)
    if len(tasks) != n:
        raise DatasetError(f"builtin dataset {name!r} returned {len(tasks)} tasks, expected {n}")
    return tasks
