"""Trainer step throughput: tokens/s and peak memory of one update for several micro-batch sizes.

Builds a synthetic GRPO batch on the tiny model (or ``--model DIR``), times
:meth:`rft_runtime.trainer.learner.Learner.update` (old log-probs + one optimiser step) for each
micro-batch size, and writes ``bench/results/trainer.json``. The baseline is micro-batch 1,
measured in the same run; ``speedup`` is tokens/s relative to it. Each size runs in a fresh
child process; peak memory is that child's peak RSS growth during the measurement on CPU (after
model and batch are built), ``torch.cuda.max_memory_allocated`` on GPU.

    python bench/trainer.py [--sizes 1,2,4,8,16,32] [--batch 64] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402

from rft_runtime.algos import compute_advantages  # noqa: E402
from rft_runtime.trainer.batch import TrainSequence, collate  # noqa: E402
from rft_runtime.trainer.learner import Learner, LearnerConfig, build_optimizer  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "trainer.json"


def synthetic_batch(n: int, group: int, prompt_len: int, resp_len: int, vocab: int, seed: int = 0):
    rng = random.Random(seed)
    seqs = []
    for i in range(n):
        r = rng.randint(max(1, resp_len // 2), resp_len)
        seqs.append(TrainSequence(
            group=f"t{i // group}:default", prompt_ids=[rng.randrange(3, vocab) for _ in range(prompt_len)],
            response_ids=[rng.randrange(3, vocab) for _ in range(r)], response_mask=[1] * r,
            inference_logprobs=[-rng.uniform(0.1, 3) for _ in range(r)], reward=float(rng.random() < 0.4),
            version=0, truncated=False, episode_id=f"t{i // group}:{i % group}"))
    return seqs


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure(model_dir: Path, seqs, mbs: int, repeats: int, device: str) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    learner = Learner(model, LearnerConfig(micro_batch_size=mbs), build_optimizer(list(model.parameters()), 1e-5, 0.0))
    batch = collate(seqs)
    rss0 = peak_rss_mb()
    if device != "cpu":
        batch = type(batch)(**{k: v.to(device) for k, v in batch.__dict__.items()})
    rewards = torch.tensor([s.reward for s in seqs], dtype=torch.float64)
    adv = compute_advantages("grpo", rewards, [s.group for s in seqs])
    tokens = int(batch.attention_mask.sum())
    times = []
    if device != "cpu":
        torch.cuda.reset_peak_memory_stats()
    for r in range(repeats + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        old = learner.logprobs(batch)
        learner.update(batch, adv.advantages.float().to(device), adv.valid.to(device), old)
        if device != "cpu":
            torch.cuda.synchronize()
        if r:
            times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated() / 2**20) if device != "cpu" else max(peak_rss_mb() - rss0, 0.0)
    med = statistics.median(times)
    # old log-probs (1 forward) + update (forward + backward): tokens processed per wall second
    return {"micro_batch_size": mbs, "seconds_per_step": med, "tokens": tokens, "tokens_per_s": tokens / med,
            "peak_memory_mb": peak, "repeats": repeats}


def _child(model_dir: str, seqs, mbs: int, repeats: int, device: str, threads: int) -> dict:
    torch.set_num_threads(threads)
    return measure(Path(model_dir), seqs, mbs, repeats, device)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model directory (default: a fresh random tiny model)")
    p.add_argument("--sizes", default="1,2,4,8,16,32")
    p.add_argument("--batch", type=int, default=64, help="sequences per step")
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=48)
    p.add_argument("--resp-len", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = [int(x) for x in args.sizes.split(",")]
    if 1 not in sizes:
        sizes = [1] + sizes
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            model_dir = Path(args.model)
        else:
            from rft_runtime.model import make_tiny_model

            model_dir = make_tiny_model(Path(tmp) / "tiny", seed=0)
        from transformers import AutoConfig

        vocab = AutoConfig.from_pretrained(model_dir).vocab_size
        seqs = synthetic_batch(args.batch, args.group, args.prompt_len, args.resp_len, vocab)
        rows = []
        ctx = multiprocessing.get_context("spawn")
        for mbs in sizes:
            with ctx.Pool(1) as pool:
                row = pool.apply(_child, (str(model_dir), seqs, mbs, args.repeats, args.device, args.threads))
            rows.append(row)
            print(f"micro-batch {mbs:>4}: {row['tokens_per_s']:10.0f} tokens/s  {row['seconds_per_step']:.3f} s/step  "
                  f"peak +{row['peak_memory_mb']:.0f} MB", flush=True)
    base = next(r for r in rows if r["micro_batch_size"] == 1)
    for r in rows:
        r["speedup_vs_micro_batch_1"] = r["tokens_per_s"] / base["tokens_per_s"]
    out = {"benchmark": "trainer_step", "baseline": "micro_batch_size=1, same run",
           "device": args.device, "threads": args.threads, "batch": args.batch, "prompt_len": args.prompt_len,
           "resp_len": args.resp_len, "model": str(args.model or "builtin tiny (random init)"),
           "python": sys.version.split()[0], "torch": torch.__version__, "machine": platform.machine(),
           "cpu_count": os.cpu_count(), "results": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
