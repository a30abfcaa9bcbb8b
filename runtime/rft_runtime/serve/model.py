"""Loading a Hugging Face causal LM and its tokenizer for serving (offline, never from a hub)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .codec import TextCodec, eos_ids

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class LoadedModel:
    """A model ready to serve, with what the server needs to know about it."""

    model: Any
    codec: TextCodec
    model_dir: str
    vocab_size: int
    eos_token_ids: frozenset[int]
    pad_token_id: int
    max_model_len: int
    device: torch.device
    dtype: torch.dtype


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` picks CUDA when available, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, config: Any, device: torch.device) -> torch.dtype:
    """``auto`` keeps the checkpoint's dtype, except half precision on the CPU becomes float32."""
    if dtype != "auto":
        if dtype not in _DTYPES:
            raise ValueError(f"--dtype must be one of auto, {', '.join(_DTYPES)}; got {dtype!r}")
        return _DTYPES[dtype]
    cfg = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(cfg, str):
        cfg = _DTYPES.get(cfg, torch.float32)
    if not isinstance(cfg, torch.dtype):
        cfg = torch.float32
    if device.type == "cpu" and cfg == torch.float16:
        return torch.float32
    return cfg


def load_model(model_dir: str | os.PathLike, *, dtype: str = "auto", device: str = "auto",
               max_model_len: int | None = None) -> LoadedModel:
    """Load model and tokenizer from ``model_dir`` with transformers (HF_HUB_OFFLINE=1)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"--model {model_dir}: no config.json (expected a Hugging Face model directory)")
    dev = resolve_device(device)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    torch_dtype = resolve_dtype(dtype, config, dev)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, local_files_only=True,
                                                 attn_implementation="sdpa")
    model.to(dev).eval()  # type: ignore[arg-type]  # transformers types `to` for a dtype only
    model.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    try:
        gen = GenerationConfig.from_pretrained(path, local_files_only=True)
        gen_eos = gen.eos_token_id
    except OSError:
        gen_eos = None
    text_cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab_size = int(text_cfg.vocab_size)
    eos = eos_ids(tokenizer.eos_token_id, gen_eos, getattr(text_cfg, "eos_token_id", None))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else getattr(text_cfg, "pad_token_id", None)
    if pad is None:
        pad = min(eos) if eos else 0
    limit = int(getattr(text_cfg, "max_position_embeddings", 0) or 0) or None
    if max_model_len is None:
        if limit is None:
            raise ValueError("the model config has no max_position_embeddings; pass --max-model-len")
        max_model_len = limit
    elif limit is not None and max_model_len > limit:
        raise ValueError(f"--max-model-len {max_model_len} exceeds the model's max_position_embeddings {limit}")
    if getattr(text_cfg, "use_sliding_window", False) and getattr(text_cfg, "sliding_window", None):
        raise ValueError("sliding-window attention is not supported by the builtin server")
    return LoadedModel(model=model, codec=TextCodec(tokenizer, vocab_size), model_dir=str(path),
                       vocab_size=vocab_size, eos_token_ids=eos, pad_token_id=int(pad),
                       max_model_len=int(max_model_len), device=dev, dtype=torch_dtype)
