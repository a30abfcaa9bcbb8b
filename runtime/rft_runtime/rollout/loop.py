"""The rollout role (`rft rollout --config FILE`): lease → roll out → score → post, until done.

Each leased task is rolled out ``n`` times by :class:`~rft_runtime.rollout.RolloutWorker` against
the inference endpoints (token contract kept), scored in process with the rewards registry (or
through the reward role when ``spec.evaluator.remote`` and ``endpoints.reward`` are set), and its
episodes are posted to the coordinator (idempotent, so a retried post is harmless; the posts of tasks
that finish while one is in flight go as one, :mod:`~rft_runtime.rollout.posting`). A task whose
inference fails is released for immediate re-issue. The loop keeps at most ``spec.rollout.concurrency``
samples in flight, each leased task counting its own group size (its grant's ``n``, the one source of a
task's size: :mod:`rft_runtime.coordinator.wire`); the job's ``rollout.samplesPerPrompt`` only
estimates how many tasks one lease may ask for (at least one when none is in flight). A long-polled
lease is open beside its rollouts whenever it has room (the coordinator answers it as soon as
tasks are submitted), and it stops when the coordinator answers ``done`` or ``should_stop()`` turns true; it gives up with an
error after ``max_consecutive_failures`` failed tasks in a row (a misconfiguration, not bad luck).

``rft rollout`` stops gracefully on SIGTERM or SIGINT (tasks in flight are cancelled; their leases
expire and are re-issued). With ``--when-done wait`` (what the operator's rollout Deployment passes) a
worker the coordinator told training is finished stays up, idle, until it is stopped: a Deployment
restarts a container that exits, so exiting would only start another worker that is told "done"
again. A worker told "done" by a trainer that is only stopping (its pod deleted, interrupted) exits
either way, and its restart connects to the trainer's next attempt.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import socket
import sys
import time
from typing import Any, Callable

from rft_api import runtime
from rft_api.runtime import RuntimeConfig

from ..adapters import serves_adapters
from ..coordinator.wire import LeaseGrant, LeaseResponse
from ..model.loading import load_tokenizer, resolve_model_dir
from .bundle import EvaluatorBundle, load_bundle
from .chat_template import ChatTokenizer
from .client import InferenceClient
from .coordinator_client import CoordinatorClient, CoordinatorUnavailable
from .episodes import episode_json
from .posting import EpisodePoster
from .retry import RetryPolicy
from .sampling import SamplingParams
from .scoring import InProcessScorer, RemoteScorer
from .worker import RolloutWorker

log = logging.getLogger(__name__)


@dataclasses.dataclass
class LoopStats:
    """What a rollout loop did."""

    tasks_done: int = 0
    tasks_failed: int = 0
    episodes_posted: int = 0
    episodes_accepted: int = 0
    episodes_rejected: int = 0
    ended: str = ""
    """Why the loop ended: ``done`` (the coordinator said training completed), ``trainer stopped`` (the
    coordinator said done because its trainer is stopping: a later attempt resumes the run),
    ``stopped`` (``should_stop()``) or ``coordinator unavailable`` (no answer within its retry deadline)."""


def _bundle(cfg: RuntimeConfig) -> EvaluatorBundle | None:
    """The evaluator's ``rollout`` function (a bundle's, or a file evaluator's at its mounted path),
    which replaces the default single-turn rollout."""
    ref = cfg.rollout_function()
    if ref is None:
        return None
    b = load_bundle(ref)
    return EvaluatorBundle(source=b.source, rollout=b.rollout) if b.rollout else None


def runs_user_code(cfg: RuntimeConfig) -> bool:
    """Whether a rollout worker of ``cfg`` runs the job's own code: a rollout function, or an
    evaluator that is not builtin scored in this process. Such code may load a model with
    transformers, so the worker then loads its tokenizer with torch visible; otherwise it loads it
    without importing torch (:func:`~rft_runtime.model.loading.torch_hidden`)."""
    if cfg.rollout_function() is not None:
        return True
    return cfg.scoring == "rollout" and any(e.builtin is None for e in cfg.spec.evaluator.entries())


class RolloutLoop:
    """One rollout worker process's loop (see the module docstring)."""

    def __init__(self, cfg: RuntimeConfig, *, worker_id: str | None = None, poll_s: float = 0.2,
                 lease_wait_s: float = 5.0, should_stop: Callable[[], bool] = lambda: False,
                 max_consecutive_failures: int = 20) -> None:
        self.cfg = cfg
        self.spec = cfg.spec
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.poll_s = poll_s
        """How often the loop looks at ``should_stop``, and the least time between two leases that came
        back empty at once."""
        self.lease_wait_s = lease_wait_s
        """How long the coordinator may hold a lease that finds no task (a long poll)."""
        self.should_stop = should_stop
        self.stats = LoopStats()
        self.max_consecutive_failures = max_consecutive_failures
        self._consecutive_failures = 0
        self._last_error = ""

    def _scorer(self) -> Any:
        # The config says where scoring happens ("reward" whenever the job has a reward role:
        # evaluator.remote, code_sandbox, llm_judge); only then do the reward pods hold the evaluator
        # files and API keys.
        if self.cfg.scoring == "reward":
            if not self.cfg.endpoints.reward:
                raise runtime.ConfigError("config: scoring is 'reward' but endpoints.reward is not set")
            return RemoteScorer(self.cfg.endpoints.reward, timeout_s=self.spec.rollout.request_timeout_seconds)
        return InProcessScorer(self.cfg)

    async def run(self) -> LoopStats:
        """Run until the coordinator says done (or ``should_stop``); returns the stats."""
        spec = self.spec
        paths = self.cfg.paths
        model_dir = resolve_model_dir(paths)
        tok = ChatTokenizer(load_tokenizer(model_dir, paths.tokenizer, spec.model.chat_template,
                                           torch_free=not runs_user_code(self.cfg)))
        log.info("tokenizer of %s loaded (%s)", model_dir,
                 "torch imported" if "torch" in sys.modules else "torch not imported")
        retry = RetryPolicy(deadline_s=spec.rollout.request_timeout_seconds,
                            attempt_timeout_s=spec.rollout.request_timeout_seconds)
        scorer = self._scorer()
        adapters = serves_adapters(spec.inference.engine, spec.inference.weight_sync)
        async with InferenceClient(self.cfg.endpoints.inference, self.cfg.endpoints.served_model_name, adapter_versions=adapters,
                                   max_concurrency=spec.rollout.concurrency, retry=retry,
                                   n_per_request=True) as inference, \
                CoordinatorClient(self.cfg.endpoints.coordinator, should_stop=self.should_stop) as coord:
            worker = RolloutWorker(inference, tok, bundle=_bundle(self.cfg), scorer=scorer,
                                   max_concurrent_rollouts=spec.rollout.concurrency,
                                   rollout_timeout_s=spec.rollout.request_timeout_seconds,
                                   max_prompt_tokens=spec.rollout.max_prompt_tokens,
                                   max_turns=spec.rollout.max_turns, tokens=spec.rollout.tokens)
            poster = EpisodePoster(coord, self.worker_id)
            try:
                await self._loop(coord, poster, worker, scorer)
            finally:
                await poster.aclose()
                await worker.aclose()
                await scorer.aclose()
        return self.stats

    def _lease_size(self, samples_in_flight: int) -> int:
        """How many tasks the next lease asks for, with ``samples_in_flight`` samples of leased tasks in
        flight: the room left of ``rollout.concurrency``, in tasks of the job's ``samplesPerPrompt`` (an
        estimate: a grant's own ``n`` is what it counts once leased), and one task when none is in flight."""
        rollout = self.spec.rollout
        room = (rollout.concurrency - samples_in_flight) // rollout.samples_per_prompt
        return max(1, room) if samples_in_flight == 0 else room

    async def _loop(self, coord: CoordinatorClient, poster: EpisodePoster, worker: Any, scorer: Any) -> None:
        """Lease while there is room, with the lease long-polled (:attr:`lease_wait_s`) beside the tasks in
        flight: new work is heard of when it is submitted, not at a poll."""
        loop = asyncio.get_running_loop()
        inflight: dict[asyncio.Task[None], int] = {}  # each task rolling out → its grant's n
        leasing: asyncio.Task[LeaseResponse] | None = None
        lease_at = 0.0  # no sooner: a lease that came back empty at once (a server that does not hold it)
        try:
            while not self.should_stop():
                ask = self._lease_size(sum(inflight.values()))
                if ask > 0 and leasing is None and loop.time() >= lease_at:
                    lease_at = loop.time() + self.poll_s
                    leasing = asyncio.create_task(coord.lease(self.worker_id, ask, wait_s=self.lease_wait_s))
                waiting: set[asyncio.Task[Any]] = set(inflight)
                if leasing is not None:
                    waiting.add(leasing)
                if waiting:
                    done, _ = await asyncio.wait(waiting, timeout=self.poll_s, return_when=asyncio.FIRST_COMPLETED)
                else:
                    done = set()
                    await asyncio.sleep(max(0.0, min(self.poll_s, lease_at - loop.time())))
                for t in done:
                    inflight.pop(t, None)
                if leasing is not None and leasing in done:
                    answered, leasing = leasing, None
                    try:
                        resp = answered.result()
                    except CoordinatorUnavailable as e:
                        log.warning("coordinator unavailable: %s", e)
                        self.stats.ended = "stopped" if self.should_stop() else "coordinator unavailable"
                        break
                    if resp.done:
                        # "finished": training completed; else the trainer is stopping and will resume
                        self.stats.ended = "done" if resp.finished else "trainer stopped"
                        break
                    if resp.tasks:
                        lease_at = 0.0
                    for grant in resp.tasks:
                        inflight[asyncio.create_task(self._one(coord, poster, worker, scorer, grant))] = grant.n
                if self._consecutive_failures >= self.max_consecutive_failures:
                    raise RuntimeError(f"rollout worker {self.worker_id}: {self._consecutive_failures} tasks failed in "
                                       f"a row; last error: {self._last_error}")
            else:
                self.stats.ended = "stopped"
        finally:
            pending = [t for t in (*inflight, leasing) if t is not None]
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    def _sampling(self, grant: LeaseGrant) -> SamplingParams:
        """The grant's sampling; a field the coordinator left out is the job's ``rollout`` setting."""
        s, rollout = grant.sampling, self.spec.rollout
        return SamplingParams(max_tokens=rollout.max_tokens if s.max_tokens is None else s.max_tokens,
                              temperature=rollout.temperature if s.temperature is None else s.temperature,
                              top_p=s.top_p, top_k=s.top_k, seed=grant.seed)

    async def _one(self, coord: CoordinatorClient, poster: EpisodePoster, worker: Any, scorer: Any,
                   grant: LeaseGrant) -> None:
        """Roll out, score and post one leased task (its grant's ``n`` samples); on failure release the
        lease (re-issued)."""
        try:
            sampling = self._sampling(grant)
            task = dict(grant.task, task_id=grant.task_key)
            t0 = time.perf_counter()
            episodes = await worker.rollout_task(task, grant.n, sampling, grant.policy_version)
            seconds = time.perf_counter() - t0
            dicts = []
            for ep in episodes:
                d = episode_json(ep)
                d["metrics"] = {**d.get("metrics", {}), "time/rollout": seconds}
                dicts.append(d)
            res = await poster.post(dicts, grant.lease_id)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure: give the task back, keep the loop alive
            self.stats.tasks_failed += 1
            self._consecutive_failures += 1
            self._last_error = f"{type(e).__name__}: {e}"
            log.warning("task %s failed (%s: %s); releasing its lease", grant.task_key, type(e).__name__, e,
                        exc_info=not isinstance(e, OSError))
            try:
                await coord.release([grant.lease_id], f"{type(e).__name__}: {e}")
            except Exception:  # noqa: BLE001 - the lease expires and is re-issued anyway
                pass
            return
        self.stats.tasks_done += 1
        self._consecutive_failures = 0
        self.stats.episodes_posted += len(dicts)
        self.stats.episodes_accepted += len(res.accepted)
        self.stats.episodes_rejected += len(res.stale) + len(res.unknown) + len(res.invalid)
        if res.errors:
            log.warning("coordinator refused episodes of %s: %s", grant.task_key, res.errors[:3])


