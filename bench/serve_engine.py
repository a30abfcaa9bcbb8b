"""The builtin engine without HTTP against a bare Hugging Face generation loop, on the same model.

For each batch size B (1/8/32/128) and number of new tokens T (16/256): B sequences with distinct
16-token prompts sample T tokens each (temperature 1, ignore_eos, logprobs on), once through our
engine's iteration loop (:class:`rft_runtime.serve.batch.RunningBatch`: per-slot KV cache, one forward
per iteration, batched sampling) and once through a bare transformers loop (one prefill forward, then
one forward per token with a ``DynamicCache``, ``torch.multinomial`` sampling and ``log_softmax``
logprobs) -- interleaved A B A B over ``--repeats`` rounds, medians reported.

A third loop, `closed_loop`, drives the same engine as the server does, without HTTP: an
:class:`rft_runtime.serve.engine.Engine` (its worker thread, continuous admission) and B asyncio
clients, each sending requests one after another, of T/2, 3T/4, T, 5T/4 and 3T/2 new tokens in turn
(mean T), so that sequences finish and join at different iterations. It is measured in the steady
state: tokens the engine generated from its iteration T to its iteration 4T, over that time.

Per cell: generated tokens/s and the mean time of a decode iteration (all iterations after the first,
which also prefills; the closed loop: those of its window, its mean batch, and the share of its
iterations replayed from CUDA graphs, ``graph_share``: the others carried a prompt chunk). `ratios`:
`engine_vs_hf_b<B>_t<T>` (tokens/s, ours over the HF loop: higher is better),
`iteration_time_growth_16_to_256_b<B>` (ours: mean decode iteration time at 256 new tokens over that
at 16; lower is better, the goal is <= 1.2), with the HF loop's growth beside it and the least growth this
machine's memory allows, `iteration_time_growth_floor_16_to_256_b<B>` (below), and
`closed_loop_vs_lockstep_b<B>_t<T>` (tokens/s of the closed loop over the lockstep batch: what
continuous batching -- admission, staggered positions, retirement, the hand-over to the event loop --
costs or saves; 1.0 is free). Where the engine runs its native kernels (float32 on the CPU: varlen
decode attention and RMSNorm), the closed loop runs a second time with torch's (batched attention and
``rms_norm``; ``closed_loop_torch_kernels``; ratio `closed_loop_native_vs_torch_kernels_b<B>_t<T>`,
tokens/s). On a CUDA device, where decode iterations replay CUDA graphs (:mod:`rft_runtime.serve.graphs`),
the lockstep and closed loops also run with every iteration eager (``engine_eager``,
``closed_loop_eager``; ratios `cuda_graphs_vs_eager_b<B>_t<T>` and
`closed_loop_cuda_graphs_vs_eager_b<B>_t<T>`, tokens/s). With a float32 model the lockstep loop also runs
with a float16 KV cache (``engine_kv_float16``, the engine's ``kv_cache_dtype``: half the bytes decode
attention reads; ratios `kv_float16_vs_model_dtype_b<B>_t<T>`, tokens/s, and its own growth, late over
early and their floors, suffixed `_kv_float16`). ``--loops`` picks the loops to run.

Because a run of 16 tokens has only 15 decode iterations, which follow its prefill and the previous
cell's work, its mean moves from run to run; so the longest run's own iterations are compared too: the
median of its last 16 decode iterations over the median of its first 16
(`iteration_time_late_over_early_b<B>_t<T>`, per round, the median over rounds; the HF loop's beside it,
and its floor `iteration_time_late_over_early_floor_b<B>_t<T>` as below, with the bandwidth measured at
the size of a late iteration's reads): the same batch, the same warm state, 18-33 positions against
257-272 at T = 256.

Decode attention reads every cached key and value of every row, so a decode iteration at 256 new tokens
reads more than one at 16 however fast the kernel is. The floor is the time at 16 tokens plus the extra
bytes (rows x mean cached length x layers x 2 x KV heads x head dim x element size, the mean taken over
the lockstep run's decode iterations) read at the bandwidth measured in the same run (``memory``, per
cache type: ``sum`` over one buffer per layer's keys and per layer's values, as large together as an
iteration's reads at 256 tokens, summed in turn as the iterations read them, pass after pass, the median
pass; on the engine's device and threads), over the time at 16: the growth that reading those bytes alone
would cause, as it assumes the kernel reads at that bandwidth and that nothing else in the iteration grows
with length. Summing the buffers in turn, like the engine, keeps in the last-level cache only what an
iteration's reads leave there for the next: one buffer summed again and again (its best pass) measured the
cache's bandwidth, 75 GB/s on a 2-core VM where batch 128's 35 MB at 272 positions come from memory at
33-37 GB/s (a 32 MiB L3). And between two layers' reads the engine does the rest of its iteration, after
which less of what the reads left in the last-level cache is still there (on a shared VM, whose L3 other
tenants use, much less): the buffers are read with that time between two layers' (``gap_s_per_layer``: the
16-token iteration's time over the layers, spent busy, not timed). On the same VM that gap took batch 128's
reads at 256 tokens (19 MB in the mean) from 63-109 GB/s back to back to 25-40 GB/s, what the engine's
attention gets in place; the back-to-back figures are kept beside (``read_bytes_per_s_back_to_back``,
``read_bytes_per_s_late_back_to_back``).

The tiny test model has 256 positions; a copy with ``max_position_embeddings`` enough for the longest
request, 16 + 3T/2 tokens and a margin (same weights; the rotary embedding has no length-dependent
parameters), is made in a temporary directory.

    .venv/bin/python bench/serve_engine.py [--quick] [--device cpu|cuda] [--dtype float32|bfloat16] [--model DIR]
        [--loops engine,hf_loop,closed_loop,...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import _report  # noqa: E402
import torch  # noqa: E402

from rft_runtime.serve import graphs, native  # noqa: E402
from rft_runtime.serve.batch import RunningBatch, Sequence  # noqa: E402
from rft_runtime.serve.engine import Engine  # noqa: E402
from rft_runtime.serve.model import load_model  # noqa: E402
from rft_runtime.serve.protocol import SamplingParams  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / "tests" / "contracts" / "vllm" / "tiny-qwen2"
PROMPT_LEN = 16
EDGE = 16  # decode iterations at each end of a lockstep run: iteration time early and late in the same run


def long_context_copy(model_dir: Path, dst: Path, positions: int) -> Path:
    """A copy of ``model_dir`` whose config allows ``positions`` tokens."""
    shutil.copytree(model_dir, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["max_position_embeddings"] = max(int(cfg.get("max_position_embeddings", 0)), positions)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst


def prompts(batch: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(batch)
    return torch.randint(3, vocab, (batch, PROMPT_LEN), generator=g).tolist()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


_BATCHES: dict[tuple[int, int, str | None, str | None], RunningBatch] = {}


def running_batch(lm, batch: int, cuda_graphs: str | None = None, kv_cache_dtype: str | None = None) -> RunningBatch:
    """One :class:`RunningBatch` per model, batch size, graph setting and cache type, kept from run to run as
    a server keeps its engine's (its KV cache and its CUDA graphs, captured the first time each shape runs)."""
    key = (id(lm), batch, cuda_graphs, kv_cache_dtype)
    if key not in _BATCHES:
        _BATCHES[key] = RunningBatch(lm.model, pad_token_id=lm.pad_token_id, eos_token_ids=lm.eos_token_ids,
                                     device=lm.device, max_slots=batch, max_len=lm.max_model_len,
                                     cuda_graphs=cuda_graphs, kv_cache_dtype=kv_cache_dtype)
    return _BATCHES[key]


