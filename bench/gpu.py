"""The trainer and the builtin engine on one accelerator, with a model of a few hundred million parameters.

The model is built offline by our own code (:func:`rft_runtime.model.make_tiny_model` at larger sizes,
random weights, the byte-level tokenizer): by default hidden 1024, 24 layers, 16 heads, 4 KV heads,
MLP 4096, about 0.33 B parameters. On ``--device`` (``cuda`` by default when there is one):

1. **generate**: the builtin engine's iteration loop (:class:`rft_runtime.serve.batch.RunningBatch`,
   preallocated per-slot KV cache, one forward per iteration) samples ``--gen-batch`` sequences of
   ``--resp-len`` tokens (temperature 1, ignore_eos, log-probs on) from ``--prompt-len``-token prompts,
   in the engine's compute dtype (``--engine-dtype``, bfloat16 by default on a GPU). Baseline, same
   run, interleaved: a bare transformers loop (prefill, then one forward per token with a
   ``DynamicCache``) on the same model. Reports tokens/s and peak memory.
2. **logprob parity**: the trainer's log-probs of the sampled tokens, computed the trainer's way
   (one process: a plain module, float32 master weights, bfloat16 compute under autocast on a GPU,
   float32 log-prob math), against the engine's; mean / p99 / max of |trainer - inference| over the response
   tokens, and the same for float32 on both sides (the numerical floor).
3. **train step**: one GRPO step on those sequences (old log-probs + one AdamW update, the trainer's
   :class:`~rft_runtime.trainer.learner.Learner`), per micro-batch size: seconds per step,
   tokens/s, peak memory. Baseline, same run: the same step with float32 compute.

``ratios``: ``engine_vs_hf_loop`` (tokens/s, higher is better) and ``train_default_vs_fp32_mb<M>`` (the
trainer's default compute dtype over float32 compute, tokens/s, higher is better); ``parity``:
``trainer_vs_engine`` (each side's default dtype) and ``fp32_trainer_vs_fp32_engine``.

    python bench/gpu.py [--device cuda] [--quick] [--out bench/results/gpu.json]

``--quick`` shrinks the model, the batch and the lengths so that the script runs on the CPU in a test.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import _report  # noqa: E402
import torch  # noqa: E402

from rft_runtime.algos import compute_advantages  # noqa: E402
from rft_runtime.serve.batch import RunningBatch, Sequence  # noqa: E402
from rft_runtime.serve.model import load_model  # noqa: E402
from rft_runtime.serve.protocol import SamplingParams  # noqa: E402
from rft_runtime.trainer import distributed  # noqa: E402
from rft_runtime.trainer.batch import TrainSequence, collate  # noqa: E402
from rft_runtime.trainer.learner import Learner, LearnerConfig, build_optimizer, sequence_logprobs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_mb(device: torch.device) -> float | None:
    """Peak allocated accelerator memory since the last :func:`reset_peak` (None on the CPU)."""
    return round(torch.cuda.max_memory_allocated(device) / 2**20, 1) if device.type == "cuda" else None


def make_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n, length), generator=g).tolist()


def generate_engine(lm, prompts: list[list[int]], resp_len: int, seed: int) -> tuple[list[Sequence], float]:
    """Sample every prompt once through the engine's iteration loop; (sequences, seconds)."""
    rb = RunningBatch(lm.model, pad_token_id=lm.pad_token_id, eos_token_ids=lm.eos_token_ids, device=lm.device,
                      max_slots=len(prompts), max_len=lm.max_model_len)
    seqs = [Sequence(prompt=p, params=SamplingParams(max_tokens=resp_len, temperature=1.0, ignore_eos=True,
                                                      logprobs=0, seed=seed + i), index=i)
            for i, p in enumerate(prompts)]
    pending = seqs
    sync(lm.device)
    t0 = time.perf_counter()
    with torch.no_grad():
        while len(rb) or pending:
            rb.step(pending)
            pending = []
    sync(lm.device)
    seconds = time.perf_counter() - t0
    assert all(len(s.output) == resp_len and len(s.logprobs) == resp_len for s in seqs)
    return seqs, seconds


