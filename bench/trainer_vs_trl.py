"""Our trainer step against TRL's GRPOTrainer on one frozen batch: step time, step-1 loss and gradient norm.

One frozen GRPO batch (``--batch`` sequences in groups of ``--group``, the rows of a group sampled from
one prompt: random prompts of ``--prompt-len`` tokens, random completions of up to ``--resp-len`` tokens, 0/1 rewards, the GRPO
advantages computed once) goes through

- **ours**: the trainer's update as the trainer runs it (one process: a plain module; on a GPU, or
  with ``--bf16``, float32 master weights and bfloat16 compute under ``torch.autocast``;
  :class:`rft_runtime.trainer.learner.Learner`: micro-batches of ``--micro-batch``, the token-mean
  loss over the whole batch, gradient clipping, AdamW; its decoder layers compiled where
  ``trainer.compile: auto`` compiles them, on a GPU), once as the trainer's default step takes its old
  log-probs (``ours``: ``trainer.oldLogprobs: recompute`` with one epoch, no TIS and no dropout, so they
  come from the update's own forward, as TRL takes them with one iteration a batch: the same work as
  TRL's step), once with the separate no-gradient pass that ``recompute`` makes where the update cannot
  supply them (``ours_recompute``: several epochs, TIS, KL in the reward, dropout), and once running every row whole (``ours_whole_rows``:
  without :mod:`rft_runtime.trainer.prefix`, which runs a group's shared prompt once), once never
  compiled (``ours_eager``: ``trainer.compile: never``), once always compiled (``ours_compiled``:
  ``trainer.compile: always``, which on the CPU is not the default), and once under
  FSDP2 over a process group of one (``ours_fsdp``: how the trainer ran one GPU process before
  2026-11-25, with FSDP2's ``MixedPrecisionPolicy`` for bfloat16);
- **trl**: TRL's ``GRPOTrainer`` (from PyPI, ``requirements/trl.txt``; run with ``--trl-python``,
  ``hack/trl-venv.sh`` builds one) with the same settings: ``loss_type="dapo"`` (the token-mean over the
  whole batch), ``beta=0``, ``epsilon=0.2``, ``per_device_train_batch_size`` = the micro-batch,
  ``gradient_accumulation_steps`` = batch / micro-batch, ``max_grad_norm=1``, a constant learning rate,
  no gradient checkpointing, ``bf16`` on a GPU or with ``--bf16``; its generation is replaced by the frozen batch (a
  subclass returns it from ``_generate_and_score_completions``), so its own training loop,
  accumulation, clipping and optimizer run unchanged.

Each side runs in a fresh process, ``--rounds`` times, interleaved (ours, trl, ours-recompute,
ours-whole-rows, ours-eager, ours-compiled, ours-fsdp, then the reverse order; ``--sides`` runs fewer), each run one
warm-up step (step 1: its loss and gradient norm are compared; its time, compilation included, is
reported) and ``--steps`` timed steps; medians are reported. Prompts all have the same length, so neither side pads a
prompt and the two compute the same log-probabilities.

``ratios``: ``step_time_ours_over_trl`` (a time ratio: lower is better; goal <= 0.8) and
``step_time_<side>_over_trl`` for each other side that ran; ``agreement``: the step-1 ``loss_rel_diff`` and
``grad_norm_rel_diff`` (|ours - trl| / |trl|, ``ours`` against TRL).

    .venv/bin/python bench/trainer_vs_trl.py --trl-python $(bash hack/trl-venv.sh) [--quick] [--bf16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _report

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "api"), str(ROOT / "runtime")]  # the project without an install (a GPU machine)
SIDES = ("ours", "trl", "ours_recompute", "ours_whole_rows", "ours_eager", "ours_compiled", "ours_fsdp")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_mb(device: torch.device) -> float | None:
    return round(torch.cuda.max_memory_allocated(device) / 2**20, 1) if device.type == "cuda" else None


# ---------------------------------------------------------------------------------------- the frozen batch

def make_frozen(model_dir: Path, n: int, group: int, prompt_len: int, resp_len: int, seed: int) -> dict:
    """Prompts, completions, rewards, GRPO advantages, and the model's own log-probs of the completions
    (float32: what an engine serving these weights would have reported)."""
    from transformers import AutoModelForCausalLM

    from rft_runtime.algos import compute_advantages

    g = torch.Generator().manual_seed(seed)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True).eval().to(dev)
    vocab = model.config.vocab_size
    # GRPO: a group is `group` samples of one prompt
    prompts = torch.randint(3, vocab, (-(-n // group), prompt_len), generator=g).repeat_interleave(group, 0)[:n].tolist()
    lengths = torch.randint(max(1, resp_len // 2), resp_len + 1, (n,), generator=g).tolist()
    completions = [torch.randint(3, vocab, (k,), generator=g).tolist() for k in lengths]
    rewards = (torch.rand(n, generator=g) < 0.4).double()
    groups = [f"t{i // group}" for i in range(n)]
    adv = compute_advantages("grpo", rewards, groups)
    logprobs = []
    with torch.no_grad():
        for p, c in zip(prompts, completions):
            ids = torch.tensor([p + c], device=dev)
            lp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
            logprobs.append(lp[len(p) - 1:].gather(1, ids[0, len(p):, None])[:, 0].tolist())
    del model
    return {"prompts": prompts, "completions": completions, "rewards": rewards.tolist(), "groups": groups,
            "advantages": adv.advantages.tolist(), "valid": adv.valid.tolist(), "logprobs": logprobs}


# ---------------------------------------------------------------------------------------- ours

def run_ours(model_dir: Path, frozen: dict, micro: int, steps: int, old_logprobs: str, share: bool = True,
             bf16: bool = False, fsdp: bool = False, compile_setting: str = "auto") -> dict:
    from transformers import AutoModelForCausalLM

    from rft_runtime.trainer import distributed, prefix
    from rft_runtime.trainer.batch import TrainSequence, collate
    from rft_runtime.trainer.compiled import wants_compile
    from rft_runtime.trainer.learner import Learner, LearnerConfig, build_optimizer
    from rft_runtime.trainer.model_io import compute_dtype

    prefix.SHARE_PROMPTS = share
    ctx = distributed.DistContext()
    distributed.ensure_group(ctx)
    dev = ctx.device
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
    cdt = torch.bfloat16 if bf16 else compute_dtype("auto", dev)
    compiled = wants_compile(compile_setting, dev)  # as the trainer decides (trainer.compile)
    if fsdp:
        model = distributed.fsdp(model, ctx, cdt)
    else:
        model = distributed.shard(model, ctx, cdt, compile_layers=compiled)
    learner = Learner(model, LearnerConfig(policy_loss="ppo_clip", loss_aggregation="token-mean", clip_low=0.2,
                                           clip_high=0.2, epochs=1, micro_batch_size=micro, grad_clip=1.0),
                      build_optimizer(list(model.parameters()), 1e-6, 0.0))
    seqs = [TrainSequence(group=g, prompt_ids=p, response_ids=c, response_mask=[1] * len(c), inference_logprobs=lp,
                          reward=r, version=0, truncated=False, episode_id=f"{g}:{i}")
            for i, (g, p, c, lp, r) in enumerate(zip(frozen["groups"], frozen["prompts"], frozen["completions"],
                                                     frozen["logprobs"], frozen["rewards"]))]
    adv = torch.tensor(frozen["advantages"], dtype=torch.float32)
    valid = torch.tensor(frozen["valid"], dtype=torch.bool)
    times, first = [], {}
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    for s in range(steps + 1):
        sync(dev)
        t0 = time.perf_counter()
        batch = collate(seqs)  # part of the trainer's step
        # "update": None, the update's own forward gives them (Learner.update)
        old = learner.logprobs(batch) if old_logprobs == "recompute" else None
        m = learner.update(batch, adv, valid, old)
        sync(dev)
        if s == 0:
            first = {"loss": m["loss"], "grad_norm": m["grad_norm"], "step_s": time.perf_counter() - t0}
        else:
            times.append(time.perf_counter() - t0)
    distributed.leave_group()
    return {"step_s": times, "step1": first, "peak_memory_mb": peak_mb(dev), "device": str(dev),
            "compiled": compiled}


# ---------------------------------------------------------------------------------------- TRL

def run_trl(model_dir: Path, frozen: dict, micro: int, steps: int, workdir: Path, bf16: bool = False) -> dict:
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    n = len(frozen["prompts"])
    group = sum(1 for g in frozen["groups"] if g == frozen["groups"][0])
    width = max(len(c) for c in frozen["completions"])
    completion_ids = torch.zeros((n, width), dtype=torch.long)
    completion_mask = torch.zeros((n, width), dtype=torch.long)
    for i, c in enumerate(frozen["completions"]):
        completion_ids[i, :len(c)] = torch.tensor(c)
        completion_mask[i, :len(c)] = 1
    valid = torch.tensor(frozen["valid"], dtype=torch.bool)
    completion_mask = completion_mask * valid[:, None]  # rows the advantage estimator dropped, as ours does
    prompt_ids = torch.tensor(frozen["prompts"])
    batch = {"prompt_ids": prompt_ids.to(dev), "prompt_mask": torch.ones_like(prompt_ids).to(dev),
             "completion_ids": completion_ids.to(dev), "completion_mask": completion_mask.to(dev),
             "advantages": torch.tensor(frozen["advantages"], dtype=torch.float32).to(dev),
             "num_items_in_batch": completion_mask.sum().to(dev)}

    class FrozenBatchGRPO(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):  # the frozen batch instead of generating
            return {k: v.clone() for k, v in batch.items()}

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.marks: list[float] = []
            self.logs: list[dict] = []

        def on_train_begin(self, args, state, control, **kw):
            sync(dev)
            self.marks.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            sync(dev)
            self.marks.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            self.logs.append(dict(logs or {}))

    def zero_reward(completions, **kw):
        return [0.0] * len(completions)

    args = GRPOConfig(
        output_dir=str(workdir), per_device_train_batch_size=micro, gradient_accumulation_steps=n // micro,
        num_generations=group, max_completion_length=width, learning_rate=1e-6, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
        beta=0.0, epsilon=0.2, loss_type="dapo", temperature=1.0, max_steps=steps + 1, logging_steps=1,
        report_to="none", save_strategy="no", bf16=cuda or bf16, use_cpu=not cuda, gradient_checkpointing=False,
        disable_tqdm=True, seed=0, dataloader_num_workers=0, model_init_kwargs={"dtype": torch.float32},
        log_completions=False)
    clock = Clock()
    trainer = FrozenBatchGRPO(model=str(model_dir), reward_funcs=zero_reward, args=args,
                              train_dataset=Dataset.from_dict({"prompt": ["x"] * (n * (steps + 2))}),
                              processing_class=AutoTokenizer.from_pretrained(model_dir, local_files_only=True),
                              callbacks=[clock])
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    trainer.train()
    marks = clock.marks
    step_logs = [x for x in clock.logs if "grad_norm" in x]
    return {"step_s": [b - a for a, b in zip(marks[1:], marks[2:])],
            "step1": {"loss": step_logs[0].get("loss"), "grad_norm": step_logs[0].get("grad_norm"),
                      "step_s": marks[1] - marks[0]},
            "peak_memory_mb": peak_mb(dev), "device": str(dev), "trl": trl.__version__}


# ---------------------------------------------------------------------------------------- driver

def child(args: argparse.Namespace) -> int:
    frozen = json.loads(Path(args.frozen).read_text())
    torch.manual_seed(0)
    if not torch.cuda.is_available():
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.side == "trl":
            res = run_trl(Path(args.model), frozen, args.micro_batch, args.steps, Path(tmp), args.bf16)
        else:
            res = run_ours(Path(args.model), frozen, args.micro_batch, args.steps,
                           "recompute" if args.side == "ours_recompute" else "update",
                           share=args.side != "ours_whole_rows", bf16=args.bf16, fsdp=args.side == "ours_fsdp",
                           compile_setting={"ours_eager": "never", "ours_compiled": "always"}.get(args.side, "auto"))
    print("RESULT " + json.dumps(res), flush=True)
    return 0


def run_side(python: str, side: str, model_dir: Path, frozen: Path, args: argparse.Namespace) -> dict:
    cmd = [python, str(Path(__file__).resolve()), "--side", side, "--model", str(model_dir), "--frozen", str(frozen),
           "--micro-batch", str(args.micro_batch), "--steps", str(args.steps), "--threads", str(args.threads),
           *(["--bf16"] if args.bf16 else [])]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "api"), str(ROOT / "runtime"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        raise RuntimeError(f"{side} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return json.loads(line[len("RESULT "):])


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trl-python", default=None, help="a python with TRL (default: this one)")
    p.add_argument("--model", default=None, help="model directory (default: a random model of --hidden/--layers)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--resp-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=3, help="timed steps per run (after one warm-up step)")
    p.add_argument("--rounds", type=int, default=3, help="runs of each side, interleaved")
    p.add_argument("--threads", type=int, default=2, help="torch threads on the CPU (both sides)")
    p.add_argument("--bf16", action="store_true",
                   help="compute in bfloat16 on the CPU too (float32 master weights; on a GPU always)")
    p.add_argument("--sides", default=",".join(SIDES),
                   help="comma-separated sides to run (ours and trl always run: the goal's ratio needs them)")
    p.add_argument("--quick", action="store_true", help="a tiny model and batch, one round (a smoke test)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "trainer_vs_trl.json"))
    p.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--frozen", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.side:
        return child(args)
    if args.quick:
        args.hidden, args.layers, args.intermediate, args.batch, args.group = 64, 2, 128, 8, 4
        args.micro_batch, args.prompt_len, args.resp_len, args.steps, args.rounds = 4, 8, 8, 1, 1
    trl_python = args.trl_python or sys.executable
    unknown = set(args.sides.split(",")) - set(SIDES)
    if unknown:
        p.error(f"--sides: unknown {sorted(unknown)} (choose from {', '.join(SIDES)})")
    sides = tuple(s for s in SIDES if s in {"ours", "trl", *args.sides.split(",")})
    report: dict = {"benchmark": "trainer_vs_trl", "quick": args.quick,
                    "machine": _report.machine(torch=torch.__version__, gpu=torch.cuda.get_device_name()
                                               if torch.cuda.is_available() else None),
                    "started": _report.started(),
                    "shape": {"batch": args.batch, "group": args.group, "micro_batch": args.micro_batch,
                              "prompt_len": args.prompt_len, "resp_len": args.resp_len, "steps": args.steps,
                              "rounds": args.rounds, "threads": args.threads,
                              "bf16": args.bf16 or torch.cuda.is_available()}}
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            model_dir = Path(args.model)
        else:
            from rft_runtime.model import make_tiny_model

            model_dir = make_tiny_model(Path(tmp) / "model", seed=0, hidden=args.hidden, layers=args.layers,
                                        heads=args.heads, kv_heads=args.kv_heads, intermediate=args.intermediate,
                                        max_position_embeddings=args.prompt_len + args.resp_len + 8)
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        report["model"] = {"dir": str(args.model or "random"), "hidden": cfg.hidden_size,
                           "layers": cfg.num_hidden_layers, "vocab": cfg.vocab_size}
        frozen = Path(tmp) / "frozen.json"
        frozen.write_text(json.dumps(make_frozen(model_dir, args.batch, args.group, args.prompt_len, args.resp_len, 7)))
        runs: dict[str, list[dict]] = {s: [] for s in sides}
        for r in range(args.rounds):
            for side in (sides if r % 2 == 0 else sides[::-1]):
                res = run_side(trl_python if side == "trl" else sys.executable, side, model_dir, frozen, args)
                runs[side].append(res)
                print(f"round {r} {side:>15}: step {statistics.median(res['step_s']):.4f} s, step-1 loss "
                      f"{res['step1']['loss']:.6g}, grad norm {res['step1']['grad_norm']:.6g}, first step "
                      f"{res['step1']['step_s']:.1f} s, "
                      f"peak {res['peak_memory_mb']} MB", flush=True)
    med = {s: statistics.median(t for r in rs for t in r["step_s"]) for s, rs in runs.items()}
    ours1, trl1 = runs["ours"][0]["step1"], runs["trl"][0]["step1"]
    report["runs"] = runs
    report["medians"] = {s: {"step_s": round(v, 5)} for s, v in med.items()}
    report["trl_version"] = runs["trl"][0].get("trl")
    report["ratios"] = {f"step_time_{s}_over_trl": round(med[s] / med["trl"], 3) for s in sides if s != "trl"}
    report["agreement"] = {"loss_rel_diff": rel(ours1["loss"], trl1["loss"]),
                           "grad_norm_rel_diff": rel(ours1["grad_norm"], trl1["grad_norm"]),
                           "ours_step1": ours1, "trl_step1": trl1}
    _report.write(args.out, report, {**report["ratios"], **report["agreement"]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
