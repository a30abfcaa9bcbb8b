"""The recording gateway (an agent's own `openai.AsyncOpenAI` client, through
`rft_runtime.rollout.gateway`) against the injected training-aware client, on the same episodes.

Both sides roll out the same episodes -- one chat call each on the same messages, with the same
seeds -- against one builtin server started here: the injected side calls
`ChatClient.chat.completions.create` in process; the gateway side opens each episode on a
`RecordingGateway` and calls it with the official SDK over loopback HTTP (what an unmodified agent
does). Both record the same samples (checked: equal completion ids). Batches alternate (injected,
gateway, gateway, injected, ...) over `--repeats` rounds; medians reported.

`ratios.gateway_vs_injected`: episodes/s through the gateway (one SDK client, its connection pool
shared by the episodes) over episodes/s through the injected client (higher is better; the gateway
adds an HTTP hop and the SDK's own work per call); `gateway_new_client_vs_injected`: the same with a
new `AsyncOpenAI` per episode, as a plain agent makes one (its setup, a TLS context included, counts).

    .venv/bin/python bench/gateway.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import _report

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inference import DEFAULT_MODEL, QUESTION, against_builtin, medians  # noqa: E402

from rft_runtime.rollout import ChatClient, ChatTokenizer, InferenceClient, RolloutRecorder  # noqa: E402
from rft_runtime.rollout.gateway import RecordingGateway  # noqa: E402
from rft_runtime.rollout.sampling import SamplingParams  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{QUESTION} ({i})"}]


async def run_injected(inference: InferenceClient, tok: ChatTokenizer, sampling: SamplingParams, episodes: int,
                       concurrency: int) -> tuple[dict, list[list[int]]]:
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> list[int]:
        client = ChatClient(inference, tok, sampling=sampling, policy_version=0, recorder=RolloutRecorder())
        async with sem:
            await client.chat.completions.create(model="tiny", messages=_messages(i), seed=i)
        return client.recorder.samples[0].sample.completion_ids

    t0, c0 = time.perf_counter(), time.process_time()
    ids = await asyncio.gather(*(one(i) for i in range(episodes)))
    return _result(episodes, time.perf_counter() - t0, time.process_time() - c0), ids


async def run_gateway(inference: InferenceClient, tok: ChatTokenizer, sampling: SamplingParams, episodes: int,
                      concurrency: int, *, new_client: bool = False) -> tuple[dict, list[list[int]]]:
    """Through the gateway: one SDK client whose connection pool every episode shares
    (``with_options(base_url, api_key)``), or with ``new_client`` a new ``AsyncOpenAI`` per episode (as
    examples/bundles/openai_agent.py makes one: its setup, TLS context included, counts too)."""
    from openai import AsyncOpenAI

    gateway = RecordingGateway()
    await gateway.start()
    sem = asyncio.Semaphore(concurrency)
    shared = AsyncOpenAI(base_url=gateway.url, api_key="-", max_retries=0)

    async def one(i: int) -> list[int]:
        client = ChatClient(inference, tok, sampling=sampling, policy_version=0, recorder=RolloutRecorder())
        endpoint = gateway.open(f"bench:{i}", client)
        try:
            async with sem:
                if new_client:
                    async with AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0) as sdk:
                        await sdk.chat.completions.create(model="tiny", messages=_messages(i), seed=i)  # type: ignore[arg-type]
                else:
                    sdk = shared.with_options(base_url=endpoint.base_url, api_key=endpoint.api_key)
                    await sdk.chat.completions.create(model="tiny", messages=_messages(i), seed=i)  # type: ignore[arg-type]
        finally:
            gateway.close(endpoint)
        return client.recorder.samples[0].sample.completion_ids

    t0, c0 = time.perf_counter(), time.process_time()
    try:
        ids = await asyncio.gather(*(one(i) for i in range(episodes)))
    finally:
        await shared.close()
        await gateway.aclose()
    return _result(episodes, time.perf_counter() - t0, time.process_time() - c0), ids


async def run_gateway_new_client(inference: InferenceClient, tok: ChatTokenizer, sampling: SamplingParams,
                                 episodes: int, concurrency: int) -> tuple[dict, list[list[int]]]:
    return await run_gateway(inference, tok, sampling, episodes, concurrency, new_client=True)


def _result(episodes: int, wall: float, cpu: float) -> dict:
    return {"episodes": episodes, "wall_s": round(wall, 4), "episodes_per_s": round(episodes / wall, 2),
            "client_cpu_ms_per_episode": round(1000 * cpu / episodes, 3)}


async def measure(url: str, args) -> dict:
    tok = ChatTokenizer.from_pretrained(args.model)
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, ignore_eos=True)
    runs: dict[str, list[dict]] = {"injected": [], "gateway": [], "gateway_new_client": []}
    async with InferenceClient(url, "tiny", max_concurrency=args.concurrency) as inference:
        await run_injected(inference, tok, sampling, 2, 2)  # warm-up
        await run_gateway(inference, tok, sampling, 2, 2)
        for r in range(args.repeats):
            order = [("injected", run_injected), ("gateway", run_gateway), ("gateway_new_client", run_gateway_new_client)]
            got = {}
            for name, fn in (order if r % 2 == 0 else order[::-1]):
                res, got[name] = await fn(inference, tok, sampling, args.episodes, args.concurrency)
                runs[name].append(res)
                print(f"round {r} {name:>18}: {res['episodes_per_s']:>7.1f} episodes/s, client CPU "
                      f"{res['client_cpu_ms_per_episode']:.2f} ms/episode", flush=True)
            if not got["injected"] == got["gateway"] == got["gateway_new_client"]:
                raise SystemExit("the sides recorded different samples for the same seeds")
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    p.add_argument("--quick", action="store_true", help="8 episodes, 4 tokens, 2 rounds")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "gateway.json"))
    args = p.parse_args(argv)
    if args.quick:
        args.episodes, args.max_tokens, args.repeats = 8, 4, 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    started, machine = _report.started(), _report.machine()
    runs = against_builtin(args.model, args.threads, args.concurrency, out.parent / "gateway_server.log",
                           lambda url: measure(url, args))
    med = medians(runs)
    pairs = zip(runs["gateway"], runs["injected"])
    report = {
        "benchmark": "gateway", "model": args.model, "episodes": args.episodes, "max_tokens": args.max_tokens,
        "concurrency": args.concurrency, "repeats": args.repeats, "quick": args.quick, "machine": machine,
        "started": started, "runs": runs, "medians": med,
        "ratios": {"gateway_vs_injected": round(statistics.median(g["episodes_per_s"] / i["episodes_per_s"]
                                                                  for g, i in pairs), 4),
                   "gateway_new_client_vs_injected": round(statistics.median(
                       g["episodes_per_s"] / i["episodes_per_s"]
                       for g, i in zip(runs["gateway_new_client"], runs["injected"])), 4),
                   "gateway_cpu_over_injected_cpu": round(med["gateway"]["client_cpu_ms_per_episode"]
                                                          / med["injected"]["client_cpu_ms_per_episode"], 4)},
    }
    _report.write(out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
