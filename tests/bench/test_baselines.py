"""The committed benchmark baselines (``bench/baselines/*.json``), the docs generated from them
(``docs/benchmarks.md``, ``make bench-report``) and the comparison every benchmark prints against its baseline.

Pure and fast: nothing here runs a benchmark (not marked ``bench``)."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def _load(module: str, name: str):
    if module in sys.modules:
        return sys.modules[module]
    spec = importlib.util.spec_from_file_location(module, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[module] = mod
    spec.loader.exec_module(mod)
    return mod


_report = _load("_report", "_report")  # under its own name: bench/report.py imports it so
report = _load("bench_report", "report")
BASELINES = sorted(_report.BASELINES.glob("*.json"))


def test_there_are_baselines_and_each_names_a_benchmark_that_compares_with_it():
    assert BASELINES
    for path in BASELINES:
        assert path.stem in report.benchmarks(), path
        assert "_report.write(" in (BENCH / f"{path.stem}.py").read_text(), f"{path.stem} never compares its runs"


@pytest.mark.parametrize("path", BASELINES, ids=lambda p: p.stem)
def test_every_baseline_parses_with_a_machine_record_and_ratios(path: Path):
    data = json.loads(path.read_text())
    assert report.problems(path.stem, data) == []
    assert isinstance(data["machine"], dict) and "cpus" in data["machine"]
    # a ratio may be 0 where what it measures was (real_model's final_over_baseline: no held-out problem right at
    # the end), never negative; make bench prints no quotient against a 0 baseline
    assert data["ratios"] and all(v is None or v >= 0 for v in data["ratios"].values())
    if data["provenance"] == _report.TRANSCRIBED:  # copied from the docs: the machine as they described it
        assert data["machine"]["recorded_as"] and data.get("source")
    else:
        assert data["machine"]["cpu_model"] and "runs" not in data


def test_docs_benchmarks_md_is_up_to_date():
    assert (ROOT / "docs" / "benchmarks.md").read_text() == report.render(), \
        "docs/benchmarks.md is stale: run `make bench-report`"


def test_check_mode_fails_on_a_stale_file_and_passes_once_written(tmp_path: Path, capsys):
    out = tmp_path / "benchmarks.md"
    assert report.main(["--check", "--out", str(out)]) == 1  # missing
    out.write_text("stale\n")
    assert report.main(["--check", "--out", str(out)]) == 1
    assert report.main(["--out", str(out)]) == 0
    assert report.main(["--check", "--out", str(out)]) == 0
    assert out.read_text().startswith("<!-- Generated from bench/baselines/*.json by `make bench-report`")


def test_a_broken_baseline_is_named(tmp_path: Path, capsys):
    (tmp_path / "rollout.json").write_text(json.dumps({"benchmark": "rollout", "ratios": {}, "quick": True}))
    (tmp_path / "nonesuch.json").write_text("{")
    with pytest.raises(ValueError) as err:
        report.load(tmp_path)
    text = str(err.value)
    assert "rollout: no machine record" in text and "rollout: no ratios" in text and "nonesuch:" in text
    assert report.main(["--baselines", str(tmp_path), "--out", str(tmp_path / "x.md")]) == 2
    assert not (tmp_path / "x.md").exists()


@pytest.mark.parametrize("name", sorted(report.GOALS))
def test_each_goal_is_the_one_its_benchmark_states(name: str):
    doc = " ".join((ast.get_docstring(ast.parse((BENCH / f"{name}.py").read_text())) or "").split())
    baseline = BENCH / "baselines" / f"{name}.json"
    keys = _report.values(json.loads(baseline.read_text())) if baseline.exists() else {}
    for goal in report.GOALS[name]:
        assert goal.quote in doc, f"bench/{name}.py's docstring no longer says {goal.quote!r}"
        assert not keys or any(goal.applies(k) for k in keys), f"{goal.pattern} matches nothing in {baseline}"


def _toy(tmp_path: Path, **kw) -> dict:
    (tmp_path / "toy.py").write_text('"""A toy benchmark."""\n_report.write(out, report)\n')
    return {"benchmark": "toy", "quick": False, "started": "2026-12-07T10:00:00+0000",
            "machine": {"cpus": 2, "cpu_model": "CPU B", "loadavg_at_start": [0.1, 0.1, 0.1], "python": "3.12.3"},
            "runs": {"x": [1, 2]}, "ratios": {"a": 3.0, "b": None, "new": 1.5}, **kw}


def _rows(out: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("  ")
            and not line.strip().startswith(("note:", "value "))}


def test_a_run_prints_each_ratio_against_the_baseline(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.delenv(_report.SAVE_ENV, raising=False)
    (tmp_path / "toy.json").write_text(json.dumps({
        "benchmark": "toy", "provenance": "measured", "quick": False, "started": "2026-12-01T09:00:00+0000",
        "machine": {"cpus": 2, "cpu_model": "CPU A"}, "ratios": {"a": 2.0, "b": 1.0, "gone": 0.5}}))
    _report.write(tmp_path / "out" / "toy.json", _toy(tmp_path), baselines=tmp_path)
    out = capsys.readouterr().out
    assert f"compared with {tmp_path / 'toy.json'} (started 2026-12-01; measured):" in out
    rows = _rows(out)
    assert rows["a"] == ["3", "2", "1.500"]  # this run, the baseline, this run / baseline
    assert rows["b"] == ["-", "1", "-"]
    assert rows["new"] == ["1.5", "-", "-"]
    assert rows["gone"] == ["-", "0.5", "-"]
    assert "note: machines differ: cpu model 'CPU A' (baseline) vs 'CPU B' (this run)" in out
    assert json.loads((tmp_path / "out" / "toy.json").read_text())["ratios"]["a"] == 3.0
    assert json.loads((tmp_path / "toy.json").read_text())["ratios"]["a"] == 2.0  # not replaced


def test_the_same_machine_gives_no_note_and_a_transcribed_one_says_what_is_known():
    base = {"started": "2026-12-06", "ratios": {"a": 1.0}, "provenance": _report.TRANSCRIBED}
    same = _report.compare({"ratios": {"a": 1.1}, "machine": {"cpus": 2, "cpu_model": "X"}},
                           {**base, "machine": {"cpus": 2, "cpu_model": "X"}})
    assert not [line for line in same if "note:" in line]
    transcribed = _report.compare({"ratios": {"a": 1.1}, "machine": {"cpus": 4, "cpu_model": "X"}},
                                  {**base, "machine": {"cpus": 2, "cpu_model": None, "recorded_as": "a Xeon VM"}})
    notes = [line for line in transcribed if "note:" in line]
    assert notes == ["  note: the baseline's machine is recorded only as 'a Xeon VM'; this run's CPU: 'X'",
                     "  note: machines differ: CPUs 2 (baseline) vs 4 (this run)"]


def test_extras_beside_the_ratios():
    e2e = {"benchmark": "e2e_step", "ratios": {"achieved_over_bound_staleness1": 0.9},
           "startup": {"first_step_s_median": 11.0, "goal_s": 15.0}}
    assert _report.values(e2e) == {"achieved_over_bound_staleness1": 0.9, "startup.first_step_s_median": 11.0}


def test_save_baseline_takes_a_full_run_and_never_a_quick_one(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setenv(_report.SAVE_ENV, "1")
    baselines = tmp_path / "baselines"
    _report.write(tmp_path / "quick.json", _toy(tmp_path, quick=True), baselines=baselines)
    assert not (baselines / "toy.json").exists()
    assert "a --quick run: not compared" in capsys.readouterr().out
    _report.write(tmp_path / "failed.json", _toy(tmp_path, error="boom"), baselines=baselines)
    assert not (baselines / "toy.json").exists()

    _report.write(tmp_path / "full.json", _toy(tmp_path), baselines=baselines)
    assert "no baseline at" in capsys.readouterr().out
    saved = json.loads((baselines / "toy.json").read_text())
    assert saved["provenance"].startswith("measured by bench/toy.py")
    assert "runs" not in saved and saved["machine"]["cpu_model"] == "CPU B" and saved["ratios"]["a"] == 3.0
    assert report.problems("toy", saved, bench=tmp_path) == []
    # the next run compares with it, then replaces it
    _report.write(tmp_path / "full2.json", _toy(tmp_path, ratios={"a": 6.0}), baselines=baselines)
    assert _rows(capsys.readouterr().out)["a"] == ["6", "3", "2.000"]
    assert json.loads((baselines / "toy.json").read_text())["ratios"] == {"a": 6.0}


def test_the_machine_record_names_the_cpu():
    m = _report.machine(torch="x")
    assert {"cpus", "cpu_model", "loadavg_at_start", "python", "torch"} <= set(m)
