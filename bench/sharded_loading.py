"""Peak resident memory per trainer rank, loading the whole model on every rank against meta-device init and sharded loading.

A randomly initialised Llama-shaped model (``--size 1b``: hidden 2048, 16 layers, MLP 8192, 32 heads, 8 KV heads,
vocabulary 32000, tied embeddings: 1.04 B parameters; ``--size 0.5b``: hidden 1536, 12 layers, MLP 6144, 16 heads,
4 KV heads: 0.46 B) is built from its config in a child process and saved once as bfloat16 safetensors (as
published checkpoints are) in a temporary directory; no download. At each world size of ``--worlds`` (gloo on
this CPU, one rank after another world size, never two runs at once) each rank

- **plain** (the trainer's load before sharded loading): ``from_pretrained`` in float32 on every rank, then
  FSDP2 (:func:`rft_runtime.trainer.distributed.shard`);
- **sharded**: :func:`rft_runtime.trainer.sharded_load.load_sharded`: built on the meta device, sharded, each
  rank reading only its rows of each tensor;

then makes one small training step (``--tokens`` tokens a rank: forward, backward, AdamW, so gradients and
AdamW's two moments exist). Each rank reports its peak resident set (``ru_maxrss``) after loading and after
the step, and its resident set before loading (the Python runtime, torch and transformers imported, the
process group joined). At world size 1 both sides are the same code (one rank keeps a plain module,
``from_pretrained``), run once.

The bound per rank: (parameters + gradients + AdamW's two moments, float32) ÷ N, plus the activations of the
step (the bytes of the tensors autograd saves for the backward on that rank, measured), plus the runtime
measured before loading. ``ratios``: ``peak_over_bound_<side>_ws<N>`` (goal at world size 4, sharded: ≤ 1.3);
``peak_less_runtime_over_bound_<side>_ws<N>``: the peak less the runtime over the bound without it (training
state ÷ N plus activations), the stricter reading; ``load_peak_sharded_over_plain_ws<N>``: the peaks after
loading, before the step.

Memory: every rank of a world size runs at once, so a run needs about the whole training state (16 bytes a
parameter) plus the runtime per rank; before each world size the script reads ``MemAvailable`` and refuses to
start one that does not fit (``--size 0.5b`` halves it).

    .venv/bin/python bench/sharded_loading.py [--size 1b|0.5b] [--worlds 1,2,4] [--quick]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import _report

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(ROOT / "api"))

SIZES: dict[str, dict[str, int]] = {
    "1b": {"hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 8192, "num_attention_heads": 32,
           "num_key_value_heads": 8},
    "0.5b": {"hidden_size": 1536, "num_hidden_layers": 12, "intermediate_size": 6144, "num_attention_heads": 16,
             "num_key_value_heads": 4},
    "quick": {"hidden_size": 128, "num_hidden_layers": 4, "intermediate_size": 512, "num_attention_heads": 4,
              "num_key_value_heads": 2},
}
VOCAB = 32000
NOTES = {"0.5b": "0.46 B parameters, not 1 B: every rank of a world size runs at once, and the 1 B model's training "
                 "state alone (16.6 GB) does not fit beside the other work of a shared 24 GiB machine",
         "1b": "1.04 B parameters"}
GIB = 2**30


def make_model(out: Path, size: str) -> int:
    """Build the model of ``size`` from its config and save it as bfloat16 safetensors in ``out``; its parameters."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, max_position_embeddings=2048, tie_word_embeddings=True, **SIZES[size])
    torch.manual_seed(0)
    with torch.device("meta"):
        n = sum(p.numel() for p in LlamaForCausalLM(cfg).parameters())
    torch.set_default_dtype(torch.bfloat16)  # built in bfloat16: half the memory of building it in float32
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(out)
    return n


