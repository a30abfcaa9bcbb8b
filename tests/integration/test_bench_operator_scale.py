"""``bench/operator_scale.py --quick`` runs (so the benchmark cannot rot), writes every key the issue
lists, and an idle job costs the operator no request but the leader-election Lease renewals (counted
by the API server's audit log of the operator's ServiceAccount)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.bench]
ROOT = Path(__file__).resolve().parents[2]
KEYS = {"jobs", "converge_s", "raw_apply_s", "converge_ratio_vs_raw_apply", "idle_requests_per_s",
        "idle_mutating_requests", "status_latency_p99_s", "operator_rss_peak_mb", "api_requests_by_verb"}


def test_quick_operator_scale_bench(cluster, tmp_path: Path) -> None:  # cluster: binaries are built
    out = tmp_path / "operator_scale.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "operator_scale.py"), "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    r = json.loads(out.read_text())
    assert KEYS <= set(r), KEYS - set(r)
    assert r["jobs"] == 20 and r["converge_s"] > 0 and r["raw_apply_s"] > 0
    # idle: nothing but the Lease renewals (one PUT per renewal)
    assert r["idle_mutating_requests_excluding_lease"] == 0, r["idle_requests_by_verb_and_resource"]
    assert set(r["idle_requests_by_verb_and_resource"]) <= {"update leases"}, r["idle_requests_by_verb_and_resource"]
    assert r["idle_requests_per_s"] <= 1.0
    assert r["status_latency_p99_s"] >= 0 and r["api_requests_by_verb"]
