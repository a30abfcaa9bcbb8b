"""Scoring for the rollout role: in process (the rewards registry) or through the reward role.

Both backends are :class:`~rft_runtime.rollout.RolloutWorker` scorers: ``score(sample, task)``
returning a :class:`~rft_runtime.rewards.types.ScoreResult`, which the worker applies to the
episode (reward, reason, error flags, metrics — the composite puts each evaluator's own reward in
``metrics[<evaluator name>]``). Both add ``time/reward`` (seconds spent scoring) to the metrics.

The remote scorer retries what says nothing about the samples: a connection that fails (the reward
pod not ready yet, or restarting behind its Service) and HTTP 425, 429 and 5xx, with the rollout
role's capped exponential backoff, until the request timeout is spent. Only then does the episode
carry ``runtime_error``: a reward role that starts after the rollout role costs no episode.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from typing import Any

import aiohttp

from rft_api.runtime import RuntimeConfig

from .. import auth
from ..rewards.service import RewardService
from ..rewards.types import Item, Sample, ScoreResult
from ..timeouts import LazySession, session_timeout
from .retry import RetryPolicy, is_retryable_status, parse_retry_after

log = logging.getLogger(__name__)


def _task_dict(task: Any) -> dict[str, Any]:
    return task.to_dict() if hasattr(task, "to_dict") else dict(task)


class InProcessScorer:
    """Scores with a :class:`~rft_runtime.rewards.service.RewardService` built from the job's
    runtime config (the same evaluator entries the reward role would run)."""

    def __init__(self, cfg: RuntimeConfig) -> None:
        self.service = RewardService.from_config(cfg)

    async def __call__(self, sample: Any, task: Any) -> Any:
        return (await self.score_group([sample], task))[0]

    async def score_group(self, samples: list[Any], task: Any) -> list[Any]:
        """The samples of one task scored together (groupwise evaluators see them in one call)."""
        t0 = time.perf_counter()
        results = await self.service.score_group([Sample.from_any(s) for s in samples], Item.from_any(_task_dict(task)))
        for r in results:
            r.metrics["time/reward"] = time.perf_counter() - t0
        return results

    async def aclose(self) -> None:
        await self.service.aclose()


class RemoteScorer:
    """Scores through the reward role's HTTP API (``POST {url}/v1/score``: one sample a call, or one
    task's samples a call with :meth:`score_group`)."""

    def __init__(self, url: str, timeout_s: float = 120.0, token: str | None = None,
                 retry: RetryPolicy | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.retry = retry or RetryPolicy(max_attempts=12, deadline_s=timeout_s, attempt_timeout_s=timeout_s)
        self.retries = 0  # attempts repeated, over the scorer's life
        self._rng = random.Random()
        # the job's token (``token``, else $RFT_JOB_TOKEN)
        self._http = LazySession([self.url], auth.client_headers(token), total_s=timeout_s)

    async def __call__(self, sample: Any, task: Any) -> Any:
        return (await self._post([sample], task, group=False))[0]

    async def score_group(self, samples: list[Any], task: Any) -> list[Any]:
        """The samples of one task in one request (``"group": true``): the reward pod scores them
        together, so groupwise evaluators see the whole group."""
        return await self._post(samples, task, group=True)

    async def _post(self, samples: list[Any], task: Any, *, group: bool) -> list[ScoreResult]:
        t0 = time.perf_counter()
        item = _task_dict(task)
        body: dict[str, Any] = {"samples": [{"id": s.id, "sample": s.to_wire(), "item": item}
                                            for s in map(Sample.from_any, samples)]}
        if group:
            body["group"] = True
        raw = await self._send(json.dumps(body).encode())
        results = json.loads(raw)["results"]
        if len(results) != len(samples):
            raise RuntimeError(f"reward service {self.url}: {len(results)} results for {len(samples)} samples")
        out = []
        for r in results:
            metrics = {k: float(v) for k, v in (r.get("metrics") or {}).items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)}
            metrics["time/reward"] = time.perf_counter() - t0
            out.append(ScoreResult(r.get("reward"), r.get("reason") or "", metrics, r.get("error")))
        return out

    async def _send(self, data: bytes) -> bytes:
        """The answer's body to one POST of ``data``, retried as the module docstring says; raises
        ``RuntimeError`` naming the reward service and the last failure once the deadline is spent or
        the answer is final (HTTP 4xx but 425 and 429)."""
        deadline = time.monotonic() + self.retry.deadline_s
        attempt, last = 0, "no attempt made"
        while True:
            attempt += 1
            retry_after = None
            try:
                timeout = session_timeout(max(0.001, min(deadline - time.monotonic(), self.retry.attempt_timeout_s)))
                async with self._http.get().post(self.url + "/v1/score", data=data, timeout=timeout,
                                                 headers={"content-type": "application/json"}) as resp:
                    status, headers, raw = resp.status, resp.headers, await resp.read()
                if status == 200:
                    return raw
                last = f"HTTP {status}: {raw[:300].decode('utf-8', 'replace')}"
                if not is_retryable_status(status):
                    break
                retry_after = parse_retry_after(headers.get("retry-after"))
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as e:
                last = f"{type(e).__name__}: {e}"
            delay = self.retry.backoff(attempt, self._rng, retry_after)
            if attempt >= self.retry.max_attempts or time.monotonic() + delay >= deadline:
                break
            self.retries += 1
            log.info("reward service %s: retrying in %.2fs (attempt %d): %s", self.url, delay, attempt, last)
            await asyncio.sleep(delay)
        raise RuntimeError(f"reward service {self.url}: {last} (after {attempt} attempt(s))")

    async def aclose(self) -> None:
        await self._http.aclose()
