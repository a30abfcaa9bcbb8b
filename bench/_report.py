"""What a benchmark records about the machine it ran on, how it writes its JSON, and how a run compares with
the committed baseline of its benchmark (``bench/baselines/<benchmark>.json``).

Every benchmark writes its report through :func:`write`. When a baseline of the report's ``benchmark`` is
committed, :func:`write` prints, per ratio, this run's value, the baseline's and this run ÷ baseline, with a
note when the machines differ (``bench/report.py`` turns the baselines into ``docs/benchmarks.md``). With
``RFT_BENCH_SAVE_BASELINE=1`` in the environment a full run replaces the baseline (``RFT_BENCH_SAVE_BASELINE=1
make bench``); a ``--quick`` run is never compared with one nor saved as one.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

BASELINES = Path(__file__).resolve().parent / "baselines"
SAVE_ENV = "RFT_BENCH_SAVE_BASELINE"
# The provenance of a baseline whose numbers were copied from the project's recorded runs (prose in docs/).
TRANSCRIBED = "transcribed from the project's recorded run (docs), not re-measured by bench/ itself"
# Values beside ``ratios`` that the comparison and docs/benchmarks.md show: dotted paths into a report.
EXTRAS: dict[str, tuple[str, ...]] = {
    "e2e_step": ("startup.first_step_s_median",),
    "rollout_tokens": ("drift",),
    "real_model": ("accuracy.baseline", "accuracy.final", "accuracy.final_step", "accuracy.best", "steps",
                   "wall_s", "per_step_s.step", "per_step_s.generate", "per_step_s.train",
                   "tokens_per_s.generation", "tokens_per_s.training"),
    "sharded_loading": ("model.size", "model.parameters", "worlds.ws4.plain.peak_mb", "worlds.ws4.sharded.peak_mb",
                        "worlds.ws4.sharded.bound_mb"),
    "operator_scale": ("converge_s", "idle_requests_per_s", "idle_mutating_requests_excluding_lease",
                       "status_latency_p99_s", "operator_rss_peak_mb"),
}


def started() -> str:
    """The local time now, as every benchmark's ``started`` records it (call it before the measurements)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo``; else what :mod:`platform` says; None if neither knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def machine(**extra) -> dict:
    """The CPUs and their model, the load average now (call it before the measurements), Python's version and
    ``extra``."""
    return {"cpus": os.cpu_count(), "cpu_model": cpu_model(),
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(), **extra}


def values(report: dict) -> dict[str, float | None]:
    """What a report is compared on: its ``ratios``, then its benchmark's :data:`EXTRAS` that it has."""
    out = dict(report.get("ratios") or {})
    for path in EXTRAS.get(str(report.get("benchmark")), ()):
        node = report
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None and not isinstance(node, dict):
            out[path] = node
    return out


def machine_notes(new: dict, baseline: dict) -> list[str]:
    """Where this run's machine record and the baseline's differ, or cannot be told apart."""
    notes = []
    ours, theirs = new.get("cpu_model"), baseline.get("cpu_model")
    if theirs is None and baseline.get("recorded_as"):
        notes.append(f"the baseline's machine is recorded only as {baseline['recorded_as']!r}; "
                     f"this run's CPU: {ours!r}")
    elif ours != theirs:
        notes.append(f"machines differ: cpu model {theirs!r} (baseline) vs {ours!r} (this run)")
    for key, what in (("cpus", "CPUs"), ("gpu", "GPU")):
        if new.get(key) is not None and baseline.get(key) is not None and new[key] != baseline[key]:
            notes.append(f"machines differ: {what} {baseline[key]!r} (baseline) vs {new[key]!r} (this run)")
    return notes


def _number(v: object) -> str:
    return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def compare(report: dict, baseline: dict, where: str = "the baseline") -> list[str]:
    """Lines comparing ``report`` with ``baseline``: per value (:func:`values`) this run's, the baseline's and
    this run ÷ baseline, then the machine notes."""
    new, old = values(report), values(baseline)
    provenance = baseline.get("provenance", "")
    lines = [f"compared with {where} (started {str(baseline.get('started', '?'))[:10]}"
             + (f"; {provenance}" if provenance else "") + "):"]
    keys = list(new) + [k for k in old if k not in new]
    width = max([len(k) for k in keys] + [5])
    lines.append(f"  {'value':<{width}} {'this run':>10} {'baseline':>10} {'this/baseline':>14}")
    for key in keys:
        a, b = new.get(key), old.get(key)
        ratio = f"{a / b:.3f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else "-"
        lines.append(f"  {key:<{width}} {_number(a):>10} {_number(b):>10} {ratio:>14}")
    lines += [f"  note: {n}" for n in machine_notes(report.get("machine") or {}, baseline.get("machine") or {})]
    return lines


def save_baseline(report: dict, path: Path) -> bool:
    """Write a full run's ``report`` (less its per-round ``runs``) as the baseline at ``path``; a ``--quick`` run,
    a failed one or one without ratios is refused (says why, returns False)."""
    why = ("a --quick run is never a baseline" if report.get("quick") is not False
           else "the run failed" if report.get("error")
           else "the run has no ratios" if not report.get("ratios") else None)
    if why:
        print(f"{SAVE_ENV}: not saved as {path}: {why}")
        return False
    name = report["benchmark"]
    baseline = {"benchmark": name,
                "provenance": f"measured by bench/{name}.py and saved by {SAVE_ENV}=1 (its per-round runs left out)",
                **{k: v for k, v in report.items() if k not in ("benchmark", "provenance", "runs")}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(baseline, indent=2) + "\n")
    print(f"saved as the baseline {path}; `make bench-report` regenerates docs/benchmarks.md from it")
    return True


def against_baseline(report: dict, baselines: Path = BASELINES) -> None:
    """Print the comparison of ``report`` with its benchmark's baseline, if there is one, then save ``report``
    as the baseline where ``RFT_BENCH_SAVE_BASELINE=1`` asks for it."""
    name = report.get("benchmark")
    if not name:
        return
    path = Path(baselines) / f"{name}.json"
    save = os.environ.get(SAVE_ENV) == "1"
    if report.get("quick") is not False:
        if path.exists() or save:
            print(f"a --quick run: not compared with {path}, nor saved as a baseline")
        return
    if path.exists():
        try:
            print("\n".join(compare(report, json.loads(path.read_text()), str(path))))
        except (ValueError, TypeError, AttributeError) as exc:  # a broken baseline must not lose the run
            print(f"could not compare with {path}: {type(exc).__name__}: {exc}")
    else:
        print(f"no baseline at {path}")
    if save:
        save_baseline(report, path)


def write(out: str | Path, report: dict, show: dict | None = None, baselines: Path = BASELINES) -> Path:
    """Write ``report`` as JSON to ``out`` (its directory made), print ``show`` (else its ratios) and where it
    went, then compare it with its benchmark's baseline in ``baselines`` (:func:`against_baseline`)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["ratios"] if show is None else show, indent=2))
    print(f"wrote {out}")
    against_baseline(report, baselines)
    return out
