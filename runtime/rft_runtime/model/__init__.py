"""The tiny model: byte-level tokenizer, deterministic build, warm start, builtin specs, CLI.

Names are imported on first use (:pep:`562`): resolving a cached builtin model (``rft run`` does it
before any role starts) reads only file names, while building one or warm-starting it imports torch
and transformers. The warm-start function is ``rft_runtime.model.warm_start.warm_start`` (the
package attribute ``warm_start`` is its module)."""

import importlib
import os
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # this package never downloads anything

_HOMES = {
    "BUILTIN_MODELS": "builtin",
    "DEFAULT_WARM_START_STEPS": "builtin",
    "default_cache_dir": "builtin",
    "is_builtin_spec": "builtin",
    "resolve_builtin_model": "builtin",
    "make_tiny_model_cli": "cli",
    "TinyModelConfig": "tiny",
    "make_tiny_model": "tiny",
    "build_tokenizer": "tokenizer",
    "chat_template": "tokenizer",
    "WarmStartResult": "warm_start",
    "encode_sft_example": "warm_start",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{home}", __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