def generate_hf(lm, prompts: list[list[int]], resp_len: int) -> float:
    """The same sampling through a bare transformers loop; seconds."""
    from transformers import DynamicCache

    ids = torch.tensor(prompts, device=lm.device)
    sync(lm.device)
    t0 = time.perf_counter()
    with torch.no_grad():
        cache, feed, out = DynamicCache(), ids, []
        for _ in range(resp_len):
            logits = lm.model(input_ids=feed, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
            lp = torch.log_softmax(logits.float(), dim=-1)
            feed = torch.multinomial(lp.exp(), 1)
            out.append((feed, lp.gather(1, feed)))
    torch.cat([t for t, _ in out], 1).tolist()
    torch.cat([x for _, x in out], 1).tolist()
    sync(lm.device)
    return time.perf_counter() - t0


def train_sequences(seqs: list[Sequence], group: int, seed: int) -> list[TrainSequence]:
    rng = random.Random(seed)
    return [TrainSequence(group=f"t{i // group}:default", prompt_ids=list(s.prompt), response_ids=list(s.output),
                          response_mask=[1] * len(s.output), inference_logprobs=list(s.logprobs),
                          reward=float(rng.random() < 0.4), version=0, truncated=False,
                          episode_id=f"t{i // group}:{i % group}")
            for i, s in enumerate(seqs)]


def trainer_model(model_dir: Path, ctx: distributed.DistContext, compute: torch.dtype | None) -> torch.nn.Module:
    """The policy as the trainer holds it (:func:`rft_runtime.trainer.distributed.shard`): float32 master
    weights, ``compute`` the dtype of forward and backward, its layers compiled where
    ``trainer.compile: auto`` compiles them (a GPU)."""
    from transformers import AutoModelForCausalLM

    from rft_runtime.trainer.compiled import wants_compile

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
    return distributed.shard(model, ctx, compute, compile_layers=wants_compile("auto", ctx.device))


def parity(model: torch.nn.Module, batch, seqs: list[TrainSequence], mbs: int) -> dict:
    """|trainer - inference| over every response token."""
    lp = sequence_logprobs(model, batch, 1.0, mbs)
    diffs = []
    for i, s in enumerate(seqs):
        start = len(s.prompt_ids) - 1  # the target at position p is token p + 1
        ours = lp[i, start:start + len(s.response_ids)]
        diffs.append((ours - torch.tensor(s.inference_logprobs)).abs())
    d = torch.cat(diffs).double()
    return {"tokens": int(d.numel()), "absdiff_mean": float(d.mean()), "absdiff_p99": float(d.quantile(0.99)),
            "absdiff_max": float(d.max()),
            "inference_logprob_mean": float(torch.tensor([x for s in seqs for x in s.inference_logprobs]).mean())}


def train_step(model: torch.nn.Module, batch, seqs: list[TrainSequence], mbs: int, repeats: int,
               device: torch.device) -> dict:
    """Old log-probs + one update, ``repeats`` times after a warm-up; the median."""
    learner = Learner(model, LearnerConfig(micro_batch_size=mbs), build_optimizer(list(model.parameters()), 1e-6, 0.0))
    rewards = torch.tensor([s.reward for s in seqs], dtype=torch.float64)
    adv = compute_advantages("grpo", rewards, [s.group for s in seqs])
    tokens = int(batch.attention_mask.sum())
    times, metrics = [], {}
    reset_peak(device)
    for r in range(repeats + 1):
        sync(device)
        t0 = time.perf_counter()
        old = learner.logprobs(batch)
        metrics = learner.update(batch, adv.advantages.float(), adv.valid, old)
        sync(device)
        if r:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return {"micro_batch_size": mbs, "seconds_per_step": round(med, 4), "tokens": tokens,
            "tokens_per_s": round(tokens / med, 1), "peak_memory_mb": peak_mb(device),
            "grad_norm": metrics.get("grad_norm"), "repeats": repeats}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=4096)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--resp-len", type=int, default=512)
    p.add_argument("--gen-batch", type=int, default=64, help="sequences generated together (and trained on)")
    p.add_argument("--group", type=int, default=8, help="samples per prompt group for the GRPO advantages")
    p.add_argument("--micro-batches", default="8,16,32")
    p.add_argument("--engine-dtype", default=None, help="default: bfloat16 on a GPU, float32 on the CPU")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--keep-model", default=None, help="write the model here (and keep it) instead of a temp dir")
    p.add_argument("--quick", action="store_true", help="a small model, batch and lengths (runs on the CPU)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu.json"))
    args = p.parse_args(argv)
    if args.quick:
        args.hidden, args.layers, args.heads, args.kv_heads, args.intermediate = 64, 2, 4, 2, 128
        args.prompt_len, args.resp_len, args.gen_batch, args.group = 8, 8, 8, 4
        args.micro_batches, args.repeats = "4", 1
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    engine_dtype = args.engine_dtype or ("bfloat16" if gpu else "float32")
    micro = [int(x) for x in args.micro_batches.split(",")]
    ctx = distributed.DistContext()
    distributed.ensure_group(ctx)
    if ctx.device.type != device.type:
        raise SystemExit(f"--device {device}: the trainer's process group is on {ctx.device}")
    device = ctx.device
    report: dict = {"benchmark": "gpu", "quick": args.quick, "device": str(device),
                    "machine": _report.machine(torch=torch.__version__,
                                               gpu=torch.cuda.get_device_name(device) if gpu else None),
                    "started": _report.started(),
                    "shape": {"prompt_len": args.prompt_len, "resp_len": args.resp_len, "gen_batch": args.gen_batch,
                              "group": args.group, "engine_dtype": engine_dtype,
                              "trainer_compute_dtype": "bfloat16" if gpu else "float32",
                              "trainer_master_dtype": "float32"}}
    from rft_runtime.model import make_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.keep_model or Path(tmp) / "model")
        t0 = time.perf_counter()
        make_tiny_model(model_dir, seed=0, hidden=args.hidden, layers=args.layers, heads=args.heads,
                        kv_heads=args.kv_heads, intermediate=args.intermediate,
                        max_position_embeddings=args.prompt_len + args.resp_len + 8)
        lm = load_model(model_dir, dtype=engine_dtype, device=str(device))
        n_params = sum(x.numel() for x in lm.model.parameters())
        report["model"] = {"parameters": n_params, "hidden": args.hidden, "layers": args.layers, "heads": args.heads,
                           "kv_heads": args.kv_heads, "intermediate": args.intermediate, "vocab": lm.vocab_size,
                           "build_s": round(time.perf_counter() - t0, 1)}
        print(f"model: {n_params / 1e6:.1f} M parameters, engine {engine_dtype} on {device}", flush=True)

        # 1. generation, engine against the bare HF loop, interleaved
        prompts = make_prompts(args.gen_batch, args.prompt_len, lm.vocab_size, seed=1)
        generate_engine(lm, prompts[:2], 4, seed=0)  # warm-up
        generate_hf(lm, prompts[:2], 4)
        eng_s, hf_s, seqs = [], [], []
        reset_peak(device)
        for r in range(args.repeats):
            for name in (("engine", "hf") if r % 2 == 0 else ("hf", "engine")):
                if name == "engine":
                    seqs, s = generate_engine(lm, prompts, args.resp_len, seed=1000)
                    eng_s.append(s)
                else:
                    hf_s.append(generate_hf(lm, prompts, args.resp_len))
        gen_tokens = args.gen_batch * args.resp_len
        report["generate"] = {
            "engine": {"seconds": round(statistics.median(eng_s), 4),
                       "tokens_per_s": round(gen_tokens / statistics.median(eng_s), 1)},
            "hf_loop": {"seconds": round(statistics.median(hf_s), 4),
                        "tokens_per_s": round(gen_tokens / statistics.median(hf_s), 1)},
            "peak_memory_mb": peak_mb(device), "tokens": gen_tokens}
        print(f"generate: engine {report['generate']['engine']['tokens_per_s']} tokens/s, "
              f"HF loop {report['generate']['hf_loop']['tokens_per_s']} tokens/s", flush=True)
        del lm
        reset_peak(device)

        # 2. parity: the trainer's log-probs (its own compute dtype) against the engine's, and fp32 on both sides
        tseqs = train_sequences(seqs, args.group, seed=2)
        batch = collate(tseqs)
        policy = trainer_model(model_dir, ctx, distributed_compute(device))
        report["parity"] = {"trainer_vs_engine": parity(policy, batch, tseqs, max(micro))}
        lm32 = load_model(model_dir, dtype="float32", device=str(device))
        seqs32, _ = generate_engine(lm32, prompts, args.resp_len, seed=1000)
        del lm32
        t32 = train_sequences(seqs32, args.group, seed=2)
        b32 = collate(t32)
        p32 = trainer_model(model_dir, ctx, None)
        report["parity"]["fp32_trainer_vs_fp32_engine"] = parity(p32, b32, t32, max(micro))
        print("parity:", json.dumps(report["parity"]), flush=True)

        # 3. the train step, mixed precision (the trainer's GPU default) against float32 compute
        report["train"] = {"tokens_per_step": int(batch.attention_mask.sum()), "ours": [], "fp32_compute": []}
        for mbs in micro:
            for key, model in (("ours", policy), ("fp32_compute", p32)):
                row = train_step(model, batch, tseqs, mbs, args.repeats, device)
                report["train"][key].append(row)
                print(f"train {key:>12} micro-batch {mbs:>3}: {row['seconds_per_step']:.3f} s/step, "
                      f"{row['tokens_per_s']:.0f} tokens/s, peak {row['peak_memory_mb']} MB", flush=True)
    ratios = {"engine_vs_hf_loop": round(statistics.median(h / e for e, h in zip(eng_s, hf_s)), 3)}
    for ours, base in zip(report["train"]["ours"], report["train"]["fp32_compute"]):
        ratios[f"train_default_vs_fp32_mb{ours['micro_batch_size']}"] = round(ours["tokens_per_s"] / base["tokens_per_s"], 3)
    report["ratios"] = ratios
    distributed.leave_group()
    _report.write(args.out, report, show={**ratios, **{f"logprob_absdiff_mean_{k}": v["absdiff_mean"]
                                                       for k, v in report["parity"].items()}})
    return 0


def distributed_compute(device: torch.device) -> torch.dtype | None:
    """The trainer's compute dtype for ``model.dtype: auto`` on ``device``."""
    from rft_runtime.trainer.model_io import compute_dtype

    return compute_dtype("auto", device)


if __name__ == "__main__":
    sys.exit(main())