def main(argv: list[str] | None = None) -> int:
    """``rft rollout --config FILE [--worker-id ID]``."""
    p = argparse.ArgumentParser(prog="rft rollout", description="Run the rollout role: lease tasks, sample, "
                                "score and post episodes until the trainer is done.")
    p.add_argument("--config", required=True, help="the resolved runtime config (config.json)")
    p.add_argument("--worker-id", default=None, help="default: <hostname>-<pid>")
    p.add_argument("--when-done", choices=("exit", "wait"), default="exit",
                   help="once the coordinator says the run is done: exit (default), or stay up idle until "
                        "SIGTERM/SIGINT (a Deployment's pod, which would otherwise be restarted)")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every request at INFO: the lease poll alone would be five lines a second.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    cfg = runtime.load(args.config)
    return asyncio.run(_serve(cfg, args.worker_id, args.when_done))


async def _serve(cfg: RuntimeConfig, worker_id: str | None, when_done: str) -> int:
    """Run one loop until done or a stop signal (handled: a container's PID 1 ignores a signal it has
    no handler for, so an unhandled SIGTERM would keep the pod up for its whole grace period); with
    ``when_done == "wait"`` a finished worker then idles until the signal."""
    stop = asyncio.Event()
    aio = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        aio.add_signal_handler(sig, stop.set)
    try:
        stats = await RolloutLoop(cfg, worker_id=worker_id, should_stop=stop.is_set).run()
        log.info("rollout done: %s", dataclasses.asdict(stats))
        if stats.ended == "done" and when_done == "wait" and not stop.is_set():
            log.info("the run is done; idle until stopped")
            await stop.wait()
        if stop.is_set():
            log.info("rollout stopped by a signal")
        return 0
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            aio.remove_signal_handler(sig)
