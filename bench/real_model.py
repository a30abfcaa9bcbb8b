"""`rft run` of examples/09-real-model.yaml end to end: SmolLM2-135M-Instruct on GSM8K's one- and two-operation
problems, its held-out accuracy before training (the baseline, measured in the same run) and after it.

Runs the example (or ``--manifest``) as one ``rft run`` process with its claims read from ``$RFT_CLAIMS_DIR``
(default ``runs/claims``: ``make real-model-data`` builds the model and the data there; ``make bench-real-model``
runs this script after it), until ``--max-steps`` (default: the manifest's ``trainer.maxSteps``) or ``--minutes``
of wall time: then it sends ``rft run`` one SIGINT, which stops after the current step with a checkpoint.
``--max-staleness 1`` runs the same job with ``rollout.maxStaleness`` 1 (generation overlapping training);
``--threads`` is ``rft run --threads`` (default: every core for a synchronous run, where the roles take turns;
half of them with ``--max-staleness`` above 0, where they run side by side).

Recorded from the run's ``metrics.jsonl`` and ``progress.json``:

- ``accuracy``: ``baseline`` (the step-0 evaluation: the base model, greedy, on the first ``maxTasks`` held-out
  problems), ``final`` (the last evaluation), ``best`` and its step, and the ``curve`` of every evaluation;
- ``wall_s`` (launch to exit), ``steps`` done, ``stopped_by`` (``max-steps`` or ``minutes``);
- ``per_step_s``: the mean over training steps of ``time/step`` and its parts: ``generate`` (``time/generate``:
  waiting for the step's rollouts, scoring inside), ``score`` (``time/reward``: the seconds the evaluator took
  over the step's samples, within generation), ``train`` (``time/train``: old log-probs and the update),
  ``publish`` (``time/publish``: saving the weights and the engine loading them), ``eval`` and ``checkpoint``;
- ``tokens_per_s``: generation (tokens sampled ÷ ``time/generate``) and training (``train_tokens_per_s``), means
  over steps, and the mean tokens sampled per step;
- ``samples``: the first and the last step's sampled completions (``samples/step-NNNNNN.jsonl``), cut to a few.

``ratios`` (what ``make bench`` compares): ``final_over_baseline`` and ``best_over_baseline`` (higher is better;
None when the baseline is 0). With ``--plot PATH`` the evaluation curve and the training reward are drawn into a
PNG (matplotlib); ``--write-baseline`` also writes the report as ``bench/baselines/real_model.json``.

    .venv/bin/python bench/real_model.py [--minutes 60] [--max-steps N] [--max-staleness 1] [--plot PNG]
        [--out JSON] [--write-baseline] [--keep-run DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _report
import yaml

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "examples" / "09-real-model.yaml"
CLAIMS = ROOT / "runs" / "claims"
PARTS = {"step": "time/step", "generate": "time/generate", "score": "time/reward", "train": "time/train",
         "publish": "time/publish", "eval": "time/eval", "checkpoint": "time/checkpoint"}
SAMPLE_PROMPTS = 4
SAMPLE_COMPLETIONS = 3
STOP_GRACE_S = 1800.0
"""How long a SIGINT'ed run may take to finish its step and checkpoint before it is killed."""


def variant_manifest(manifest: Path, dest: Path, staleness: int | None, max_steps: int | None) -> tuple[Path, dict]:
    """``manifest`` with ``rollout.maxStaleness`` and ``trainer.maxSteps`` set where given (other documents
    kept); returns the file and the RFTJob's spec."""
    docs = list(yaml.safe_load_all(manifest.read_text()))
    (job,) = [d for d in docs if isinstance(d, dict) and d.get("kind") == "RFTJob"]
    spec = job["spec"]
    if staleness is not None:
        spec.setdefault("rollout", {})["maxStaleness"] = staleness
    if max_steps is not None:
        spec.setdefault("trainer", {})["maxSteps"] = max_steps
    dest.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return dest, spec


def rft_command() -> list[str]:
    exe = Path(sys.executable).with_name("rft")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "rft_runtime.cli"]


