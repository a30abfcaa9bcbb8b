"""How well the trainer's cost model chooses between whole rows and a shared prompt, on this machine.

:mod:`rft_runtime.trainer.prefix` runs a micro-batch whose rows share a prompt either whole (one
forward of every row) or shared (the distinct prompts once, then the rows' continuations against
their key/value cache). It chooses with :class:`~rft_runtime.trainer.prefix.CostModel`, whose
constants were fitted on the 2-core development VM. This benchmark times one micro-batch's forward and
backward (float32, on the CPU, the learner's own ``forward_logits`` and log-probs) both ways over a grid
of shapes (prompt length, continuation length, rows, distinct prompts) for each model, and reports:

- ``ratios.chosen_over_best``: the geometric mean over the grid of the time of the path the cost model
  chooses over the faster of the two (1.0: always the faster one; a time ratio, lower is better);
- ``ratios.token_rule_over_best``: the same for the rule before the cost model (the path that runs
  fewer tokens), the baseline;
- ``ratios.token_rule_over_chosen``: the two against each other (a speed: above 1 the cost model wins);
- ``fit``: the constants a least-squares fit of this run's times gives (seconds per layer), next to
  the model's, and the model's median relative error in predicting a micro-batch's time.

    .venv/bin/python bench/prefix_costs.py [--quick] [--threads 2]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _report

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "api"), str(ROOT / "runtime")]

MODELS = {  # make_tiny_model arguments: the sample job's model, and trainer_vs_trl.py's default model
    "tiny": {},
    "bench": {"hidden": 256, "layers": 4, "heads": 4, "kv_heads": 2, "intermediate": 1024},
}
GRID = [(p, c, rows, prompts) for p in (8, 32, 64, 150, 256, 400) for c in (4, 16, 64, 128, 256)
        for rows, prompts in ((8, 1), (4, 1), (16, 2), (8, 2))]
QUICK_GRID = [(8, 64, 8, 1), (150, 16, 8, 1), (64, 16, 8, 2), (32, 128, 4, 1)]


def micro_batch(vocab: int, prompt: int, cont: int, rows: int, prompts: int, g: torch.Generator):
    from rft_runtime.trainer.batch import TrainSequence, collate

    seqs = []
    for u in range(prompts):
        p = torch.randint(3, vocab, (prompt,), generator=g).tolist()
        for i in range(rows // prompts):
            c = torch.randint(3, vocab, (cont,), generator=g).tolist()
            seqs.append(TrainSequence(group=u, prompt_ids=p, response_ids=c, response_mask=[1] * cont,
                                      inference_logprobs=[0.0] * cont, reward=0.0, version=0, truncated=False,
                                      episode_id=f"{u}:{i}"))
    return collate(seqs)


def time_path(model, batch, shared: bool, reps: int) -> float:
    """The fastest of ``reps`` forward-and-backward passes of ``batch``, whole or shared."""
    from rft_runtime.algos.logits import logprobs_from_logits
    from rft_runtime.trainer import prefix
    from rft_runtime.trainer.learner import forward_logits

    prefix.SHARE_PROMPTS = shared
    # token counts with free forwards share whenever rows share a prompt; equal continuations make one chunk
    prefix.COSTS = prefix.CostModel(token=1.0, pair=0.0, cached=0.0, forward=0.0)
    best = math.inf
    for k in range(reps + 1):
        t0 = time.perf_counter()
        logits, start = forward_logits(model, batch)
        lp = logprobs_from_logits(logits, batch.targets[:, start:], 1.0)
        (lp * batch.loss_mask[:, start:]).sum().backward()
        model.zero_grad(set_to_none=True)
        if k:  # the first pass warms up
            best = min(best, time.perf_counter() - t0)
    return best


def features(p: int, c: int, rows: int, prompts: int) -> tuple[list[float], list[float]]:
    """Per-layer counts (tokens, query-key pairs, cached positions, forwards) of the two paths, as
    :class:`~rft_runtime.trainer.prefix.CostModel` counts them."""
    w = p + c
    whole = [rows * w, rows * w * (w + 1) / 2, 0, 1]
    shared = [prompts * p + rows * c, prompts * p * (p + 1) / 2 + rows * c * (p + c), rows * p, 2]
    return whole, shared


def least_squares(x: list[list[float]], y: list[float]) -> list[float]:
    """Non-negative least squares on relative error (each row weighted by 1 / its time)."""
    a = torch.tensor(x, dtype=torch.float64) / torch.tensor(y, dtype=torch.float64).unsqueeze(1)
    b = torch.ones(len(y), dtype=torch.float64)
    active = list(range(a.shape[1]))
    while True:
        sol = torch.linalg.lstsq(a[:, active], b.unsqueeze(1)).solution[:, 0]
        if (sol >= 0).all() or not active:
            coef = [0.0] * a.shape[1]
            for i, v in zip(active, sol.tolist()):
                coef[i] = v
            return coef
        active = [i for i, v in zip(active, sol.tolist()) if v > 0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help=f"of {', '.join(MODELS)}")
    p.add_argument("--reps", type=int, default=4, help="timed passes per path and shape (the fastest counts)")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--quick", action="store_true", help="the tiny model, 4 shapes, 2 passes each (a smoke test)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "prefix_costs.json"))
    args = p.parse_args()
    models = ["tiny"] if args.quick else args.models.split(",")
    unknown = set(models) - set(MODELS)
    if unknown:
        p.error(f"--models: unknown {sorted(unknown)} (choose from {', '.join(MODELS)})")
    grid, reps = (QUICK_GRID, 2) if args.quick else (GRID, args.reps)
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    from rft_runtime.model import make_tiny_model
    from rft_runtime.trainer import prefix

    report: dict = {"benchmark": "prefix_costs", "quick": args.quick, "started": _report.started(),
                    "machine": _report.machine(threads=args.threads, torch=torch.__version__),
                    "models": {}, "ratios": {}}
    chosen_logs, token_logs = [], []
    for name in models:
        with tempfile.TemporaryDirectory() as tmp:
            md = make_tiny_model(Path(tmp) / "m", seed=0, max_position_embeddings=700, **MODELS[name])
            model = AutoModelForCausalLM.from_pretrained(md, dtype=torch.float32, local_files_only=True).train()
        costs = prefix.CostModel.of(model.config)
        layers = model.config.num_hidden_layers
        g = torch.Generator().manual_seed(0)
        rows_out, xs, ys, errors = [], [], [], []
        for pl, cl, rows, prompts in grid:
            batch = micro_batch(model.config.vocab_size, pl, cl, rows, prompts, g)
            whole, shared = time_path(model, batch, False, reps), time_path(model, batch, True, reps)
            fw, fs = features(pl, cl, rows, prompts)
            pred_whole = layers * costs.whole(rows, pl + cl)
            pred_shared = layers * (costs.whole(prompts, pl) + costs.continuation(rows, pl, cl))
            choose_shared = pred_shared < pred_whole
            fewer_tokens = fs[0] < fw[0]
            best = min(whole, shared)
            chosen_logs.append(math.log((shared if choose_shared else whole) / best))
            token_logs.append(math.log((shared if fewer_tokens else whole) / best))
            errors += [abs(pred_whole / whole - 1), abs(pred_shared / shared - 1)]
            xs += [[v * layers for v in fw], [v * layers for v in fs]]
            ys += [whole, shared]
            rows_out.append({"prompt": pl, "continuation": cl, "rows": rows, "prompts": prompts,
                             "whole_s": round(whole, 5), "shared_s": round(shared, 5),
                             "predicted_whole_s": round(pred_whole, 5), "predicted_shared_s": round(pred_shared, 5),
                             "chosen": "shared" if choose_shared else "whole",
                             "fewer_tokens": "shared" if fewer_tokens else "whole"})
            print(f"{name} prompt {pl:3d} cont {cl:3d} rows {rows:2d}/{prompts}: whole {whole * 1e3:7.2f} ms "
                  f"shared {shared * 1e3:7.2f} ms, predicted {pred_whole * 1e3:7.2f} / {pred_shared * 1e3:7.2f}, "
                  f"chosen {rows_out[-1]['chosen']}", flush=True)
        fit = least_squares(xs, ys)
        report["models"][name] = {
            "config": {"hidden": model.config.hidden_size, "layers": layers, "intermediate":
                       model.config.intermediate_size, "heads": model.config.num_attention_heads,
                       "kv_heads": model.config.num_key_value_heads, "vocab": model.config.vocab_size},
            "cost_model": {"token": costs.token, "pair": costs.pair, "cached": costs.cached, "forward": costs.forward},
            "fit": dict(zip(("token", "pair", "cached", "forward"), fit)),
            "median_relative_error": round(statistics.median(errors), 4),
            "shapes": rows_out}
    report["ratios"] = {
        "chosen_over_best": round(math.exp(statistics.fmean(chosen_logs)), 4),
        "token_rule_over_best": round(math.exp(statistics.fmean(token_logs)), 4),
        "token_rule_over_chosen": round(math.exp(statistics.fmean(token_logs) - statistics.fmean(chosen_logs)), 4)}
    _report.write(args.out, report)
    for name, m in report["models"].items():
        print(f"{name}: median relative error {m['median_relative_error']}, fitted "
              + ", ".join(f"{k} {v:.3g} (model {m['cost_model'][k]:.3g})" for k, v in m["fit"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
