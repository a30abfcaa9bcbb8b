"""``rft model export --model SPEC --out DIR``: materialise a model as a plain Hugging Face directory.

Engines that cannot build our builtin models themselves (vLLM) get one this way: the operator
runs it as an init container that writes into the pod's scratch volume. A path is copied as is.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Sequence

from .builtin import is_builtin_spec, resolve_builtin_model

MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
               "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def export_model(spec: str, out: Path) -> Path:
    """Copy the model named by ``spec`` (``builtin:<name>`` or a directory) into ``out``."""
    src = resolve_builtin_model(spec) if is_builtin_spec(spec) else Path(spec)
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"--model {spec}: {src} has no config.json (not a Hugging Face model directory)")
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and (f.name in MODEL_FILES or f.suffix in (".safetensors", ".json", ".jinja")):
            shutil.copy2(f, out / f.name)
    return out


def model_cli(argv: Sequence[str] | None = None) -> int:
    """``rft model export ...``."""
    p = argparse.ArgumentParser(prog="rft model", description="model utilities")
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="write a model (builtin:<name> or a directory) as a Hugging Face directory")
    e.add_argument("--model", required=True)
    e.add_argument("--out", required=True)
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        out = export_model(args.model, Path(args.out))
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps({"model": args.model, "out": str(out)}))
    return 0
