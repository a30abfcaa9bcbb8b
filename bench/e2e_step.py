"""`rft run` of the sample job end to end: start-up, steady step, and the speed-up that overlapping
generation with training achieves against its bound.

Runs ``examples/01-tiny-arith.yaml`` (or ``--manifest``) with ``rollout.maxStaleness`` 0 (synchronous,
the baseline), 1 and 2, each as a fresh ``rft run`` process; the variants interleave (0 1 2 0 1 2 ...)
over ``--repeats`` rounds so that a change of machine load hits all of them, and medians are reported.
Per run:

- ``first_step_s``: from launching ``rft run`` to its first metrics row (a warm start: the venv and
  the builtin model already built; the roles start in parallel);
- ``steady_step_s``: the median ``time/step`` after the first ``--warmup`` steps;
- the median phases of those steps (``time/generate``, ``time/train``, ``time/publish``,
  ``time/publish_background``, ``time/rollout_busy``) and the trainer's own per-step ``overlap/bound`` and ``overlap/achieved``.

The bound is the synchronous run's: ``(t_R + t_T + t_W) / (max(t_R, t_T) + t_W)``, what overlapping
generation (t_R) with training (t_T) can give when each weight publication (t_W) stops both. The
achieved speed-up of staleness S in a round is that round's synchronous steady step over S's, and its
share of the bound divides by that round's synchronous bound: each round's variants run back to back,
so a drift of the machine's speed from round to round (on 2 cores the synchronous step has moved by
20 % between rounds) hits both sides of the ratio.
With ``maxStaleness`` above 0 the trainer publishes each version in the background while the next step
trains (docs/trainer.md, "Weight sync"), so its publications stop neither side and the achieved speed-up
may pass the bound; ``RFT_PUBLISH=inline`` in the environment (``rft run``'s roles inherit it) publishes
inline, as the bound assumes.

`ratios`: ``achieved_over_bound_staleness1`` (and ``…2``): the median over rounds of achieved speed-up ÷
bound (higher is better, goal ≥ 0.9); ``speedup_staleness1`` (``…2``): the median over rounds of the
synchronous step ÷ S's step; ``achieved_over_bound_pooled_staleness1`` (``…2``): the same ratio from the
medians over all rounds (each side's median step, the synchronous runs' median bound), as this
benchmark computed it before; ``first_step_s`` is a time (goal ≤ 15 s), not a ratio, and sits beside
them in ``startup``. ``rounds`` lists each round's speed-ups and ratios.

    .venv/bin/python bench/e2e_step.py [--steps 14] [--repeats 2] [--quick]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _report
import yaml

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "examples" / "01-tiny-arith.yaml"
PHASES = ("time/step", "time/generate", "time/train", "time/publish", "time/publish_background", "time/rollout_busy",
          "time/idle_generate", "time/idle_train", "overlap/bound", "overlap/achieved")


def variant_manifest(manifest: Path, staleness: int, dest: Path) -> Path:
    """``manifest`` with ``spec.rollout.maxStaleness`` set (other documents, e.g. ConfigMaps, kept)."""
    docs = list(yaml.safe_load_all(manifest.read_text()))
    for d in docs:
        if isinstance(d, dict) and d.get("kind") == "RFTJob":
            d["spec"].setdefault("rollout", {})["maxStaleness"] = staleness
    dest.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return dest


def rft_command() -> list[str]:
    """``rft`` from this interpreter's environment (the venv's console script)."""
    exe = Path(sys.executable).with_name("rft")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "rft_runtime.cli"]


def run_once(manifest: Path, steps: int, work: Path, timeout: float) -> dict:
    """One ``rft run``: the time to its first metrics row, its total wall time and its metrics rows."""
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    metrics = out / "metrics.jsonl"
    log = (work / "rft-run.log").open("w")
    t0 = time.perf_counter()
    proc = subprocess.Popen([*rft_command(), "run", str(manifest), "--out", str(out), "--max-steps", str(steps),
                             "--no-progress"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    first = None
    try:
        while proc.poll() is None:
            if first is None and metrics.exists() and metrics.stat().st_size > 0:
                first = time.perf_counter() - t0
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"rft run took more than {timeout:.0f} s (log: {work / 'rft-run.log'})")
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    total = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"rft run exited {proc.returncode}:\n{(work / 'rft-run.log').read_text()[-3000:]}")
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    if len(rows) != steps:
        raise RuntimeError(f"rft run wrote {len(rows)} metrics rows, expected {steps}")
    return {"first_step_s": first if first is not None else total, "total_s": total, "rows": rows}


def summarise(run: dict, warmup: int) -> dict:
    """The run's start-up and the medians of its steady steps' phases."""
    steady = run["rows"][warmup:]
    med = {k: statistics.median(float(r.get(k, 0.0)) for r in steady) for k in PHASES}
    return {"first_step_s": round(run["first_step_s"], 3), "total_s": round(run["total_s"], 3),
            "steady_step_s": round(med["time/step"], 4), "steady_steps": len(steady),
            "phases": {k: round(v, 4) for k, v in med.items()},
            "staleness_max": max(float(r.get("staleness_max", 0.0)) for r in run["rows"]),
            "prefetched_steps_max": max(int(r.get("prefetched_steps", 0)) for r in run["rows"]),
            "reward_first": run["rows"][0].get("reward_mean"), "reward_last": run["rows"][-1].get("reward_mean")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--manifest", default=str(MANIFEST))
    p.add_argument("--steps", type=int, default=14, help="steps per run (--max-steps)")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the steady medians")
    p.add_argument("--staleness", default="0,1,2", help="maxStaleness values; the first is the baseline")
    p.add_argument("--repeats", type=int, default=2, help="rounds over the variants")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per rft run")
    p.add_argument("--quick", action="store_true", help="4 steps, 1 warm-up step, staleness 0 and 1, one round")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "e2e_step.json"))
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.warmup, args.staleness, args.repeats = 4, 1, "0,1", 1
    values = [int(s) for s in args.staleness.split(",")]
    if args.steps <= args.warmup:
        p.error("--steps must exceed --warmup")
    started, machine = _report.started(), _report.machine()
    runs: dict[int, list[dict]] = {s: [] for s in values}
    with tempfile.TemporaryDirectory(prefix="rft-e2e-step-") as tmp:
        work = Path(tmp)
        manifests = {s: variant_manifest(Path(args.manifest), s, work / f"staleness-{s}.yaml") for s in values}
        for r in range(args.repeats):
            for s in values:
                res = summarise(run_once(manifests[s], args.steps, work, args.timeout), args.warmup)
                print(f"round {r + 1} maxStaleness {s}: first step {res['first_step_s']:.1f} s, "
                      f"steady step {res['steady_step_s']:.3f} s", flush=True)
                runs[s].append(res)
    med = {s: {"first_step_s": statistics.median(x["first_step_s"] for x in rs),
               "steady_step_s": statistics.median(x["steady_step_s"] for x in rs),
               "phases": {k: statistics.median(x["phases"][k] for x in rs) for k in PHASES}}
           for s, rs in runs.items()}
    base = values[0]
    bound = med[base]["phases"]["overlap/bound"]
    rounds = [{"bound": round(runs[base][r]["phases"]["overlap/bound"], 4),
               **{f"speedup_staleness{s}": round(runs[base][r]["steady_step_s"] / runs[s][r]["steady_step_s"], 4)
                  for s in values[1:]}} for r in range(args.repeats)]
    for row in rounds:
        row.update({f"achieved_over_bound_staleness{s}": round(row[f"speedup_staleness{s}"] / row["bound"], 4)
                    for s in values[1:]})
    ratios: dict[str, float] = {}
    for s in values[1:]:
        for key in (f"speedup_staleness{s}", f"achieved_over_bound_staleness{s}"):
            ratios[key] = round(statistics.median(row[key] for row in rounds), 4)
        speedup = med[base]["steady_step_s"] / med[s]["steady_step_s"]
        ratios[f"achieved_over_bound_pooled_staleness{s}"] = round(speedup / bound, 4)
    firsts = [x["first_step_s"] for rs in runs.values() for x in rs]
    report = {
        "benchmark": "e2e_step", "manifest": str(args.manifest), "steps": args.steps, "warmup": args.warmup,
        "staleness": values, "baseline": f"maxStaleness {base}", "repeats": args.repeats, "quick": args.quick,
        "machine": machine, "started": started,
        "runs": {str(s): rs for s, rs in runs.items()},
        "medians": {str(s): m for s, m in med.items()},
        "bound": round(bound, 4), "rounds": rounds,
        "startup": {"first_step_s_median": round(statistics.median(firsts), 3), "first_step_s_max": round(max(firsts), 3),
                    "goal_s": 15.0},
        "ratios": ratios,
    }
    _report.write(args.out, report, {"ratios": ratios, "bound": report["bound"], "startup": report["startup"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
