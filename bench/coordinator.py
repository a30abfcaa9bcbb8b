"""The coordinator's intake: episodes per second over HTTP against the HTTP floor, and what the intake
costs a computation sharing the coordinator's process (as the trainer does).

The coordinator is a thread of the trainer's process (its aiohttp server,
:class:`rft_runtime.coordinator.server.CoordinatorServer`), so every lease and every episode it takes is
Python work under the same interpreter lock as the trainer's step. This benchmark runs the real
coordinator on loopback with a "trainer" thread that keeps ``--ahead`` steps of ``--prompts`` tasks
submitted and collects each step's groups in order (as ``rft run`` does), and drives it from a separate
process of ``--workers`` rollout workers built from the product's own clients
(:class:`~rft_runtime.rollout.coordinator_client.CoordinatorClient`, long-polled leases of
``--per-lease`` tasks, :class:`~rft_runtime.rollout.posting.EpisodePoster`), which post ``--n``
episodes per task shaped like the sample job's by default (a 34-token prompt, 2-16 response tokens
with their log-probs, the chat message and metadata; ``--prompt-len``, ``--response-len`` and
``--vocab`` for longer ones) without generating anything. The coordinator checks token ids against
``--vocab``, as the trainer's does against the model's vocabulary. Per round, interleaved:

- ``coordinator``: intake as fast as the workers go (episodes accepted per second, leases per second,
  the coordinator process's CPU-seconds per 1000 episodes);
- ``floor``: the same workers against a bare aiohttp server that reads each body as JSON and answers
  what the coordinator would (every episode accepted, canned leases): what HTTP and JSON alone allow
  in this process;
- ``compute_idle`` and ``compute_loaded``: a single-threaded torch loop (a 4-layer MLP forward and
  backward, whose operations release the lock as the trainer's do) in the coordinator's process,
  alone and while the coordinator takes episodes at ``--rate`` per second (the sample job's rate at
  ``maxStaleness`` 1 by default: 128 episodes a step, 0.27 s a step).

``ratios``: ``intake_coordinator_vs_floor`` (episodes/s, coordinator ÷ floor; higher is better) and
``compute_speed_under_intake`` (the loop's idle iteration time ÷ its iteration time under intake at
``--rate``: 1.0 would be no cost to a trainer sharing the process). ``medians`` has every measure.

    .venv/bin/python bench/coordinator.py [--rounds 3] [--seconds 4] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import _report

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "api"), str(ROOT / "runtime")]


# ---------------------------------------------------------------------------------------- the workers

def episode(task_key: str, idx: int, version: int, rng: Any, prompt_len: int = 34, response_len: int = 16,
            vocab: int = 259) -> dict[str, Any]:
    """An episode of the sample job's shape: what its rollout worker posts for a 1-turn arithmetic task,
    every field of :class:`rft_runtime.types.Episode` written out as the worker writes them."""
    import random

    k = rng.randint(min(2, response_len), response_len)
    prompt = random.Random(task_key)  # the task's samples share their prompt (the coordinator checks)
    return {
        "id": f"{task_key}:{idx}", "task_id": task_key, "rollout_idx": idx,
        "trajectories": [{"name": "default", "reward": float(idx % 2), "metadata": {}, "info": {}, "steps": [{
            "prompt_ids": [prompt.randrange(3, vocab) for _ in range(prompt_len)],
            "response_ids": [rng.randrange(3, vocab) for _ in range(k)],
            "logprobs": [-rng.random() * 3 for _ in range(k)], "response_mask": [1] * k,
            "policy_version": version, "reward": float(idx % 2), "done": True, "finish_reason": "stop",
            "truncated": False, "messages": [{"role": "user", "content": "What is 10 - 5?"}],
            "response_text": "5", "metadata": {"seed": rng.randrange(1 << 30), "server": "http://127.0.0.1:1"},
            # the rest of the fields the worker's episodes carry (rLLM's, at their defaults)
            "weight_version": version, "chat_completions": [], "observation": None, "thought": "", "action": None,
            "model_response": "", "model_output": None, "info": {}, "mc_return": 0.0, "advantage": None}],
            "uid": f"{task_key}:{idx}:u", "task": None}],
        "task": None, "info": {}, "is_correct": None, "reward_reason": "math: '5' (last_number) equals '5'",
        "metrics": {"num_samples": 1.0, "response_tokens": float(k), "math": float(idx % 2), "time/reward": 0.005},
        "termination_reason": "stop", "metadata": {"domain": "math", "policy_version": version},
        "errors": {"timeout": False, "runtime_error": False, "parse_error": False, "rollout_error": False,
                   "message": None},
    }


async def workers(url: str, n_workers: int, per_lease: int, n: int, seconds: float, rate: float,
                  shape: dict[str, int]) -> dict:
    """``n_workers`` rollout workers for ``seconds``: lease, post ``n`` episodes per task of ``shape``
    (:func:`episode`'s lengths and vocabulary; at most ``rate`` episodes per second in all; 0: as fast
    as they go)."""
    import random

    from rft_runtime.coordinator.wire import LeaseGrant
    from rft_runtime.rollout.coordinator_client import CoordinatorClient
    from rft_runtime.rollout.posting import EpisodePoster

    stop = time.monotonic() + seconds
    counts = {"episodes": 0, "leases": 0}
    interval = n / rate if rate > 0 else 0.0  # seconds between two tasks' posts, over all workers
    next_at = [time.monotonic()]

    async def one(poster: EpisodePoster, grant: LeaseGrant, rng: random.Random) -> None:
        if interval:
            at = next_at[0] = max(next_at[0] + interval, time.monotonic())
            await asyncio.sleep(max(0.0, at - time.monotonic()))
        eps = [episode(grant.task_key, i, grant.policy_version, rng, **shape) for i in range(grant.n)]
        res = await poster.post(eps, grant.lease_id)
        counts["episodes"] += len(res.accepted)

    async def worker(i: int) -> None:
        rng = random.Random(i)
        async with CoordinatorClient(url, attempt_timeout_s=30.0) as coord:
            poster = EpisodePoster(coord, f"w{i}")
            inflight: set[asyncio.Task[None]] = set()
            while time.monotonic() < stop:
                free = per_lease - len(inflight)
                if free > 0:
                    resp = await coord.lease(f"w{i}", free, wait_s=0.5)
                    counts["leases"] += 1
                    if resp.done:
                        break
                    inflight |= {asyncio.create_task(one(poster, g, rng)) for g in resp.tasks}
                if inflight:
                    done, inflight = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
                    for t in done:
                        t.result()
            for t in inflight:
                t.cancel()
            await asyncio.gather(*inflight, return_exceptions=True)
            await poster.aclose()

    t0 = time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(n_workers)))
    return {**counts, "seconds": time.monotonic() - t0}


# ---------------------------------------------------------------------------------------- the servers

class Floor:
    """A bare aiohttp server answering the coordinator's two routes the way it would: leases of fresh
    tasks, every posted episode accepted (each body read as JSON)."""

    def __init__(self, n: int) -> None:
        from aiohttp import web

        from rft_runtime.coordinator.server import AppThread

        self.n, self.seq = n, 0

        async def lease(request: web.Request) -> web.Response:
            body = await request.json()
            grants = []
            for _ in range(int(body["max_tasks"])):
                self.seq += 1
                grants.append({"lease_id": f"l{self.seq}", "task_key": f"t{self.seq}", "task": {"prompt": "q"},
                               "n": self.n, "seed": self.seq, "sampling": {}, "policy_version": 0,
                               "purpose": "train", "deadline_in_s": 60.0})
            return web.json_response({"done": False, "finished": False, "policy_version": 0,
                                      "lease_timeout_s": 60.0, "tasks": grants})

        async def episodes(request: web.Request) -> web.Response:
            body = await request.json()
            ids = [e["id"] for e in body["episodes"]]
            return web.json_response({"accepted": ids, "duplicate": [], "stale": [], "unknown": [], "refused": [],
                                      "invalid": [], "errors": []})

        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/lease", lease)
        app.router.add_post("/v1/episodes", episodes)
        self.server = AppThread(app, "127.0.0.1", 0)

    def start(self) -> str:
        self.server.start()
        return f"http://127.0.0.1:{self.server.port}"

    def stop(self) -> None:
        self.server.stop()


class Served:
    """The real coordinator on loopback with a trainer thread keeping ``ahead`` steps of ``prompts``
    tasks submitted and collecting each step's groups in order."""

    def __init__(self, n: int, prompts: int, ahead: int, vocab: int) -> None:
        from rft_runtime.coordinator import Coordinator, CoordinatorConfig, CoordinatorService, EpisodeLimits
        from rft_runtime.coordinator.server import CoordinatorServer

        # as the trainer configures it: token ids checked against the model's vocabulary
        self.svc = CoordinatorService(Coordinator(CoordinatorConfig(
            n=n, lease_timeout_s=60.0, max_staleness=ahead, limits=EpisodeLimits(vocab_size=vocab))))
        self.server = CoordinatorServer(self.svc, "127.0.0.1", 0)
        self.prompts, self.ahead, self.stopping = prompts, ahead, False
        self.thread = threading.Thread(target=self._trainer, name="trainer", daemon=True)

    def _trainer(self) -> None:
        steps: list[list[str]] = []
        seq = 0
        while not self.stopping:
            while len(steps) < self.ahead + 1:
                tasks = [{"task_id": f"s{seq}-{i}", "prompt": "q", "ground_truth": "5"} for i in range(self.prompts)]
                steps.append(self.svc.submit(tasks, seeds=list(range(seq * self.prompts, (seq + 1) * self.prompts))))
                seq += 1
            if self.svc.collect(steps.pop(0), stall_timeout_s=120.0, should_stop=lambda: self.stopping,
                                poll_s=0.05) is None:
                return

    def start(self) -> str:
        self.server.start()
        self.thread.start()
        return self.server.url

    def stop(self) -> None:
        self.stopping = True
        self.svc.finish()
        self.thread.join(10)
        self.server.stop()


