"""Finding the model and its tokenizer from the runtime config (shared by every role).

Paths arrive resolved (:class:`rft_api.runtime.Paths`); the only thing resolved here is a builtin
model, which is built offline into the model cache on first use.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rft_api.layout import is_builtin_model
from rft_api.runtime import Paths

_NO_ADVICE = "TRANSFORMERS_NO_ADVISORY_WARNINGS"
_transformers_without_torch = False  # transformers was first imported under torch_hidden


class ModelLoadError(ValueError):
    """The model cannot be built from what the spec names (an architecture transformers does not know,
    weights that do not fit its config, LoRA target modules it does not have): no retry can load it."""


@contextlib.contextmanager
def torch_hidden(hide: bool = True) -> Iterator[None]:
    """Within it, ``import torch`` fails and torch looks absent to transformers (``sys.modules`` maps
    it to None, which the import system documents), so that transformers loads a tokenizer or a
    config without importing torch: about 0.4 GB less for a process that needs only those (the
    inference front end, a rollout worker with no user code). transformers keeps that answer for
    the rest of the process, so only for a process that never loads a model with it. Nothing is
    hidden where torch is already imported, or where transformers was imported with torch visible
    (it decided then that it would import torch, and hiding it now would fail its imports).
    transformers' advice that models will not be available is not printed."""
    global _transformers_without_torch
    if not hide or "torch" in sys.modules or ("transformers" in sys.modules and not _transformers_without_torch):
        yield
        return
    advisory, imported = os.environ.get(_NO_ADVICE), "transformers" in sys.modules
    sys.modules["torch"] = None  # type: ignore[assignment]
    os.environ[_NO_ADVICE] = "1"
    try:
        yield
    finally:
        if not imported and "transformers" in sys.modules:
            _transformers_without_torch = True
        if "torch" in sys.modules and sys.modules["torch"] is None:
            del sys.modules["torch"]
        if advisory is None:
            os.environ.pop(_NO_ADVICE, None)
        else:
            os.environ[_NO_ADVICE] = advisory


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


def load_tokenizer(model_dir: Path, tokenizer_dir: str | None = None, chat_template: str | None = None, *,
                   torch_free: bool = False) -> Any:
    """The tokenizer of the model (or of ``paths.tokenizer``), with an optional template override.
    ``torch_free``: without importing torch (:func:`torch_hidden`)."""
    src = tokenizer_dir or model_dir
    if tokenizer_dir and not Path(tokenizer_dir).is_dir():
        raise FileNotFoundError(f"spec.model.tokenizer: {tokenizer_dir} is not a directory")
    with torch_hidden(torch_free):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(src)
    if chat_template:
        tok.chat_template = chat_template
    return tok
