"""Loads the invalid-manifest corpus shared by the unit and the API-server tests."""
from __future__ import annotations

import copy
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "examples" / "01-tiny-arith.yaml"


def merge(base: dict, patch: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def base_manifest() -> dict:
    return yaml.safe_load(BASE.read_text())


def invalid_cases() -> list[dict]:
    cases = yaml.safe_load((Path(__file__).parent / "invalid_cases.yaml").read_text())
    base = base_manifest()
    return [{**c, "manifest": merge(base, c["patch"])} for c in cases]