def run(manifest: Path, out: Path, threads: int, minutes: float | None, log_path: Path) -> dict[str, Any]:
    """One ``rft run`` (SIGINT at the deadline); its wall time, exit code and why it stopped."""
    env = dict(os.environ)
    env.setdefault("RFT_CLAIMS_DIR", str(CLAIMS))
    cmd = [*rft_command(), "run", str(manifest), "--out", str(out), "--threads", str(threads), "--no-progress"]
    print(f"$ RFT_CLAIMS_DIR={env['RFT_CLAIMS_DIR']} {' '.join(cmd)}", flush=True)
    deadline = None if minutes is None else time.monotonic() + 60 * minutes
    stopped_by, t0 = "max-steps", time.monotonic()
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        try:
            while proc.poll() is None:
                if deadline is not None and stopped_by == "max-steps" and time.monotonic() > deadline:
                    print(f"{minutes:g} minutes: stopping rft run after its current step", flush=True)
                    proc.send_signal(signal.SIGINT)
                    stopped_by = "minutes"
                    deadline = time.monotonic() + STOP_GRACE_S
                elif stopped_by == "minutes" and deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"rft run did not stop within {STOP_GRACE_S:.0f} s of SIGINT (log: {log_path})")
                time.sleep(1.0)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    wall = time.monotonic() - t0
    ok = {0} if stopped_by == "max-steps" else {0, 130}
    if proc.returncode not in ok:
        raise RuntimeError(f"rft run exited {proc.returncode}:\n{log_path.read_text()[-4000:]}")
    return {"wall_s": round(wall, 1), "exit_code": proc.returncode, "stopped_by": stopped_by}


def read_rows(out: Path) -> list[dict[str, Any]]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 4) if values else None


def step_costs(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean seconds per training step of each part, and the token rates (training steps: ``step`` >= 1)."""
    steps = [r for r in rows if int(r.get("step", 0)) >= 1 and r.get("time/step") is not None]
    per_step = {name: _mean([float(r.get(key) or 0.0) for r in steps]) for name, key in PARTS.items()}
    gen = [float(r["tokens_generated"]) / float(r["time/generate"]) for r in steps
           if r.get("tokens_generated") is not None and r.get("time/generate")]
    train = [float(r["train_tokens_per_s"]) for r in steps if r.get("train_tokens_per_s") is not None]
    return {"per_step_s": per_step,
            "tokens_per_s": {"generation": _mean(gen), "training": _mean(train)},
            "tokens_generated_per_step": _mean([float(r.get("tokens_generated") or 0) for r in steps]),
            "reward_mean": {"first": steps[0].get("reward_mean") if steps else None,
                            "last": steps[-1].get("reward_mean") if steps else None}}


def accuracy(rows: list[dict[str, Any]], progress: dict[str, Any]) -> dict[str, Any]:
    """The held-out accuracy at step 0, at the last and at the best evaluation, and the curve (the progress
    record's ``evaluation`` where it has one, else the metrics rows' ``eval_score``)."""
    ev = progress.get("evaluation") or {}
    curve = [{"step": int(p["step"]), "score": p["score"]} for p in ev.get("curve") or []]
    if not curve:
        curve = [{"step": int(r["step"]), "score": r["eval_score"]} for r in rows if r.get("eval_score") is not None]
    baseline = ev.get("baseline")
    if baseline is None:
        baseline = next((p["score"] for p in curve if p["step"] == 0), None)
    best = max(curve, key=lambda p: p["score"]) if curve else None
    pass_at_k = [{"step": int(r["step"]), "pass_at_k": r["eval_pass_at_k"]} for r in rows
                 if r.get("eval_pass_at_k") is not None]
    return {"baseline": baseline, "final": curve[-1]["score"] if curve else None,
            "final_step": curve[-1]["step"] if curve else None,
            "best": ev.get("bestScore", best["score"] if best else None),
            "best_step": ev.get("bestStep", best["step"] if best else None),
            "best_checkpoint": ev.get("bestCheckpoint"), "stop_reason": ev.get("stopReason"),
            "curve": curve, "pass_at_k": pass_at_k}


def sample_files(out: Path) -> list[Path]:
    found = [*out.glob("checkpoints/samples/step-*.jsonl"), *out.glob("samples/step-*.jsonl")]
    return sorted(set(found), key=lambda p: p.name)


def _cut(text: Any, n: int = 600) -> Any:
    return text if not isinstance(text, str) or len(text) <= n else text[: n // 2] + " [...] " + text[-n // 2:]


def samples(out: Path) -> dict[str, Any]:
    """The first and the last step's samples, a few prompts each with a few completions (texts cut)."""
    files = sample_files(out)
    picked: dict[str, Any] = {}
    for which, path in (("first", files[0] if files else None), ("last", files[-1] if len(files) > 1 else None)):
        if path is None:
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][:SAMPLE_PROMPTS]
        picked[which] = [{"step": r.get("step"), "task_id": r.get("task_id"), "reference": _cut(r.get("reference"), 300),
                          "reward_mean": r.get("reward_mean"),
                          "completions": [{"text": _cut(c.get("text")), "reward": c.get("reward"),
                                           "finish": c.get("finish"), "tokens": c.get("tokens")}
                                          for c in (r.get("completions") or [])[:SAMPLE_COMPLETIONS]]}
                         for r in rows]
    return picked


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 else None


