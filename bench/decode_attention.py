"""Decode attention alone, at long rows: the native kernel against torch's batched attention and a plain read.

For each cell (R rows x P positions) the benchmark makes ``--layers`` layers' slot caches (keys and values
``[R + 1, 1 KV head, capacity, 64]`` float32, transparent huge pages, random) and attends them in turn, as an
iteration's layers would, every row decoding at position P - 1 with 2 query heads on its KV head (the test
model's grouping): one call per layer, ``--passes`` passes over the layers after a warm-up pass, the median
call. Measured in the same run, rounds alternating the order A B C / C B A:

* ``native`` -- :mod:`rft_runtime.serve.native`'s varlen decode attention, what the engine runs on the CPU
  in float32 (it writes each row's new key and value and reads its own columns);
* ``torch`` -- the engine's other path (``RFT_ENGINE_KERNELS=torch``): the new keys and values copied into
  their column, then two batched matrix multiplications and a softmax over the same slots up to the longest
  row (every row has the same length here, so no mask);
* ``read`` -- ``sum`` over the same keys and values in the same order: what the memory gives for those bytes.

Ratios per cell: `native_vs_torch_r<R>_p<P>` (calls per second, higher is better) and
`native_over_read_r<R>_p<P>` (the kernel's bytes per second over the read's: how close it comes to the
memory). The cells are where a row's keys no longer fit a core's L2 four times (beyond 1024 positions of 64
floats on a 1 MiB L2), where the kernel prefetches within each row (kernels.c, ``PREFETCH_AHEAD``), and
batch 128 at 272 positions, where it prefetches the next row (``bench/serve_engine.py``'s longest cell). The
layers' caches together exceed the last-level cache, as a long-context batch's do.

    .venv/bin/python bench/decode_attention.py [--quick] [--threads N] [--cells 32x1100,128x272] [--layers 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import _report
import torch

from rft_runtime.serve import native
from rft_runtime.serve.kv_cache import advise_huge_pages

ROOT = Path(__file__).resolve().parents[1]
HEAD_DIM, GROUP = 64, 2
CELLS = "32x1100,128x1100,64x2048,16x4000,128x272"
QUICK_CELLS = "4x1100,8x300"
LOOPS = ("native", "torch", "read")


def cache(rows: int, capacity: int) -> torch.Tensor:
    t = torch.empty((rows + 1, 1, capacity, HEAD_DIM))
    advise_huge_pages(t)
    return t.normal_()


def time_calls(layers: list[tuple[torch.Tensor, torch.Tensor]], passes: int, call) -> float:
    """The median time of ``call(keys, values)`` over ``passes`` passes over ``layers`` (after one more)."""
    times = []
    for p in range(passes + 1):
        for keys, values in layers:
            t0 = time.perf_counter()
            call(keys, values)
            if p:
                times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_cell(kernel, rows: int, positions: int, n_layers: int, passes: int, repeats: int) -> dict:
    capacity = positions
    layers = [(cache(rows, capacity), cache(rows, capacity)) for _ in range(n_layers)]
    slots = torch.arange(rows, dtype=torch.int64)
    lengths = torch.full((rows,), positions, dtype=torch.int64)
    q = torch.randn(rows, 1, GROUP, HEAD_DIM)
    k_new, v_new = torch.randn(rows, 1, HEAD_DIM), torch.randn(rows, 1, HEAD_DIM)
    out = torch.empty(rows, 1, GROUP, HEAD_DIM)
    scale = HEAD_DIM ** -0.5

    def native_call(keys, values):
        kernel.decode_attention(q, k_new, v_new, keys, values, slots, lengths, scale, out=out)

    def torch_call(keys, values):
        keys[:rows, :, positions - 1].copy_(k_new)
        values[:rows, :, positions - 1].copy_(v_new)
        scores = torch.matmul(q, keys[:rows, :, :positions].transpose(-1, -2)).mul_(scale)
        torch.matmul(scores.softmax(dim=-1), values[:rows, :, :positions])

    def read_call(keys, values):
        keys[:rows, :, :positions].sum()
        values[:rows, :, :positions].sum()

    calls = {"native": native_call, "torch": torch_call, "read": read_call}
    times: dict[str, list[float]] = {name: [] for name in LOOPS}
    for r in range(repeats):
        for name in (LOOPS if r % 2 == 0 else LOOPS[::-1]):
            times[name].append(time_calls(layers, passes, calls[name]))
    nbytes = rows * positions * HEAD_DIM * 4 * 2  # a layer's keys and values the call reads
    cell = {"bytes_per_call": nbytes}
    for name, ts in times.items():
        s = statistics.median(ts)
        cell[name] = {"call_s": round(s, 7), "bytes_per_s": round(nbytes / s), "rounds_s": [round(x, 7) for x in ts]}
    return cell


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cells", default=CELLS, help="rows x positions, comma-separated")
    p.add_argument("--layers", type=int, default=2, help="layers' caches attended in turn")
    p.add_argument("--passes", type=int, default=10, help="passes over the layers a round (after a warm-up)")
    p.add_argument("--repeats", type=int, default=3, help="rounds, alternating the loops' order")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (the kernel uses as many)")
    p.add_argument("--quick", action="store_true", help=f"cells {QUICK_CELLS}, 2 layers, 3 passes, one round")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "decode_attention.json"))
    args = p.parse_args(argv)
    started, machine = _report.started(), _report.machine(torch=torch.__version__)
    if args.quick:
        args.cells, args.layers, args.passes, args.repeats = QUICK_CELLS, 2, 3, 1
    torch.set_num_threads(args.threads)
    kernel = native.kernels()
    if kernel is None:
        raise SystemExit("decode_attention: the native kernels are not available here (see the log)")
    cells = [tuple(int(x) for x in c.split("x")) for c in args.cells.split(",")]
    results, ratios = {}, {}
    with torch.inference_mode():
        for rows, positions in cells:
            name = f"r{rows}_p{positions}"
            res = results[name] = run_cell(kernel, rows, positions, args.layers, args.passes, args.repeats)
            ratios[f"native_vs_torch_{name}"] = round(res["torch"]["call_s"] / res["native"]["call_s"], 3)
            ratios[f"native_over_read_{name}"] = round(res["read"]["call_s"] / res["native"]["call_s"], 3)
            print(f"{name:>12}: native {1e6 * res['native']['call_s']:8.0f} us "
                  f"({res['native']['bytes_per_s'] / 1e9:5.1f} GB/s), torch {1e6 * res['torch']['call_s']:8.0f} us, "
                  f"read {1e6 * res['read']['call_s']:8.0f} us ({res['read']['bytes_per_s'] / 1e9:5.1f} GB/s)",
                  flush=True)
    report = {"benchmark": "decode_attention", "threads": args.threads, "layers": args.layers,
              "passes": args.passes, "repeats": args.repeats, "head_dim": HEAD_DIM, "group": GROUP,
              "kv_dtype": "float32", "parallel": kernel.parallel, "quick": args.quick,
              "machine": machine, "started": started, "cells": results, "ratios": ratios}
    _report.write(args.out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
