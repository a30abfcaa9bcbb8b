"""bench/packing.py's ``--quick`` mode runs and writes its JSON (marked ``bench``: never a timing assertion)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.bench
def test_packing_quick(tmp_path):
    """The three paths on the same batch from the same weights: tokens/s of each, and the same loss."""
    out = tmp_path / "packing.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "packing.py"), "--quick", "--threads", "1",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["quick"] is True and set(report["paths"]) == {"padded", "shared", "packed"}
    assert report["batch"]["padded_tokens"] > report["batch"]["tokens"]  # the batch has padding to save
    assert all(p["tokens_per_s"] > 0 for p in report["paths"].values())
    assert report["ratios"]["packed_loss_relative_difference"] < 1e-5
    assert report["ratios"]["packed_over_padded_tokens_per_s"] > 0


def test_packing_bench_documents_itself():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "packing.py"), "--help"], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and "GSM8K" in out.stdout
