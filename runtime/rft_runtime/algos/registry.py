"""A small typed registry keyed by name (the pattern of verl's ``core_algos``).

Every algorithm family (advantage estimators, policy losses, loss aggregations, KL estimators,
presets, TIS modes) lives in one :class:`Registry`. Registering a name twice is refused with
:class:`DuplicateRegistrationError`; looking up an unknown name raises :class:`UnknownNameError`
whose message lists every known name, so a typo in a manifest is answered with the valid choices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar, overload

T = TypeVar("T")


class DuplicateRegistrationError(ValueError):
    """A name was registered twice in the same registry."""


class UnknownNameError(ValueError, KeyError):
    """A name is not in the registry; the message lists the known names.

    Subclasses both ``ValueError`` (bad configuration value) and ``KeyError`` (mapping lookup).
    """

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """A name → entry mapping that refuses duplicates and lists known names on a miss.

    Args:
        kind: what the entries are, used in error messages (e.g. ``"advantage estimator"``).
        entry_type: optional type every entry must be an instance of (checked on registration);
            when ``None`` entries must be callable.
    """

    def __init__(self, kind: str, entry_type: type | None = None) -> None:
        self.kind = kind
        self._entry_type = entry_type
        self._entries: dict[str, T] = {}

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, entry: T) -> T: ...

    def register(self, name: str, entry: T | None = None):  # type: ignore[no-untyped-def]
        """Register ``entry`` under ``name``; without ``entry`` acts as a decorator.

        Raises:
            DuplicateRegistrationError: ``name`` is already registered.
            TypeError: the name is not a non-empty string, or the entry has the wrong type.
        """
        if entry is None:

            def decorator(obj: T) -> T:
                self._add(name, obj)
                return obj

            return decorator
        self._add(name, entry)
        return entry

    def _add(self, name: str, entry: T) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if self._entry_type is not None:
            if not isinstance(entry, self._entry_type):
                raise TypeError(
                    f"{self.kind} {name!r} must be a {self._entry_type.__name__}, "
                    f"got {type(entry).__name__}"
                )
        elif not callable(entry):
            raise TypeError(f"{self.kind} {name!r} must be callable, got {type(entry).__name__}")
        if name in self._entries:
            raise DuplicateRegistrationError(
                f"{self.kind} {name!r} is already registered ({self._entries[name]!r}); "
                "registering it again is refused"
            )
        self._entries[name] = entry

    def get(self, name: str) -> T:
        """Return the entry for ``name``.

        Raises:
            UnknownNameError: with the sorted list of known names.
        """
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            known = ", ".join(sorted(self._entries))
            raise UnknownNameError(f"unknown {self.kind} {name!r}; known: {known}") from None

    __getitem__ = get

    def names(self) -> tuple[str, ...]:
        """Registered names, in registration order."""
        return tuple(self._entries)

    keys = names

    def items(self) -> list[tuple[str, T]]:
        """(name, entry) pairs in registration order."""
        return list(self._entries.items())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._entries)})"


def check_choice(field: str, value: str, choices: tuple[str, ...] | list[str]) -> str:
    """Return ``value`` if it is one of ``choices``; else raise ``ValueError`` naming ``field``."""
    if value not in choices:
        raise ValueError(f"{field} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return value
