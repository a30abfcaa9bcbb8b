"""`RolloutWorker`: roll out one task n times and score the episodes.

Tokens (`rollout.tokens`): `exact` samples with token ids and keeps the engine's; `recompute` samples
through the plain chat route and rebuilds ids and logprobs (`recompute.py`).

Default path (no bundle rollout): one chat call with `n` samples on the task's messages; sample i is
episode `"{task_id}:{i}"`. Bundle path: `rollout(task, client)` runs n times concurrently, each with
its own recording client; run i is episode `"{task_id}:{i}"`. See docs/evaluator-bundles.md for what
a rollout may return and how scoring is chosen.

Limits: a task whose prompt exceeds `rollout.maxPromptTokens` gives n episodes flagged
`prompt_too_long` (no samples, reward None, not retried: the data is the problem); a bundle rollout
that asks for more than `rollout.maxTurns` assistant turns in a conversation ends there with
termination reason `max_turns`, and the episode is scored with what it sampled.

Errors: inference failures (`RolloutInfraError`: unreachable server, token-contract violations,
401/403/404 configuration errors) propagate, so the task is re-leased. A request the engine refuses
as such (400/413/422, e.g. a conversation longer than the context), an exception from the bundle's
own code, a rollout timeout or a failing scorer produce an episode whose `errors` say so, reward
None (or the scorer's on-error reward), and every sample drawn so far.

Recording gateway (`gateway.py`): while a bundle rollout runs, its episode has an OpenAI-compatible
endpoint on the pod's loopback (`client.base_url`, `client.api_key`, `client.openai_env()`), so an
agent with its own OpenAI client is recorded like the injected client; the endpoint closes when the
rollout returns. A length limit one of its calls ran into ends the episode as above, an inference
failure behind one of its calls gives the task back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import inspect
from typing import Any, Callable, Mapping

from rft_runtime.data.task import Task
from rft_runtime.types import Episode

from ..types import Sample
from .bundle import EvaluatorBundle
from .chat_client import ChatClient, SyncChatClient
from .chat_template import ChatTokenizer
from .client import InferenceClient
from .concurrency import run_all
from .episodes import build_episode, episode_id
from .errors import InferenceHTTPError, MaxTurnsReached, PromptTooLong, RolloutInfraError
from .gateway import EpisodeEndpoint, RecordingGateway
from .outcome import RunOutcome, score_view
from .recompute import RecomputeSampler
from .recorder import DEFAULT_TRAJECTORY, RolloutRecorder
from .sampling import SamplingParams


def _ended_by_gateway(outcome: RunOutcome, endpoint: EpisodeEndpoint) -> bool:
    """Whether a call through the episode's gateway endpoint decided the outcome: an inference
    failure (raised: the task is given back), a prompt too long (an error episode) or the turn limit
    (termination ``max_turns``, scored as it stands). The agent's own answer to the refusal (often an
    exception) does not count then."""
    if endpoint.infra_error is not None:
        raise endpoint.infra_error
    if isinstance(endpoint.limit_error, PromptTooLong):
        outcome.fail(str(endpoint.limit_error))
        return True
    if isinstance(endpoint.limit_error, MaxTurnsReached):
        outcome.termination = "max_turns"
        return True
    return False


Scorer = Callable[[Sample, Task], Any]
"""`score(sample, item)`, sync or async, returning a float, None, a bool, a dict with `reward`, or a
`rft_runtime.rewards.ScoreResult`."""


class RolloutWorker:
    """Rolls out tasks with the training-aware processor; one instance per rollout process."""

    def __init__(
        self,
        inference: InferenceClient,
        tokenizer: ChatTokenizer,
        *,
        bundle: EvaluatorBundle | None = None,
        scorer: Scorer | None = None,
        max_concurrent_rollouts: int = 32,
        rollout_timeout_s: float | None = None,
        max_prompt_tokens: int | None = None,
        max_turns: int | None = None,
        tokens: str = "exact",
        gateway: RecordingGateway | None = None,
    ) -> None:
        if max_concurrent_rollouts < 1:
            raise ValueError(f"max_concurrent_rollouts must be >= 1, got {max_concurrent_rollouts}")
        self.inference = inference
        self.tokenizer = tokenizer
        self.bundle = bundle
        self.scorer = scorer
        self.rollout_timeout_s = rollout_timeout_s
        self.max_prompt_tokens = max_prompt_tokens
        self.max_turns = max_turns
        if tokens not in ("exact", "recompute"):
            raise ValueError(f"tokens must be 'exact' or 'recompute', got {tokens!r}")
        self.recompute = RecomputeSampler(inference, tokenizer) if tokens == "recompute" else None
        self._slots = asyncio.Semaphore(max_concurrent_rollouts)
        self._threads = max_concurrent_rollouts
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.gateway = gateway if gateway is not None else RecordingGateway()
        """The recording gateway bundle rollouts get (started with the first of them)."""

    async def aclose(self) -> None:
        """Stop the recording gateway and the thread pool."""
        await self.gateway.aclose()
        self.close()

    def close(self) -> None:
        """Shut down the thread pool used for synchronous bundle rollouts."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def rollout_task(
        self, task: Task | Mapping[str, Any], n: int, sampling: SamplingParams, policy_version: int
    ) -> list[Episode]:
        """n scored episodes `"{task_id}:{i}"`, i = 0..n-1, in order. `n`: the task's group size, its
        lease grant's (checked when the grant was parsed: `rft_runtime.coordinator.wire.GroupSize`)."""
        task = task if isinstance(task, Task) else Task.from_dict(dict(task))
        if self.bundle is not None and self.bundle.rollout is not None:
            outcomes = await run_all([self._bundle_run(task, i, sampling, policy_version) for i in range(n)])
        else:
            outcomes = await self._default_runs(task, n, sampling, policy_version)
        await self._score_together(task, outcomes)
        return [await self._finish(task, i, o, policy_version) for i, o in enumerate(outcomes)]

    def _client(self, sampling: SamplingParams, policy_version: int, recorder: RolloutRecorder) -> ChatClient:
        return ChatClient(self.inference, self.tokenizer, sampling=sampling, policy_version=policy_version,
                          recorder=recorder, max_prompt_tokens=self.max_prompt_tokens, max_turns=self.max_turns,
                          recompute=self.recompute)

    async def _default_runs(self, task: Task, n: int, sampling: SamplingParams, policy_version: int) -> list[RunOutcome]:
        recorder = RolloutRecorder()
        client = self._client(sampling, policy_version, recorder)
        try:
            async with self._slots:
                await client.chat.completions.create(messages=task.chat_messages(), n=n)
        except (InferenceHTTPError, PromptTooLong) as e:
            if isinstance(e, InferenceHTTPError) and not e.is_request_error:
                raise
            outcomes = [RunOutcome([]) for _ in range(n)]
            for o in outcomes:
                o.fail(str(e) if isinstance(e, PromptTooLong) else f"request_error: {e}")
            return outcomes
        if len(recorder.trajectories) != n:
            raise RolloutInfraError(f"expected {n} single-turn trajectories, recorded {len(recorder.trajectories)}")
        for t in recorder.trajectories:  # each sample is its own episode: no name clash to avoid
            t.name = DEFAULT_TRAJECTORY
        return [RunOutcome([t]) for t in recorder.trajectories]

    async def _bundle_run(self, task: Task, idx: int, sampling: SamplingParams, policy_version: int) -> RunOutcome:
        if sampling.seed is not None:  # distinct, reproducible seeds per rollout index
            sampling = dataclasses.replace(sampling, seed=(sampling.seed * 1_000_003 + idx) % (2**31 - 1))
        recorder = RolloutRecorder()
        client = self._client(sampling, policy_version, recorder)
        outcome = RunOutcome(recorder.trajectories)
        await self.gateway.start()
        endpoint = self.gateway.open(episode_id(task.task_id, idx), client)
        try:
            async with self._slots:
                out = await asyncio.wait_for(self._call_rollout(task, client), self.rollout_timeout_s)
        except Exception as e:  # asyncio.TimeoutError included
            return self._failed_run(outcome, endpoint, e)
        finally:
            self.gateway.close(endpoint)
        if _ended_by_gateway(outcome, endpoint):
            return outcome
        outcome.apply_output(out)
        return outcome

    def _failed_run(self, outcome: RunOutcome, endpoint: EpisodeEndpoint, error: BaseException) -> RunOutcome:
        """The outcome of a rollout that raised ``error`` (re-raised when the task must be given back)."""
        if _ended_by_gateway(outcome, endpoint):
            return outcome
        try:
            raise error
        except InferenceHTTPError as e:
            if not e.is_request_error:
                raise
            outcome.fail(f"request_error: {e}")  # e.g. the conversation outgrew the context
            return outcome
        except RolloutInfraError:
            raise
        except PromptTooLong as e:
            outcome.fail(str(e))
            return outcome
        except MaxTurnsReached:
            outcome.termination = "max_turns"  # the episode ends here and is scored as it stands
            return outcome
        except asyncio.TimeoutError:
            outcome.fail(f"rollout_timeout: exceeded {self.rollout_timeout_s}s", timeout=True)
            return outcome
        except Exception as e:  # the user's code failed: keep the episode and its samples
            outcome.fail(f"rollout_error: {type(e).__name__}: {e}")
            return outcome

    async def _call_rollout(self, task: Task, client: ChatClient) -> Any:
        assert self.bundle is not None and self.bundle.rollout is not None
        if self.bundle.rollout_is_async:
            return await self.bundle.rollout(task, client)
        loop = asyncio.get_running_loop()
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(self._threads, thread_name_prefix="rft-bundle")
        out = await loop.run_in_executor(self._executor, self.bundle.rollout, task, SyncChatClient(client, loop))
        if inspect.isawaitable(out):
            out = await out
        return out

    async def _finish(self, task: Task, idx: int, o: RunOutcome, policy_version: int) -> Episode:
        eid = episode_id(task.task_id, idx)
        samples = o.samples
        if not samples and not o.errors.any:
            o.fail("rollout_error: the rollout drew no samples")
        if samples and not o.errors.any and not o.has_reward:
            await self._score(eid, task, samples[-1], o)
        if o.termination is None and samples:
            o.termination = samples[-1].sample.finish_reason  # type: ignore[assignment]
        metrics = {
            "num_samples": float(len(samples)),
            "num_trajectories": float(len(o.trajectories)),
            "response_tokens": float(sum(len(s.sample.completion_ids) for s in samples)),
            "truncated_samples": float(sum(s.sample.truncated for s in samples)),
            **o.metrics,
        }
        measured = [s.sample.metadata["sampled_ids_kept"] for s in samples if "sampled_ids_kept" in s.sample.metadata]
        if measured:  # rollout.tokens recompute, on an engine that returned its sampled ids
            metrics["retokenize_drift"] = sum(not k for k in measured) / len(measured)
        return build_episode(
            task.task_id, idx, o.trajectories, reward=o.reward, reason=o.reason, errors=o.errors,
            termination_reason=o.termination, metrics=metrics,
            metadata={"domain": task.domain, "policy_version": policy_version, **o.metadata},
        )

    async def _score_together(self, task: Task, outcomes: list[RunOutcome]) -> None:
        """Scores the task's episodes in one group call when the scorer can (``score_group``: the
        rewards service, in process or remote), so that groupwise evaluators see the n samples of a
        task together; the episodes it leaves unscored are scored one by one in ``_finish``."""
        group = getattr(self.scorer, "score_group", None)
        if group is None or (self.bundle is not None and self.bundle.score is not None):
            return
        todo = [(i, o) for i, o in enumerate(outcomes) if o.samples and not o.errors.any and not o.has_reward]
        if not todo:
            return
        views = [score_view(episode_id(task.task_id, i), o.samples[-1], o.output) for i, o in todo]
        try:
            values = await group(views, task)
        except Exception as e:
            for _, o in todo:
                o.fail(f"score_error: {type(e).__name__}: {e}", runtime_error=True)
            return
        for (_, o), value in zip(todo, values):
            o.apply_score(value)

    async def _score(self, eid: str, task: Task, last: Any, o: RunOutcome) -> None:
        fn = self.bundle.score if self.bundle is not None and self.bundle.score is not None else self.scorer
        if fn is None:
            return
        try:
            value = fn(score_view(eid, last, o.output), task)
            if inspect.isawaitable(value):
                value = await value
        except Exception as e:
            o.fail(f"score_error: {type(e).__name__}: {e}", runtime_error=True)
            return
        o.apply_score(value)
