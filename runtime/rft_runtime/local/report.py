"""The end-of-run summary and ``reward_curve.png`` of a local run."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence


def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(vals) / len(vals) if vals else None


def reward_summary(rows: Sequence[dict[str, Any]], window: int = 3) -> dict[str, Any]:
    """Mean reward of the first and last ``window`` steps and the gain between them."""
    evals = [(r["step"], r["eval_score"]) for r in sorted((r for r in rows if isinstance(r.get("step"), int)),
                                                          key=lambda r: r["step"])
             if isinstance(r.get("eval_score"), (int, float))]
    rows = sorted((r for r in rows if isinstance(r.get("step"), int) and r["step"] >= 1),  # step 0: the baseline
                  key=lambda r: r["step"])
    rewards = [r.get("reward_mean") for r in rows]
    first, last = _mean(rewards[:window]), _mean(rewards[-window:])
    out = {"steps": len(rows), "reward_first": first, "reward_last": last,
           "reward_gain": (last - first) if first is not None and last is not None else None}
    if evals:
        best = max(evals, key=lambda e: e[1])
        out.update(eval_first=evals[0][1], eval_first_step=evals[0][0], eval_last=evals[-1][1],
                   eval_last_step=evals[-1][0], eval_best=best[1], eval_best_step=best[0])
    return out


def plot_reward_curve(rows: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Write a PNG of the reward mean per step and its moving average (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted((r for r in rows if isinstance(r.get("step"), int)), key=lambda r: r["step"])
    steps = [r["step"] for r in rows]
    mean: list[Any] = [r.get("reward_mean") if r.get("reward_mean") is not None else float("nan") for r in rows]
    k = max(1, min(5, len(mean) // 3))
    smooth = [_mean(mean[max(0, i - k + 1): i + 1]) for i in range(len(mean))]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(steps, mean, marker="o", markersize=3, alpha=0.6, label="reward mean")
    if k > 1:
        ax.plot(steps, [x if x is not None else float("nan") for x in smooth], linewidth=2,
                label=f"moving average ({k} steps)")
    evals = [(r["step"], r["eval_score"]) for r in rows if isinstance(r.get("eval_score"), (int, float))]
    if evals:
        ax.plot([s for s, _ in evals], [v for _, v in evals], marker="s", linestyle="--", label="eval score")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(title or "reward")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out)
    plt.close(fig)
    return out


def format_summary(name: str, s: dict[str, Any], seconds: float, out: Path, interrupted: bool) -> str:
    """Human-readable lines printed at the end of ``rft run``."""
    def f(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    state = "interrupted" if interrupted else "finished"
    lines = [
        f"rft run {name}: {state} after {s['steps']} steps in {seconds:.1f}s",
        f"  reward: first-3 mean {f(s['reward_first'])} -> last-3 mean {f(s['reward_last'])} "
        f"(gain {f(s['reward_gain'])})",
        f"  output: {out} (metrics.jsonl, tensorboard/, checkpoints/, reward_curve.png)",
    ]
    if s.get("eval_last") is not None:
        lines.insert(2, f"  eval: step {s['eval_first_step']} {f(s['eval_first'])} -> step {s['eval_last_step']} "
                        f"{f(s['eval_last'])} (best {f(s['eval_best'])} at step {s['eval_best_step']})")
    if (out / "checkpoints" / "samples").is_dir():
        lines.append(f"  samples: {out / 'checkpoints' / 'samples'} (print them: rft samples {out})")
    if interrupted:
        lines.append(f"  continue with: rft run <manifest> --out {out} --resume")
    return "\n".join(lines)
