"""Finding the model and its tokenizer from the runtime config (shared by every role).

Paths arrive resolved (:class:`rft_api.runtime.Paths`); the only thing resolved here is a builtin
model, which is built offline into the model cache on first use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rft_api.layout import is_builtin_model
from rft_api.runtime import Paths


def resolve_model_dir(paths: Paths) -> Path:
    """The base model's directory: ``paths.model`` itself, or a builtin model built into
    ``paths.modelCache`` (or the default cache)."""
    if is_builtin_model(paths.model):
        from .builtin import resolve_builtin_model

        return Path(resolve_builtin_model(paths.model, paths.model_cache))
    path = Path(paths.model)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"spec.model.base: {path} is not a model directory (no config.json)")
    return path


def load_tokenizer(model_dir: Path, tokenizer_dir: str | None = None, chat_template: str | None = None) -> Any:
    """The tokenizer of the model (or of ``paths.tokenizer``), with an optional template override."""
    from transformers import AutoTokenizer

    src = tokenizer_dir or model_dir
    if tokenizer_dir and not Path(tokenizer_dir).is_dir():
        raise FileNotFoundError(f"spec.model.tokenizer: {tokenizer_dir} is not a directory")
    tok = AutoTokenizer.from_pretrained(src)
    if chat_template:
        tok.chat_template = chat_template
    return tok
