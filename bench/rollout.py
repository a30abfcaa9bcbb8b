"""The rollout client (`rft_runtime.rollout.client.InferenceClient`, on aiohttp) against raw httpx requests.

Both sides send identical request bodies -- the client's own as the rollout role uses it
(`n_per_request`: one request per prompt, a token-id prompt, `n` and the base of its consecutive
seeds, logprobs, return_token_ids, return_tokens_as_token_ids) -- to one builtin server started
here, with the same concurrency limit in samples: P prompts x n samples per batch.
The client also checks the token contract, retries and builds `Sample`s; raw httpx only decodes
the JSON. Batches alternate (client, raw, raw, client, ...) over `--repeats` rounds; medians reported.

`ratios.client_vs_raw`: samples/s through the client over samples/s through raw httpx (higher is
better, goal >= 0.97). Also the client process's CPU seconds per 1k samples on each side.

    .venv/bin/python bench/rollout.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import _report
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inference import DEFAULT_MODEL, PROMPT, against_builtin, medians, use_model  # noqa: E402

from rft_runtime.rollout.client import InferenceClient  # noqa: E402
from rft_runtime.rollout.sampling import SamplingParams  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def workload(prompts: int, n: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, seeds of its n samples) per prompt."""
    return [(PROMPT[: 10 + (i % 16)], [1000 * i + j for j in range(n)]) for i in range(prompts)]


async def run_client(url: str, work, sampling: SamplingParams, concurrency: int) -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    async with InferenceClient(url, "tiny", max_concurrency=concurrency, n_per_request=True) as client:
        outs = await asyncio.gather(*(client.complete(p, len(seeds), sampling, seeds=seeds) for p, seeds in work))
    samples = sum(len(o) for o in outs)
    tokens = sum(len(s.completion_ids) for o in outs for s in o)
    return _result(samples, tokens, time.perf_counter() - t0, time.process_time() - c0)


async def run_raw(url: str, work, sampling: SamplingParams, concurrency: int) -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    requests = max(1, concurrency // max(len(seeds) for _, seeds in work))  # the same samples in flight
    sem = asyncio.Semaphore(requests)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=None) as http:
        async def one(prompt: list[int], seeds: list[int]) -> dict:
            body = {"model": "tiny", "prompt": prompt, "n": len(seeds), **sampling.request_fields(seeds[0])}
            async with sem:
                r = await http.post(url + "/v1/completions", json=body)
            r.raise_for_status()
            return r.json()

        outs = await asyncio.gather(*(one(p, seeds) for p, seeds in work))
    choices = [c for o in outs for c in o["choices"]]
    tokens = sum(len(c["token_ids"]) for c in choices)
    return _result(len(choices), tokens, time.perf_counter() - t0, time.process_time() - c0)


def _result(samples: int, tokens: int, wall: float, cpu: float) -> dict:
    return {"samples": samples, "tokens": tokens, "wall_s": round(wall, 4), "samples_per_s": round(samples / wall, 2),
            "client_cpu_s_per_1k_samples": round(1000 * cpu / samples, 4)}


async def measure(url: str, args) -> dict:
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, ignore_eos=True)
    work = workload(args.prompts, args.n)
    await run_raw(url, workload(2, 2), sampling, 4)  # warm-up
    await run_client(url, workload(2, 2), sampling, 4)
    runs: dict[str, list[dict]] = {"client": [], "raw": []}
    for r in range(args.repeats):
        order = [("client", run_client), ("raw", run_raw)]
        for name, fn in (order if r % 2 == 0 else order[::-1]):
            res = await fn(url, work, sampling, args.concurrency)
            runs[name].append(res)
            print(f"round {r} {name:>6}: {res['samples_per_s']:>8.1f} samples/s, client CPU "
                  f"{res['client_cpu_s_per_1k_samples']:.3f} s/1k samples", flush=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    p.add_argument("--quick", action="store_true", help="4 prompts x 2 samples, 2 rounds")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "rollout.json"))
    args = p.parse_args(argv)
    use_model(args.model)
    if args.quick:
        args.prompts, args.n, args.max_tokens, args.repeats = 4, 2, 4, 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    started, machine = _report.started(), _report.machine()
    runs = against_builtin(args.model, args.threads, args.concurrency, out.parent / "rollout_server.log",
                           lambda url: measure(url, args))
    med = medians(runs)
    pairs = zip(runs["client"], runs["raw"])
    report = {
        "benchmark": "rollout", "model": args.model, "prompts": args.prompts, "n": args.n,
        "max_tokens": args.max_tokens, "concurrency": args.concurrency, "repeats": args.repeats, "quick": args.quick,
        "machine": machine, "started": started, "runs": runs, "medians": med,
        "ratios": {"client_vs_raw": round(statistics.median(c["samples_per_s"] / r["samples_per_s"]
                                                            for c, r in pairs), 4),
                   "client_cpu_over_raw_cpu": round(med["client"]["client_cpu_s_per_1k_samples"]
                                                    / med["raw"]["client_cpu_s_per_1k_samples"], 4)},
    }
    _report.write(out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
