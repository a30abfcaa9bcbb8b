"""The builtin server with its engine in a child process (the default) against `--no-engine-process`
(the engine a thread of the HTTP server's process), interleaved.

Both variants run at once; rounds alternate their order (see `bench/inference.py`, whose cells and
request shapes this reuses). `ratios.process_vs_thread_<shape>_c<C>`: tokens/s of the engine process
over the in-process engine (higher is better); `cpu_per_1k_tokens_process_over_thread_<shape>_c<C>`.

    .venv/bin/python bench/engine_process.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

import _report

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inference import DEFAULT_MODEL, _stop, free_port, measure, start_builtin, summarise, use_model, wait_healthy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--levels", default="1,8,32")
    p.add_argument("--shapes", default="rollout")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--min-seconds", type=float, default=4.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "engine_process.json"))
    args = p.parse_args(argv)
    use_model(args.model)
    if args.quick:
        args.levels, args.rounds, args.max_tokens, args.min_seconds = "1,8", 1, 8, 0.0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    started, machine = _report.started(), _report.machine()
    procs, servers = [], {}
    try:
        for name, extra in (("thread", ["--no-engine-process"]), ("process", [])):
            port = free_port()
            proc = start_builtin(args.model, port, args.threads, 32, out.parent / f"engine_process_{name}.log", extra)
            procs.append(proc)
            wait_healthy(f"http://127.0.0.1:{port}", proc, 180)
            servers[name] = (f"http://127.0.0.1:{port}", proc.pid)
        runs = asyncio.run(measure(servers, args.shapes.split(","), [int(x) for x in args.levels.split(",")],
                                   args.rounds, args.max_tokens, args.min_seconds, 2 if not args.quick else 1))
    finally:
        for proc in procs:
            _stop(proc)
    ratios = {}
    for cell in runs["thread"]:
        pairs = list(zip(runs["process"][cell], runs["thread"][cell]))
        ratios[f"process_vs_thread_{cell}"] = round(statistics.median(a["tokens_per_s"] / b["tokens_per_s"]
                                                                      for a, b in pairs), 4)
        cpu = [a["server_cpu_s_per_1k_tokens"] / b["server_cpu_s_per_1k_tokens"] for a, b in pairs
               if a["server_cpu_s_per_1k_tokens"] and b["server_cpu_s_per_1k_tokens"]]
        ratios[f"cpu_per_1k_tokens_process_over_thread_{cell}"] = round(statistics.median(cpu), 4) if cpu else None
    report = {"benchmark": "engine_process", "quick": args.quick, "rounds": args.rounds, "max_tokens": args.max_tokens,
              "machine": machine, "started": started, "runs": runs, "medians": summarise(runs),
              "ratios": ratios}
    _report.write(out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
