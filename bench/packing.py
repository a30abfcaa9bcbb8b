"""Sequence packing against padding: the trainer's update on GSM8K-length rows, tokens/s and the loss.

A GRPO-shaped batch (groups of ``--group`` samples of one prompt; prompts of 100-200 tokens, responses of
50-300, uniformly drawn, as GSM8K's are) goes through :meth:`rft_runtime.trainer.learner.Learner.update`
(old log-probs from the update's own forward, one AdamW step) three ways, from the same initial weights:

* ``padded``: every row whole, padded to its micro-batch's longest (rows sorted by length, as the trainer
  cuts micro-batches) -- the baseline, measured in the same run;
* ``shared``: the trainer's CPU default, a group's prompt run once (:mod:`rft_runtime.trainer.prefix`);
* ``packed``: ``trainer.sequencePacking``, each micro-batch one packed row (:mod:`rft_runtime.trainer.packing`).

The model is Llama-shaped, randomly initialised from a config (nothing is downloaded): SmolLM2-135M's
config.json where ``hack/smollm2.sh`` has built it under ``$RFT_CACHE/models`` (or ``--config``), else a
4-layer model of its widths (the report says which), its first ``--layers`` decoder layers (6 of 30 by
default: every layer does the same work on the same rows, so the ratios hold, and a round takes a minute on
2 cores rather than minutes). Paths alternate within each round; the fastest round of each counts.
Ratios: tokens/s of ``packed`` and ``shared`` over ``padded``, and the packed loss's relative difference
from the padded one (the same number up to float rounding).

    python bench/packing.py [--config PATH] [--batch 8] [--micro-batch 4] [--rounds 3] [--layers 6] [--threads 2] [--quick]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import sys
import time
from pathlib import Path

import _report

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "api"), str(ROOT / "runtime")]

SMALL = {"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 4, "num_attention_heads": 9,
         "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152, "head_dim": 64,
         "tie_word_embeddings": True, "max_position_embeddings": 2048}
"""SmolLM2-135M's widths with 4 layers: the model where its config is not on this machine."""


def find_config(path: str | None) -> tuple[dict, str]:
    if path:
        return json.loads(Path(path).read_text()), path
    cache = os.environ.get("RFT_CACHE", str(Path.home() / ".cache" / "rft-operator"))
    found = sorted(glob.glob(f"{cache}/models/SmolLM2-135M-Instruct-*/config.json"))
    if found:
        return json.loads(Path(found[-1]).read_text()), found[-1]
    return dict(SMALL), "SmolLM2-135M's widths, 4 layers (its config.json is not under $RFT_CACHE/models)"


def gsm8k_rows(n: int, group: int, vocab: int, seed: int = 0) -> list:
    from rft_runtime.trainer.batch import TrainSequence

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        if i % group == 0:
            prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(100, 200))]
        r = rng.randint(50, 300)
        rows.append(TrainSequence(
            group=f"t{i // group}", prompt_ids=prompt, response_ids=[rng.randrange(3, vocab) for _ in range(r)],
            response_mask=[1] * r, inference_logprobs=[-1.0] * r, reward=float(rng.random() < 0.4), version=0,
            truncated=False, episode_id=f"t{i // group}:{i % group}"))
    return rows


def one_update(model, init, batch, adv, mbs: int, path: str) -> tuple[float, float]:
    """(seconds, loss) of one update from the initial weights ``init`` along ``path``."""
    from rft_runtime.trainer import prefix
    from rft_runtime.trainer.learner import Learner, LearnerConfig, build_optimizer

    model.load_state_dict(init)
    prefix.SHARE_PROMPTS = path == "shared"
    learner = Learner(model, LearnerConfig(micro_batch_size=mbs, sequence_packing=path == "packed"),
                      build_optimizer(list(model.parameters()), 1e-6, 0.0))
    t0 = time.perf_counter()
    m = learner.update(batch, adv.advantages.float(), adv.valid, None)
    return time.perf_counter() - t0, float(m["loss"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="a config.json (default: SmolLM2-135M's, see above)")
    p.add_argument("--batch", type=int, default=8, help="rows in the batch")
    p.add_argument("--group", type=int, default=4, help="samples per prompt")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3, help="rounds of the three paths (the fastest counts)")
    p.add_argument("--layers", type=int, default=6,
                   help="decoder layers kept of the config's (0: all; SmolLM2's 30 take minutes a round on 2 cores)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="the 4-layer model, 8 rows, one round (a smoke test)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "packing.json"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoConfig, AutoModelForCausalLM

    from rft_runtime.algos import compute_advantages
    from rft_runtime.trainer.batch import collate

    config, source = (dict(SMALL), "SmolLM2-135M's widths, 4 layers (--quick)") if args.quick else find_config(args.config)
    n, rounds = (8, 1) if args.quick else (args.batch, args.rounds)
    if args.layers and not args.quick:
        config["num_hidden_layers"] = min(args.layers, int(config["num_hidden_layers"]))
    report: dict = {"benchmark": "packing", "quick": args.quick, "started": _report.started(),
                    "machine": _report.machine(threads=args.threads, torch=torch.__version__),
                    "model": {"config": source, "layers": config["num_hidden_layers"],
                              "hidden": config["hidden_size"]}}
    cfg = AutoConfig.for_model(**{k: v for k, v in config.items() if k not in ("architectures", "transformers_version")})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    seqs = gsm8k_rows(n, args.group, int(config["vocab_size"]))
    batch = collate(seqs)
    adv = compute_advantages("grpo", torch.tensor([s.reward for s in seqs], dtype=torch.float64),
                             [s.group for s in seqs])
    tokens = int(batch.lengths.sum())
    report["batch"] = {"rows": n, "micro_batch": args.micro_batch, "tokens": tokens,
                       "padded_tokens": int(batch.input_ids.numel())}
    paths = ("padded", "shared", "packed")
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in paths}
    for r in range(rounds):
        for path in paths if r % 2 == 0 else paths[::-1]:
            runs[path].append(one_update(model, init, batch, adv, args.micro_batch, path))
            print(f"round {r} {path}: {runs[path][-1][0]:.2f} s, loss {runs[path][-1][1]:.8f}", flush=True)
    best = {k: min(s for s, _ in v) for k, v in runs.items()}
    loss = {k: v[0][1] for k, v in runs.items()}
    report["paths"] = {k: {"seconds": round(best[k], 3), "tokens_per_s": round(tokens / best[k], 1),
                           "loss": loss[k]} for k in paths}
    report["runs"] = {k: [[round(s, 3), lo] for s, lo in v] for k, v in runs.items()}
    report["ratios"] = {
        "packed_over_padded_tokens_per_s": round(best["padded"] / best["packed"], 3),
        "shared_over_padded_tokens_per_s": round(best["padded"] / best["shared"], 3),
        "packed_loss_relative_difference": abs(loss["packed"] - loss["padded"]) / max(abs(loss["padded"]), 1e-30),
    }
    _report.write(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