def plot(report: dict[str, Any], rows: list[dict[str, Any]], path: Path) -> bool:
    """The held-out accuracy by step (and the training reward, lighter) as a PNG; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        print("--plot: matplotlib is not installed; no curve drawn")
        return False
    acc = report["accuracy"]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    train = [(int(r["step"]), r["reward_mean"]) for r in rows if int(r.get("step", 0)) >= 1
             and r.get("reward_mean") is not None]
    if train:
        ax.plot(*zip(*train), color="tab:gray", alpha=0.5, linewidth=1, label="training reward (sampled)")
    if acc["curve"]:
        ax.plot([p["step"] for p in acc["curve"]], [p["score"] for p in acc["curve"]], marker="o",
                color="tab:blue", linewidth=2, label="held-out accuracy (greedy)")
    if acc["baseline"] is not None:
        ax.axhline(acc["baseline"], color="tab:blue", linestyle=":", linewidth=1, label="base model")
    ax.set_xlabel("training step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("accuracy / mean reward")
    ax.set_ylim(0, max(0.2, min(1.0, 1.2 * max([p["score"] for p in acc["curve"]] + [v for _, v in train] + [0.0]))))
    ax.set_title(f"SmolLM2-135M-Instruct, GSM8K 1-2 operations ({report['wall_s'] / 60:.0f} min, "
                 f"{report['machine'].get('cpus')} CPUs)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    print(f"wrote {path}")
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--manifest", type=Path, default=MANIFEST)
    p.add_argument("--minutes", type=float, default=None, help="stop rft run after this much wall time")
    p.add_argument("--max-steps", type=int, default=None, help="trainer.maxSteps (default: the manifest's)")
    p.add_argument("--max-staleness", type=int, default=None, help="rollout.maxStaleness (default: the manifest's)")
    p.add_argument("--threads", type=int, default=None, help="rft run --threads (default: see above)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "real_model.json")
    p.add_argument("--plot", type=Path, default=None, help="draw the curve into this PNG")
    p.add_argument("--write-baseline", action="store_true", help="also write bench/baselines/real_model.json")
    p.add_argument("--keep-run", type=Path, default=None, help="rft run's --out here (kept) instead of a temporary one")
    p.add_argument("--quick", action="store_true", help="a smoke run: 2 steps; never a baseline")
    args = p.parse_args(argv)
    if args.quick:
        args.max_steps = args.max_steps or 2
    if args.minutes is not None and args.minutes <= 0:
        p.error("--minutes must be positive")
    started, machine = _report.started(), _report.machine()
    cpus = os.cpu_count() or 2
    with tempfile.TemporaryDirectory(prefix="rft-real-model-") as tmp:
        work = Path(tmp)
        manifest, spec = variant_manifest(args.manifest, work / "job.yaml", args.max_staleness, args.max_steps)
        staleness = int(spec.get("rollout", {}).get("maxStaleness", 0))
        threads = args.threads or (cpus if staleness == 0 else max(1, cpus // 2))
        out = args.keep_run.resolve() if args.keep_run else work / "out"
        if out.exists():
            shutil.rmtree(out)
        result = run(manifest, out, threads, args.minutes, work / "rft-run.log")
        rows = read_rows(out)
        progress_path = out / "progress.json"
        progress = json.loads(progress_path.read_text()) if progress_path.exists() else {}
        steps = max([int(r.get("step", 0)) for r in rows] + [0])
        acc = accuracy(rows, progress)
        report: dict[str, Any] = {
            "benchmark": "real_model", "manifest": str(args.manifest), "quick": args.quick,
            "started": started, "machine": machine,
            "settings": {"max_staleness": staleness, "threads": threads, "minutes": args.minutes,
                         "max_steps": int(spec.get("trainer", {}).get("maxSteps", 100)),
                         "rollout": spec.get("rollout"), "learning_rate": spec.get("trainer", {}).get("learningRate"),
                         "evaluation": spec.get("evaluation")},
            "baseline": "the base model's held-out accuracy at step 0 of the same run (accuracy.baseline)",
            **result, "steps": steps, "accuracy": acc, **step_costs(rows), "samples": samples(out),
            "ratios": {"final_over_baseline": ratio(acc["final"], acc["baseline"]),
                       "best_over_baseline": ratio(acc["best"], acc["baseline"])},
        }
        if args.plot is not None:
            report["plot"] = str(args.plot) if plot(report, rows, args.plot) else None
    show = {k: report[k] for k in ("wall_s", "steps", "stopped_by", "per_step_s", "tokens_per_s", "ratios")}
    show["accuracy"] = {k: v for k, v in acc.items() if k not in ("curve", "pass_at_k")}
    if args.write_baseline:
        os.environ[_report.SAVE_ENV] = "1"
    _report.write(args.out, report, show)
    return 0


if __name__ == "__main__":
    sys.exit(main())