def rss_mb() -> float:
    """This process's peak resident set so far, MB (``ru_maxrss`` is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def step(model: Any, tokens: int) -> int:
    """One training step on ``tokens`` random tokens; the bytes autograd saved for the backward (activations:
    tensors that are not parameters)."""
    import torch

    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if not (base.is_leaf and base.requires_grad):
            s = t.untyped_storage()
            saved[s.data_ptr()] = s.nbytes()
        return t

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    ids = torch.randint(0, VOCAB, (1, tokens), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    return sum(saved.values())


def rank_main(rank: int, world: int, side: str, model_dir: str, port: int, tokens: int, out: str) -> None:
    import torch

    from rft_runtime.trainer.distributed import DistContext, ensure_group, leave_group, shard

    torch.set_num_threads(1)
    ctx = DistContext(rank=rank, world_size=world, port=port)
    ensure_group(ctx)
    from transformers import AutoModelForCausalLM  # noqa: F401  (imported before the runtime is measured)

    from rft_runtime.trainer import sharded_load

    runtime = current_rss_mb()
    model = sharded_load.load_sharded(Path(model_dir), torch.float32, None, ctx) if side == "sharded" else None
    if model is None:
        model = shard(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), ctx)
    model.config.use_cache = False
    load_peak = rss_mb()
    activations = step(model, tokens)
    res = {"rank": rank, "runtime_mb": round(runtime, 1), "load_peak_mb": round(load_peak, 1),
           "peak_mb": round(rss_mb(), 1), "activations_mb": round(activations / 2**20, 1)}
    Path(out, f"{side}-ws{world}-rank{rank}.json").write_text(json.dumps(res))
    leave_group()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def run_world(side: str, world: int, model_dir: Path, tokens: int, out: Path, params: int) -> list[dict]:
    """Every rank of one world size at once (fresh processes); their reports."""
    import torch.multiprocessing as mp

    need = params * 16 / GIB * 1.15 + world * 0.7
    free = available_gib()
    if free < need + 1:
        raise SystemExit(f"{side} at world size {world} needs about {need:.1f} GiB and {free:.1f} GiB is available: "
                         "use --size 0.5b, or wait")
    print(f"{side} ws{world}: {free:.1f} GiB available, about {need:.1f} GiB needed", flush=True)
    mp.spawn(rank_main, nprocs=world, join=True, args=(world, side, str(model_dir), free_port(), tokens, str(out)))
    return [json.loads((out / f"{side}-ws{world}-rank{r}.json").read_text()) for r in range(world)]


def summarise(ranks: list[dict], params: int, world: int) -> dict:
    """The largest rank's numbers, and the bound."""
    state = params * 16 / world / 2**20
    act = max(r["activations_mb"] for r in ranks)
    runtime = max(r["runtime_mb"] for r in ranks)
    peak = max(r["peak_mb"] for r in ranks)
    bound = state + act + runtime
    return {"peak_mb": peak, "load_peak_mb": max(r["load_peak_mb"] for r in ranks), "runtime_mb": runtime,
            "state_over_n_mb": round(state, 1), "activations_mb": act, "bound_mb": round(bound, 1),
            "peak_over_bound": round(peak / bound, 3),
            "peak_less_runtime_over_state_and_activations": round((peak - runtime) / (state + act), 3),
            "ranks": ranks}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=[s for s in SIZES if s != "quick"], default="1b")
    p.add_argument("--worlds", default="1,2,4")
    p.add_argument("--tokens", type=int, default=64, help="tokens a rank trains on in its step")
    p.add_argument("--quick", action="store_true", help="a 4-layer model of hidden 128 at world sizes 1 and 2")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "sharded_loading.json"))
    args = p.parse_args(argv)
    size = "quick" if args.quick else args.size
    worlds = [1, 2] if args.quick else [int(w) for w in args.worlds.split(",")]
    report: dict = {"benchmark": "sharded_loading", "quick": args.quick, "started": _report.started(),
                    "machine": _report.machine(mem_available_gib_at_start=round(available_gib(), 1)),
                    "model": {"size": size, **SIZES[size], "vocab": VOCAB, "tied_embeddings": True,
                              "checkpoint_dtype": "bfloat16", "train_dtype": "float32"},
                    "tokens_per_rank": args.tokens, "worlds": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        code = (f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import sharded_loading as s; "
                f"from pathlib import Path; print(s.make_model(Path({str(model_dir)!r}), {size!r}))")
        params = int(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                    text=True).stdout.split()[-1])
        report["model"]["parameters"] = params
        print(f"model: {params / 1e9:.3f} B parameters, saved as bfloat16 safetensors", flush=True)
        out = Path(tmp) / "ranks"
        out.mkdir()
        for world in worlds:
            sides = ("plain",) if world == 1 else ("plain", "sharded")
            for side in sides:
                s = summarise(run_world(side, world, model_dir, args.tokens, out, params), params, world)
                report["worlds"].setdefault(f"ws{world}", {})[side] = s
                print(f"ws{world} {side:>7}: peak {s['peak_mb']:.0f} MB, after loading {s['load_peak_mb']:.0f} MB, "
                      f"bound {s['bound_mb']:.0f} MB (peak/bound {s['peak_over_bound']})", flush=True)
    ratios: dict[str, float] = {}
    for w, sides in report["worlds"].items():
        for side, s in sides.items():
            ratios[f"peak_over_bound_{side}_{w}"] = s["peak_over_bound"]
            ratios[f"peak_less_runtime_over_bound_{side}_{w}"] = s["peak_less_runtime_over_state_and_activations"]
        if "sharded" in sides:
            ratios[f"load_peak_sharded_over_plain_{w}"] = round(sides["sharded"]["load_peak_mb"]
                                                                / sides["plain"]["load_peak_mb"], 3)
    report["ratios"] = ratios
    report["notes"] = NOTES.get(size, "")
    _report.write(args.out, report, ratios)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
