"""The fault matrix of docs/security.md names, for each fault, the tests that hold it: every test it
names exists (a renamed or deleted test shows up here, not as a doc that promises what nothing checks),
and every invalid-manifest case it names is in the corpus."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "security.md"
SECTION = "## Faults and abuse"


def _matrix() -> list[str]:
    text = DOC.read_text()
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    return [line for line in text[start:end].splitlines() if line.startswith("| ") and not line.startswith("| fault")]


def _tests_column(row: str) -> str:
    return row.rstrip(" |").rsplit(" | ", 1)[1]


def test_the_matrix_has_a_row_per_fault_each_naming_a_test() -> None:
    rows = [r for r in _matrix() if not set(r) <= set("|-: ")]
    assert len(rows) >= 20
    for row in rows:
        assert "`" in _tests_column(row), row


def test_every_test_the_matrix_names_exists() -> None:
    missing = []
    for row in _matrix():
        current = None
        for ref in re.findall(r"`([^`]+)`", _tests_column(row)):
            path, _, name = ref.partition("::")
            if path.endswith(".py"):
                current = ROOT / "tests" / path if not path.startswith("tests/") else ROOT / path
                if not current.exists():
                    missing.append(ref)
                    continue
            elif not path.startswith("::") and "::" not in ref:
                continue  # not a test reference (a case id, a word)
            name = re.sub(r"\[.*\]$", "", name)
            if name and (current is None or f"def {name}(" not in current.read_text()):
                missing.append(f"{current.name if current else '?'}::{name}")
    assert not missing, missing


def test_every_invalid_case_the_matrix_names_is_in_the_corpus() -> None:
    ids = {c["id"] for c in yaml.safe_load((ROOT / "tests" / "api" / "invalid_cases.yaml").read_text())}
    for row in _matrix():
        col = _tests_column(row)
        if "invalid_cases.yaml" not in col:
            continue
        for ref in re.findall(r"`([a-z0-9*-]+)`", col):
            pattern = re.compile("^" + re.escape(ref).replace(r"\*", ".*") + "$")
            assert any(pattern.match(i) for i in ids), ref
