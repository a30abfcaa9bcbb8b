"""The builtin engine is frozen as the reference implementation (docs/design/001): its package stays within
its written line budget."""

from __future__ import annotations

from pathlib import Path

SERVE = Path(__file__).resolve().parents[2] / "runtime" / "rft_runtime" / "serve"
BUDGET = 5500  # docs/design/001-builtin-inference-engine.md, "Budget"


def test_serve_package_stays_within_its_line_budget() -> None:
    files = sorted(p for p in SERVE.rglob("*") if p.suffix in (".py", ".c"))
    lines = {str(p.relative_to(SERVE)): len(p.read_text().splitlines()) for p in files}
    assert "runner.py" in lines and "native/kernels.c" in lines  # counts the Python and the C
    total = sum(lines.values())
    biggest = ", ".join(f"{k} {v}" for k, v in sorted(lines.items(), key=lambda kv: -kv[1])[:5])
    assert total <= BUDGET, f"runtime/rft_runtime/serve holds {total} lines, over its budget of {BUDGET} ({biggest})"
