"""What `rollout.tokens: recompute` costs against `exact`: episodes/s, server requests and drift.

One builtin server started here; the same tasks rolled out by a `RolloutWorker` in each pattern
(`--turns` assistant turns per episode through a multi-turn bundle, `--n` episodes per task, the same
seeds), rounds alternating (exact, recompute, recompute, exact, ...) over `--repeats`; medians
reported. The baseline is `exact`, measured in the same run.

`ratios.recompute_vs_exact_episodes_per_s` (higher is better; < 1: the price of the chat request's
rendering and the extra prefill), `ratios.recompute_requests_per_sample` (2: one chat request and one
prefill), and `drift`: the share of rebuilt turns whose ids differ from those the engine sampled.

    .venv/bin/python bench/rollout_tokens.py [--quick] [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import _report

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inference import DEFAULT_MODEL, against_builtin, medians  # noqa: E402

from rft_runtime.data.task import Task  # noqa: E402
from rft_runtime.rollout import ChatTokenizer, EvaluatorBundle, InferenceClient, RolloutWorker, SamplingParams  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PATTERNS = ("exact", "recompute")


def conversation(turns: int):
    """A bundle rollout of ``turns`` assistant turns, each answered by a fixed user message."""
    async def rollout(task, client):
        messages = task.chat_messages()
        for k in range(turns):
            r = await client.chat.completions.create(messages=messages)
            messages = [*messages, r.choices[0].message.model_dump(), {"role": "user", "content": f"and then? ({k})"}]
    return rollout


async def one_round(url: str, tokenizer: ChatTokenizer, pattern: str, tasks: list[Task], args) -> dict:
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=17)
    async with InferenceClient(url, "tiny", max_concurrency=args.concurrency) as inference:
        worker = RolloutWorker(inference, tokenizer, bundle=EvaluatorBundle("bench", rollout=conversation(args.turns)),
                               max_concurrent_rollouts=args.concurrency, tokens=pattern)
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            episodes = [e for eps in await asyncio.gather(
                *(worker.rollout_task(t, args.n, sampling, policy_version=0) for t in tasks)) for e in eps]
        finally:
            worker.close()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        requests = inference.stats["requests"]
    steps = [s for e in episodes for t in e.trajectories for s in t.steps]
    failed = sum(e.errors.any for e in episodes)
    out = {"episodes": len(episodes), "failed": failed, "samples": len(steps),
           "tokens": sum(len(s.response_ids) for s in steps), "seconds": round(wall, 4),
           "episodes_per_s": round(len(episodes) / wall, 3), "client_cpu_s": round(cpu, 3),
           "requests_per_sample": round(requests / max(len(steps), 1), 3)}
    if pattern == "recompute":
        kept = [s.metadata["sampled_ids_kept"] for s in steps if "sampled_ids_kept" in s.metadata]
        out["drift"] = round(sum(not k for k in kept) / max(len(kept), 1), 4)
    return out


async def measure(url: str, args) -> dict[str, list[dict]]:
    tokenizer = ChatTokenizer.from_pretrained(args.model)
    tasks = [Task(task_id=f"b{i}", prompt=f"What is {i} + {i + 2}?", ground_truth=str(2 * i + 2))
             for i in range(args.tasks)]
    await one_round(url, tokenizer, "exact", tasks[:1], args)  # warm-up (not reported)
    runs: dict[str, list[dict]] = {p: [] for p in PATTERNS}
    for r in range(args.repeats):
        order = PATTERNS if r % 2 == 0 else PATTERNS[::-1]
        for pattern in order:
            runs[pattern].append(await one_round(url, tokenizer, pattern, tasks, args))
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--n", type=int, default=4, help="episodes per task")
    p.add_argument("--turns", type=int, default=3, help="assistant turns per episode")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    p.add_argument("--quick", action="store_true", help="2 tasks x 2 episodes x 2 turns, 2 rounds")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "rollout_tokens.json"))
    args = p.parse_args(argv)
    if args.quick:
        args.tasks, args.n, args.turns, args.max_tokens, args.repeats = 2, 2, 2, 4, 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    started, machine = _report.started(), _report.machine()
    runs = against_builtin(args.model, args.threads, args.concurrency, out.parent / "rollout_tokens_server.log",
                           lambda url: measure(url, args))
    med = medians(runs)
    report = {
        "benchmark": "rollout_tokens", "model": args.model, "tasks": args.tasks, "n": args.n, "turns": args.turns,
        "max_tokens": args.max_tokens, "concurrency": args.concurrency, "repeats": args.repeats, "quick": args.quick,
        "machine": machine, "started": started, "runs": runs, "medians": med,
        "ratios": {
            "recompute_vs_exact_episodes_per_s": round(statistics.median(
                rc["episodes_per_s"] / ex["episodes_per_s"] for ex, rc in zip(runs["exact"], runs["recompute"])), 4),
            "recompute_requests_per_sample": med["recompute"]["requests_per_sample"],
            "exact_requests_per_sample": med["exact"]["requests_per_sample"],
        },
        "drift": med["recompute"]["drift"],
    }
    _report.write(out, report, {**report["ratios"], "drift": report["drift"]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
