"""Settings of the engine chosen by an argument, else an environment variable, else a default."""

from __future__ import annotations

import os


def pick(value: str | None, *, name: str, env: str, choices: tuple[str, ...], default: str = "auto") -> str:
    """``value``, else ``$env``, else ``default``; anything not in ``choices`` is refused, naming where it
    came from (``name`` for the argument)."""
    picked = value if value is not None else os.environ.get(env, default)
    if picked not in choices:
        source = name if value is not None else f"${env}"
        raise ValueError(f"{source} must be one of {', '.join(choices)}; got {picked!r}")
    return picked
