"""Golden tests of the child builders: the rendered children of four jobs, compared with committed YAML.

``UPDATE_GOLDEN=1`` rewrites the files (review the diff before committing).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from rft_operator.builders import BuildContext, desired_children
from tests.operator.support import EXAMPLE, GOLDEN_INPUTS, make_job, manifest

GOLDEN = Path(__file__).parent / "golden"
CASES = {
    "tiny-arith": EXAMPLE,
    "vllm-lora": GOLDEN_INPUTS / "vllm-lora.yaml",
    "vllm-full": GOLDEN_INPUTS / "vllm-full.yaml",
    "bundle": GOLDEN_INPUTS / "bundle.yaml",
}


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (config.json) as literal blocks, so the golden files are reviewable."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(path: Path) -> str:
    job = make_job(manifest(path))
    return yaml.dump_all(desired_children(job, BuildContext()), Dumper=_Dumper, sort_keys=False, width=120)


@pytest.mark.parametrize("case", sorted(CASES))
def test_children_match_golden(case: str) -> None:
    out = render(CASES[case])
    golden = GOLDEN / f"{case}.yaml"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(out)
    assert golden.exists(), f"{golden} missing: run with UPDATE_GOLDEN=1"
    assert out == golden.read_text(), f"children of {case} differ from {golden.name} (UPDATE_GOLDEN=1 rewrites)"


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendering_is_deterministic(case: str) -> None:
    assert render(CASES[case]) == render(CASES[case])