def compute_loop(seconds: float) -> float:
    """A single-threaded torch computation in small operations (each releases the interpreter lock, as
    the trainer's do) for ``seconds``: a 4-layer MLP forward and backward on 64 rows; returns the median
    iteration time."""
    import torch

    g = torch.Generator().manual_seed(0)
    layers = [torch.nn.Linear(256, 256) for _ in range(4)]
    x = torch.randn(64, 256, generator=g)
    times = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        t0 = time.perf_counter()
        h = x
        for lin in layers:
            h = torch.nn.functional.silu(lin(h))
        h.square().mean().backward()
        for lin in layers:
            lin.weight.grad = None
            lin.bias.grad = None
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_client(url: str, args: argparse.Namespace, seconds: float, rate: float) -> subprocess.Popen:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--client", url, "--workers", str(args.workers),
           "--per-lease", str(args.per_lease), "--n", str(args.n), "--seconds", str(seconds), "--rate", str(rate),
           "--prompt-len", str(args.prompt_len), "--response-len", str(args.response_len), "--vocab", str(args.vocab)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                [str(ROOT / "api"), str(ROOT / "runtime"), os.environ.get("PYTHONPATH", "")])})


def finish_client(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        raise RuntimeError(f"client failed ({proc.returncode}):\n{out[-2000:]}\n{err[-4000:]}")
    return json.loads(line[len("RESULT "):])


def intake(side: str, args: argparse.Namespace, *, rate: float = 0.0, compute: bool = False) -> dict:
    """One window of the workers against ``side`` (``coordinator`` or ``floor``)."""
    server = Served(args.n, args.prompts, args.ahead, args.vocab) if side == "coordinator" else Floor(args.n)
    url = server.start()
    try:
        cpu0 = time.process_time()
        proc = run_client(url, args, args.seconds, rate)
        if compute:
            time.sleep(0.5)  # the workers' start-up (imports) outside the loop's window
            iteration_s = compute_loop(args.seconds - 1.0)
        res = finish_client(proc)
        cpu = time.process_time() - cpu0
    finally:
        server.stop()
    eps = max(res["episodes"], 1)
    out = {"episodes_per_s": res["episodes"] / res["seconds"], "leases_per_s": res["leases"] / res["seconds"],
           "episodes": res["episodes"], "server_cpu_s_per_1k_episodes": None if compute else 1000 * cpu / eps}
    if compute:
        out["compute_iteration_s"] = iteration_s
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=4.0, help="length of each window")
    p.add_argument("--workers", type=int, default=4, help="rollout workers (one client process)")
    p.add_argument("--per-lease", type=int, default=4, help="tasks in flight per worker")
    p.add_argument("--n", type=int, default=8, help="episodes per task")
    p.add_argument("--prompts", type=int, default=16, help="tasks per step")
    p.add_argument("--ahead", type=int, default=1, help="steps submitted ahead of the one collected")
    p.add_argument("--prompt-len", type=int, default=34, help="prompt tokens per episode (the sample job's: 34)")
    p.add_argument("--response-len", type=int, default=16, help="at most this many response tokens (at least 2)")
    p.add_argument("--vocab", type=int, default=259, help="the vocabulary the coordinator checks token ids against")
    p.add_argument("--rate", type=float, default=470.0,
                   help="episodes/s during the compute window (default: the sample job's at maxStaleness 1)")
    p.add_argument("--quick", action="store_true", help="one short round (a smoke test)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "coordinator.json"))
    p.add_argument("--client", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.client:
        shape = {"prompt_len": args.prompt_len, "response_len": args.response_len, "vocab": args.vocab}
        res = asyncio.run(workers(args.client, args.workers, args.per_lease, args.n, args.seconds, args.rate, shape))
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    if args.quick:
        args.rounds, args.seconds = 1, 2.5
    import torch

    torch.set_num_threads(1)
    report: dict[str, Any] = {
        "benchmark": "coordinator", "quick": args.quick,
        "machine": _report.machine(),
        "started": _report.started(),
        "shape": {k: getattr(args, k) for k in ("rounds", "seconds", "workers", "per_lease", "n", "prompts", "ahead",
                                                 "rate", "prompt_len", "response_len", "vocab")}}
    runs: dict[str, list[dict]] = {"coordinator": [], "floor": [], "compute_idle": [], "compute_loaded": []}
    for r in range(args.rounds):
        order = list(runs) if r % 2 == 0 else list(runs)[::-1]
        for name in order:
            if name == "compute_idle":
                runs[name].append({"compute_iteration_s": compute_loop(args.seconds - 1.0)})
            elif name == "compute_loaded":
                runs[name].append(intake("coordinator", args, rate=args.rate, compute=True))
            else:
                runs[name].append(intake(name, args))
            print(name, json.dumps(runs[name][-1]), flush=True)
    med = {name: {k: statistics.median(x[k] for x in rs) for k in rs[0] if rs[0][k] is not None}
           for name, rs in runs.items()}
    report["runs"], report["medians"] = runs, med
    report["ratios"] = {
        "intake_coordinator_vs_floor": round(med["coordinator"]["episodes_per_s"] / med["floor"]["episodes_per_s"], 3),
        "compute_speed_under_intake": round(med["compute_idle"]["compute_iteration_s"]
                                            / med["compute_loaded"]["compute_iteration_s"], 3),
    }
    _report.write(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
