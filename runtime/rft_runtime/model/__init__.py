"""The tiny model: byte-level tokenizer, deterministic build, warm start, builtin specs, CLI."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # this package never downloads anything


from .builtin import (  # noqa: E402
    BUILTIN_MODELS,
    DEFAULT_WARM_START_STEPS,
    default_cache_dir,
    is_builtin_spec,
    resolve_builtin_model,
)
from .cli import make_tiny_model_cli
from .tiny import TinyModelConfig, make_tiny_model
from .tokenizer import build_tokenizer, chat_template
from .warm_start import WarmStartResult, encode_sft_example, warm_start

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_WARM_START_STEPS",
    "TinyModelConfig",
    "WarmStartResult",
    "build_tokenizer",
    "chat_template",
    "default_cache_dir",
    "encode_sft_example",
    "is_builtin_spec",
    "make_tiny_model",
    "make_tiny_model_cli",
    "resolve_builtin_model",
    "warm_start",
]