def run_engine(lm, batch: int, new_tokens: int, cuda_graphs: str | None = None,
               kv_cache_dtype: str | None = None) -> dict:
    """Our iteration loop (no HTTP, no event loop)."""
    rb = running_batch(lm, batch, cuda_graphs, kv_cache_dtype)
    params = SamplingParams(max_tokens=new_tokens, temperature=1.0, ignore_eos=True, logprobs=0)
    seqs = [Sequence(prompt=p, params=params, index=i) for i, p in enumerate(prompts(batch, lm.vocab_size))]
    times = []
    pending = seqs
    with torch.no_grad():
        while len(rb) or pending:
            t0 = time.perf_counter()
            rb.step(pending)
            sync(lm.device)
            times.append(time.perf_counter() - t0)
            pending = []
    assert all(len(s.output) == new_tokens for s in seqs)
    return _cell(times, batch * new_tokens)


class _Iterations:
    """The engine's metrics hooks, counting its iterations, the sequences they carried and the tokens they
    generated, and taking a snapshot of the counts (with the time) when the iteration count reaches one of
    :meth:`mark`'s numbers: in the engine thread, at the end of that iteration, so that nothing polls the
    counts from the event loop (a poller waking every half millisecond takes the GIL from the engine
    thread each time it releases it, in every native call: on 2 cores it cost the closed loop a quarter of
    its tokens/s at batch 1 and 32, 2.7k against 3.7k and 30k against 38k at 256 tokens)."""

    def __init__(self) -> None:
        self.iterations = 0
        self.sequences = 0
        self.tokens = 0
        self.graph_iterations = 0
        self._marks: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}

    def mark(self, n: int) -> asyncio.Future:
        """A future of the snapshot ``(time, iterations, tokens, sequences, graph iterations)`` taken when
        the engine finishes its ``n``-th iteration (set in this event loop)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._marks[n] = (loop, fut)
        return fut

    def observe_step(self, batch_size: int, new_tokens: int) -> None:
        self.sequences += batch_size
        self.tokens += new_tokens
        self.iterations += 1
        marked = self._marks.pop(self.iterations, None)
        if marked is not None:
            snapshot = (time.perf_counter(), self.iterations, self.tokens, self.sequences, self.graph_iterations)
            loop, fut = marked
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(snapshot))

    def set_queue(self, running: int, waiting: int) -> None:
        pass

    def observe_aborted(self, sequences: int) -> None:
        pass

    def observe_graphs(self, replays: int, captures: int) -> None:
        self.graph_iterations += replays

    def observe_pause(self, seconds: float) -> None:
        pass


LOOPS = ("engine", "hf_loop", "closed_loop", "closed_loop_torch_kernels", "engine_eager", "closed_loop_eager",
         "engine_kv_float16")
HALF_KV = "float16"  # engine_kv_float16's cache type
# the lockstep loops whose growth has a floor: loop, suffix of its ratios and memory entry, bytes per cached
# number (None: the model dtype's)
CACHE_TYPES = (("engine", "", None), ("engine_kv_float16", "_kv_float16", 2))
CLOSED_LOOP_SPREAD = (2, 3, 4, 5, 6)  # quarters of T: a request's new tokens, in turn


def run_closed_loop(lm, batch: int, new_tokens: int, kernels: str | None = None,
                    cuda_graphs: str | None = None) -> dict:
    """Our engine as the server drives it: ``batch`` clients, each sending requests one after another, measured
    in the steady state: from iteration T (the first requests have ramped up) over the next 3T iterations."""
    counted = _Iterations()
    engine = Engine(lm, max_batch_size=batch, metrics=counted, kernels=kernels, cuda_graphs=cuda_graphs)
    pool = prompts(max(batch, 16), lm.vocab_size)
    lengths = [max(1, new_tokens * q // 4) for q in CLOSED_LOOP_SPREAD]
    window = (new_tokens, 4 * new_tokens)  # iterations
    stop = False

    async def client(i: int) -> None:
        k = i
        while not stop:
            params = SamplingParams(max_tokens=lengths[k % len(lengths)], temperature=1.0, ignore_eos=True,
                                    logprobs=0)
            await engine.generate([pool[k % len(pool)]], [params])
            k += batch

    async def drive() -> dict:
        nonlocal stop
        start, end = counted.mark(window[0]), counted.mark(window[1])  # before the engine has work
        clients = [asyncio.ensure_future(client(i)) for i in range(batch)]
        t0, it0, tok0, seq0, g0 = await start
        t1, it1, tok1, seq1, g1 = await end
        stop = True
        await asyncio.gather(*clients)
        its = it1 - it0
        return {"tokens_per_s": round((tok1 - tok0) / (t1 - t0), 2), "wall_s": round(t1 - t0, 4),
                "iteration_s_mean": round((t1 - t0) / its, 6), "iterations": its,
                "mean_batch": round((seq1 - seq0) / its, 2),
                "graph_share": round((g1 - g0) / its, 3)}  # iterations replayed from CUDA graphs

    engine.start()
    try:
        return asyncio.run(drive())
    finally:
        engine.stop()


def run_hf(lm, batch: int, new_tokens: int) -> dict:
    """A bare transformers loop: prefill, then one forward per token with a DynamicCache."""
    from transformers import DynamicCache

    model = lm.model
    ids = torch.tensor(prompts(batch, lm.vocab_size), device=lm.device)
    times = []
    out, lps = [], []
    with torch.no_grad():
        cache = DynamicCache()
        feed = ids
        for _ in range(new_tokens):
            t0 = time.perf_counter()
            logits = model(input_ids=feed, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
            lp = torch.log_softmax(logits.float(), dim=-1)
            tok = torch.multinomial(lp.exp(), 1)
            lps.append(lp.gather(1, tok))
            out.append(tok)
            feed = tok
            sync(lm.device)
            times.append(time.perf_counter() - t0)
    torch.cat(out, 1).tolist()
    torch.cat(lps, 1).tolist()
    return _cell(times, batch * new_tokens)


def kv_bytes(lm, batch: int, positions: float, element: int | None = None) -> float:
    """The cached keys and values a decode iteration of ``batch`` rows of ``positions`` each reads
    (``element``: bytes per cached number; the model dtype's by default)."""
    cfg = lm.model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    return batch * positions * cfg.num_hidden_layers * 2 * kv_heads * head_dim * (element or lm.dtype.itemsize)


def mean_positions(first: int, last: int) -> float:
    """The mean length a lockstep run's decode iterations ``first`` to ``last`` attend over (after the
    prefill, iteration i attends over PROMPT_LEN + i + 1 positions)."""
    return PROMPT_LEN + 1 + (first + last) / 2


def kv_bytes_per_iteration(lm, batch: int, new_tokens: int, element: int | None = None) -> float:
    """The cached keys and values a lockstep decode iteration reads, in the mean over the run's decode
    iterations (1 to T - 1)."""
    return kv_bytes(lm, batch, mean_positions(1, new_tokens - 1), element)


def read_bandwidth(device: torch.device, nbytes: float, parts: int = 1, passes: int = 20,
                   gap_s: float = 0.0) -> float:
    """Bytes per second of ``sum`` over ``parts`` float32 buffers of ``nbytes`` in all, summed one after
    another as decode attention reads an iteration's caches (each layer's keys, then its values), pass after
    pass: the median pass. Reads that fit in the last-level cache stay there from pass to pass only as far as
    they would from iteration to iteration (one buffer summed again and again, its best pass, would measure
    the cache's bandwidth where an iteration's reads overflow it). ``gap_s``: after each pair of buffers (a
    layer's keys and values) the thread stays busy that long without reading memory, as the engine's other
    work does between two layers' attention, and the gaps are not timed (what a layer's reads find in the
    cache after them is what the engine's find). At least 1 MiB in all, so that a tiny buffer does not
    measure only the call."""
    size = max(int(nbytes), 1 << 20) // 4 // parts
    xs = [torch.ones(size, device=device) for _ in range(parts)]
    times = []
    for _ in range(passes + 1):  # the first pass warms up
        sync(device)
        t0, busy = time.perf_counter(), 0.0
        for i, x in enumerate(xs):
            x.sum()
            if gap_s and i % 2 == 1:
                sync(device)
                g0 = time.perf_counter()
                while time.perf_counter() - g0 < gap_s:
                    pass
                busy += time.perf_counter() - g0
        sync(device)
        times.append(time.perf_counter() - t0 - busy)
    return parts * size * 4 / statistics.median(times[1:])


def _cell(times: list[float], tokens: int) -> dict:
    total = sum(times)
    decode = times[1:] or times
    cell = {"tokens_per_s": round(tokens / total, 2), "wall_s": round(total, 4),
            "iteration_s_mean": round(statistics.fmean(decode), 6), "first_iteration_s": round(times[0], 6),
            "iterations": len(times)}
    if len(decode) >= 2 * EDGE:  # the median decode iteration of the run's first and last EDGE
        cell["iteration_s_early"] = round(statistics.median(decode[:EDGE]), 6)
        cell["iteration_s_late"] = round(statistics.median(decode[-EDGE:]), 6)
    return cell


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--batches", default="1,8,32,128")
    p.add_argument("--new-tokens", default="16,256")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (medians over them)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", help="the model's compute dtype (bfloat16 on a GPU)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    p.add_argument("--loops", default=",".join(LOOPS),
                   help=f"which loops to run, of {', '.join(LOOPS)} (engine always; the eager and graph-less "
                        "loops only where they differ from it)")
    p.add_argument("--quick", action="store_true", help="batch 1 and 8, 16 and 64 tokens, one round")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve_engine.json"))
    args = p.parse_args(argv)
    started, machine = _report.started(), _report.machine(torch=torch.__version__)
    if args.quick:
        args.batches, args.new_tokens, args.repeats = "1,8", "16,64", 1
    batches = [int(x) for x in args.batches.split(",")]
    lengths = [int(x) for x in args.new_tokens.split(",")]
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        # the closed loop asks for up to 3T/2 new tokens (CLOSED_LOOP_SPREAD)
        longest = max(lengths) * max(CLOSED_LOOP_SPREAD) // 4
        model_dir = long_context_copy(Path(args.model), Path(tmp) / "model", PROMPT_LEN + longest + 8)
        lm = load_model(model_dir, device=args.device, dtype=args.dtype)
        kernel = native.kernels()
        native_kernels = kernel is not None and kernel.usable(lm.device, lm.dtype)
        graphs_on = lm.device.type == "cuda" and graphs.setting() == "auto"
        loops = {"engine": run_engine, "hf_loop": run_hf, "closed_loop": run_closed_loop}
        if native_kernels:
            loops["closed_loop_torch_kernels"] = lambda lm, b, t: run_closed_loop(lm, b, t, kernels="torch")
        if lm.dtype == torch.float32:  # the lockstep loop with a half-precision KV cache
            loops["engine_kv_float16"] = lambda lm, b, t: run_engine(lm, b, t, kv_cache_dtype=HALF_KV)
        if graphs_on:  # the same loops with every iteration run eagerly
            loops["engine_eager"] = lambda lm, b, t: run_engine(lm, b, t, cuda_graphs="never")
            loops["closed_loop_eager"] = lambda lm, b, t: run_closed_loop(lm, b, t, cuda_graphs="never")
        wanted = set(args.loops.split(",")) | {"engine"}
        if wanted - set(LOOPS):
            raise SystemExit(f"--loops: unknown {sorted(wanted - set(LOOPS))}; choose from {', '.join(LOOPS)}")
        loops = {name: fn for name, fn in loops.items() if name in wanted}
        for fn in loops.values():  # warm-up
            fn(lm, 2, 4)
        if graphs_on:  # each batch's graphs captured before anything is timed, as in a server that has run
            for b in batches:
                run_engine(lm, b, max(lengths))
        runs: dict[str, dict[str, list[dict]]] = {name: {} for name in loops}
        for r in range(args.repeats):
            for b in batches:
                for t in lengths:
                    cell = f"b{b}_t{t}"
                    order = list(loops.items())
                    for name, fn in (order if r % 2 == 0 else order[::-1]):
                        res = fn(lm, b, t)
                        runs[name].setdefault(cell, []).append(res)
                        print(f"round {r} {name:>27} {cell:>10}: {res['tokens_per_s']:>9.1f} tokens/s, "
                              f"iteration {1000 * res['iteration_s_mean']:.3f} ms", flush=True)
        medians = {name: {cell: {k: round(statistics.median(x[k] for x in rs), 6) for k in rs[0]}
                          for cell, rs in cells.items()} for name, cells in runs.items()}
        # the read bandwidth at each batch's working set at the longest length (the floor of its growth)
        # and at the longest run's last EDGE iterations (the floor of its late over early), per cache type,
        # reading each layer's keys and values with the rest of an iteration's time between two layers' reads
        # (back to back too, for comparison: what the last-level cache keeps when nothing else runs)
        memory = {}
        lo, hi = min(lengths), max(lengths)
        layers = lm.model.config.num_hidden_layers
        parts = 2 * layers  # each layer's keys and values
        for b in batches:
            for name, suffix, element in CACHE_TYPES:
                if name not in loops:
                    continue
                gap = medians[name][f"b{b}_t{lo}"]["iteration_s_mean"] / layers
                late = kv_bytes(lm, b, mean_positions(hi - EDGE, hi - 1), element)
                mean = kv_bytes_per_iteration(lm, b, hi, element)
                memory[f"b{b}{suffix}"] = {
                    "kv_bytes_per_iteration": {f"t{t}": round(kv_bytes_per_iteration(lm, b, t, element))
                                               for t in lengths},
                    "gap_s_per_layer": round(gap, 6),
                    "read_bytes_per_s": round(read_bandwidth(lm.device, mean, parts, gap_s=gap)),
                    "read_bytes_per_s_back_to_back": round(read_bandwidth(lm.device, mean, parts)),
                    f"kv_bytes_per_iteration_late_t{hi}": round(late),
                    "read_bytes_per_s_late": round(read_bandwidth(lm.device, late, parts, gap_s=gap)),
                    "read_bytes_per_s_late_back_to_back": round(read_bandwidth(lm.device, late, parts))}
    ratios: dict[str, float] = {}
    for b in batches:
        for t in lengths:
            cell = f"b{b}_t{t}"
            for key, ours, base in (("engine_vs_hf", "engine", "hf_loop"),
                                    ("closed_loop_vs_lockstep", "closed_loop", "engine"),
                                    ("closed_loop_native_vs_torch_kernels", "closed_loop", "closed_loop_torch_kernels"),
                                    ("cuda_graphs_vs_eager", "engine", "engine_eager"),
                                    ("closed_loop_cuda_graphs_vs_eager", "closed_loop", "closed_loop_eager"),
                                    ("kv_float16_vs_model_dtype", "engine_kv_float16", "engine")):
                if ours in runs and base in runs:
                    ratios[f"{key}_{cell}"] = round(statistics.median(
                        a["tokens_per_s"] / z["tokens_per_s"] for a, z in zip(runs[ours][cell], runs[base][cell])), 3)
        lo, hi = min(lengths), max(lengths)
        for name, key in (("engine", f"iteration_time_growth_{lo}_to_{hi}_b{b}"),
                          ("hf_loop", f"hf_iteration_time_growth_{lo}_to_{hi}_b{b}"),
                          ("engine_kv_float16", f"iteration_time_growth_{lo}_to_{hi}_b{b}_kv_float16")):
            if name in medians and lo != hi:
                ratios[key] = round(medians[name][f"b{b}_t{hi}"]["iteration_s_mean"]
                                    / medians[name][f"b{b}_t{lo}"]["iteration_s_mean"], 3)
        for name, suffix, element in CACHE_TYPES:
            if lo != hi and name in medians:
                bandwidth = memory[f"b{b}{suffix}"]["read_bytes_per_s"]
                at_lo = medians[name][f"b{b}_t{lo}"]["iteration_s_mean"]
                extra = kv_bytes_per_iteration(lm, b, hi, element) - kv_bytes_per_iteration(lm, b, lo, element)
                ratios[f"iteration_time_growth_floor_{lo}_to_{hi}_b{b}{suffix}"] = round(
                    (at_lo + extra / bandwidth) / at_lo, 3)
        # within the longest run: its last EDGE decode iterations over its first EDGE, per round
        cell = f"b{b}_t{hi}"
        for name, key in (("engine", f"iteration_time_late_over_early_b{b}_t{hi}"),
                          ("hf_loop", f"hf_iteration_time_late_over_early_b{b}_t{hi}"),
                          ("engine_kv_float16", f"iteration_time_late_over_early_b{b}_t{hi}_kv_float16")):
            if name in runs and "iteration_s_early" in runs[name][cell][0]:
                ratios[key] = round(statistics.median(x["iteration_s_late"] / x["iteration_s_early"]
                                                      for x in runs[name][cell]), 3)
        for name, suffix, element in CACHE_TYPES:
            if name in medians and "iteration_s_early" in medians[name][cell]:
                early = medians[name][cell]["iteration_s_early"]
                extra = (kv_bytes(lm, b, mean_positions(hi - EDGE, hi - 1), element)
                         - kv_bytes(lm, b, mean_positions(1, EDGE), element))
                ratios[f"iteration_time_late_over_early_floor_b{b}_t{hi}{suffix}"] = round(
                    (early + extra / memory[f"b{b}{suffix}"]["read_bytes_per_s_late"]) / early, 3)
    report = {"benchmark": "serve_engine", "model": args.model, "device": str(lm.device), "dtype": args.dtype,
              "threads": args.threads, "kernels": "native" if native_kernels else "torch",
              "cuda_graphs": graphs_on,
              "prompt_len": PROMPT_LEN, "batches": batches, "new_tokens": lengths, "repeats": args.repeats,
              "quick": args.quick,
              "machine": {**machine, "gpu": torch.cuda.get_device_name() if lm.device.type == "cuda" else None},
              "started": started, "memory": memory, "runs": runs, "medians": medians, "ratios": ratios}
    _report.write(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
