"""Reading new weights for ``/update_weights_from_disk``: full safetensors checkpoints or PEFT LoRA adapters.

A directory with ``adapter_config.json`` is a LoRA adapter: its deltas are merged into the *base*
weights (read again from the directory the server started with), so successive adapters never stack.
Anything else must hold ``*.safetensors`` files (one file or shards) of the full model.

Every name and shape is checked against the served model before anything is handed to the engine.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file

from ..model.weights_files import shard_path, weight_map
from .errors import WeightLoadError

_PEFT_PREFIX = "base_model.model."


def read_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of the ``*.safetensors`` files in ``path`` (shards listed by an index file when present)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({shard_path(path, f) for f in weight_map(index).values()})
    else:
        files = sorted(path.glob("*.safetensors"))
    files = [f for f in files if f.name != "adapter_model.safetensors"]
    if not files:
        raise WeightLoadError(f"model_path {path}: no *.safetensors weights found")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f), device="cpu"))
    return out


def check_against(weights: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor],
                  tied: set[str]) -> dict[str, torch.Tensor]:
    """Check names and shapes against the served model's state dict; ``tied`` names may be missing."""
    unexpected = sorted(set(weights) - set(reference))
    if unexpected:
        raise WeightLoadError(f"unexpected weights not in the served model: {unexpected[:5]}"
                              + (f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else ""))
    missing = sorted(set(reference) - set(weights) - tied)
    if missing:
        raise WeightLoadError(f"weights missing for the served model: {missing[:5]}"
                              + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    for name, t in weights.items():
        if tuple(t.shape) != tuple(reference[name].shape):
            raise WeightLoadError(f"weight {name}: shape {tuple(t.shape)} != served {tuple(reference[name].shape)}")
    return dict(weights)


def tied_names(model: torch.nn.Module) -> set[str]:
    """State-dict names that share storage with an earlier name (e.g. a tied lm_head)."""
    seen: dict[int, str] = {}
    tied = set()
    for name, t in model.state_dict().items():
        key = t.untyped_storage().data_ptr()
        if key in seen:
            tied.add(name)
        else:
            seen[key] = name
    return tied


def _pattern_value(patterns: Mapping[str, float], module: str, default: float) -> float:
    for pat, value in patterns.items():
        if re.fullmatch(rf"(.*\.)?{pat}", module):
            return value
    return default


def merge_lora(base: dict[str, torch.Tensor], adapter_dir: Path) -> dict[str, torch.Tensor]:
    """Return ``base`` with the PEFT LoRA adapter in ``adapter_dir`` merged in (W += scale * B @ A)."""
    cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    if cfg.get("peft_type", "LORA") != "LORA":
        raise WeightLoadError(f"adapter {adapter_dir}: peft_type {cfg.get('peft_type')!r} is not LORA")
    if cfg.get("use_dora"):
        raise WeightLoadError(f"adapter {adapter_dir}: DoRA adapters are not supported")
    file = adapter_dir / "adapter_model.safetensors"
    if not file.is_file():
        raise WeightLoadError(f"adapter {adapter_dir}: adapter_model.safetensors not found")
    tensors = load_file(str(file), device="cpu")
    r_default, alpha_default = float(cfg["r"]), float(cfg.get("lora_alpha", cfg["r"]))
    rslora, fan_in_fan_out = bool(cfg.get("use_rslora")), bool(cfg.get("fan_in_fan_out"))
    merged = dict(base)
    # Full weights saved with the adapter first (modules_to_save, embedding base layers), then the deltas.
    for key, t in tensors.items():
        if ".lora_" in key:
            continue
        name = key[len(_PEFT_PREFIX):] if key.startswith(_PEFT_PREFIX) else key
        for tag in (".modules_to_save.default", ".original_module", ".base_layer"):
            name = name.replace(tag, "")
        if name not in merged:
            raise WeightLoadError(f"adapter {adapter_dir}: saved module weight {name} is not in the base model")
        merged[name] = t
    for key, a in tensors.items():
        kind = "lora_A" if ".lora_A." in key else "lora_embedding_A" if ".lora_embedding_A" in key else None
        if kind is None:
            continue
        module_full = key.split(f".{kind}")[0]
        b_key = key.replace(kind, kind[:-1] + "B")
        if b_key not in tensors:
            raise WeightLoadError(f"adapter {adapter_dir}: {b_key} missing")
        module = module_full[len(_PEFT_PREFIX):] if module_full.startswith(_PEFT_PREFIX) else module_full
        target = f"{module}.weight"
        if target not in merged:
            raise WeightLoadError(f"adapter {adapter_dir}: target {target} is not a weight of the base model")
        r = _pattern_value(cfg.get("rank_pattern") or {}, module, r_default)
        alpha = _pattern_value(cfg.get("alpha_pattern") or {}, module, alpha_default)
        scale = alpha / (math.sqrt(r) if rslora else r)
        b = tensors[b_key]
        if kind == "lora_A":
            delta = b.float() @ a.float()
            if fan_in_fan_out:
                delta = delta.T
        else:  # embedding: A [r, vocab], B [hidden, r]
            delta = (b.float() @ a.float()).T
        w = merged[target]
        merged[target] = (w.float() + scale * delta).to(w.dtype)
    return merged


def read_weights(model_path: str, *, base_dir: str, model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], str]:
    """Read and check the weights at ``model_path``; returns them and ``"full"`` or ``"lora"``."""
    path = Path(model_path)
    if not path.is_dir():
        raise WeightLoadError(f"model_path {model_path} is not a directory")
    reference = model.state_dict()
    tied = tied_names(model)
    if (path / "adapter_config.json").is_file():
        base = read_safetensors_dir(Path(base_dir))
        return check_against(merge_lora(base, path), reference, tied), "lora"
    return check_against(read_safetensors_dir(path), reference, tied), "full"
