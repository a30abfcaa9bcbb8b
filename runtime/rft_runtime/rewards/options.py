"""Reading an evaluator's camelCase ``config`` dict with errors that name the field."""

from __future__ import annotations

import builtins
from typing import Any, Mapping, Sequence

__all__ = ["ConfigError", "Options"]

_MISSING = object()


class ConfigError(ValueError):
    """Bad evaluator or reward-service configuration; the message names the field."""


class Options:
    """Typed accessors over one config dict. ``done()`` refuses keys nobody asked for (typos)."""

    def __init__(self, config: Mapping[str, Any] | None, where: str) -> None:
        if config is None:
            config = {}
        if not isinstance(config, Mapping):
            raise ConfigError(f"{where}: must be an object, got {type(config).__name__}")
        self._config = dict(config)
        self._where = where
        self._seen: set[str] = set()

    def _raw(self, key: str, default: Any) -> Any:
        self._seen.add(key)
        value = self._config.get(key, _MISSING)
        if value is _MISSING or value is None:
            if default is _MISSING:
                raise ConfigError(f"{self._where}: field {key!r} is required")
            return default
        return value

    def error(self, key: str, message: str) -> ConfigError:
        """A ConfigError for ``key`` (for checks done by the caller)."""
        return ConfigError(f"{self._where}: field {key!r} {message}")

    def str(self, key: str, default: Any = _MISSING, *, choices: Sequence[str] | None = None) -> Any:
        value = self._raw(key, default)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.error(key, f"must be a string, got {type(value).__name__}")
        if choices is not None and value not in choices:
            raise self.error(key, f"must be one of {', '.join(choices)}; got {value!r}")
        return value

    def number(self, key: builtins.str, default: Any = _MISSING, *, minimum: float | None = None,
               maximum: float | None = None, integer: bool = False) -> Any:
        value = self._raw(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(key, f"must be a number, got {type(value).__name__}")
        if integer and int(value) != value:
            raise self.error(key, f"must be an integer, got {value}")
        if minimum is not None and value < minimum:
            raise self.error(key, f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise self.error(key, f"must be <= {maximum}, got {value}")
        return int(value) if integer else float(value)

    def bool(self, key: builtins.str, default: Any = _MISSING) -> Any:
        value = self._raw(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {value!r}")
        return value

    def str_list(self, key: builtins.str, default: Any = _MISSING) -> Any:
        value = self._raw(key, default)
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise self.error(key, "must be a list of strings")
        return list(value)

    def any(self, key: builtins.str, default: Any = _MISSING) -> Any:
        return self._raw(key, default)

    def done(self) -> None:
        """Raises ConfigError for keys that no accessor read (most likely a typo)."""
        unknown = sorted(set(self._config) - self._seen)
        if unknown:
            known = ", ".join(sorted(self._seen)) or "(none)"
            raise ConfigError(f"{self._where}: unknown field(s) {', '.join(unknown)}; known: {known}")
