"""bench/image_install.py's ``--quick`` mode runs and writes its JSON (marked ``bench``: never a timing assertion)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.bench
def test_image_install_quick(tmp_path):
    """pip and uv each install the same one-wheel lock: both installs hold the same files, byte-compiled."""
    out = tmp_path / "image_install.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "image_install.py"), "--quick", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    pip, uv = report["installers"]["pip"], report["installers"]["uv"]
    assert report["quick"] is True and report["lock"] == "requirements/uv.txt"
    assert pip["size_mb"] > 0 and abs(pip["size_mb"] - uv["size_mb"]) / pip["size_mb"] < 0.05, (pip, uv)
    assert report["ratios"]["uv_over_pip_wall"] > 0 and report["ratios"]["uv_over_pip_cpu"] > 0
