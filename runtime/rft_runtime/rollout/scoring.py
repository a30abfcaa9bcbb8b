"""Scoring for the rollout role: in process (the rewards registry) or through the reward role.

Both backends are :class:`~rft_runtime.rollout.RolloutWorker` scorers: ``score(sample, task)``
returning a :class:`~rft_runtime.rewards.types.ScoreResult`, which the worker applies to the
episode (reward, reason, error flags, metrics — the composite puts each evaluator's own reward in
``metrics[<evaluator name>]``). Both add ``time/reward`` (seconds spent scoring) to the metrics.
"""

from __future__ import annotations

import json
import time
from typing import Any

from rft_api.runtime import RuntimeConfig

from .. import auth
from ..rewards.service import RewardService
from ..rewards.types import Item, Sample, ScoreResult
from ..timeouts import LazySession


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

    def __init__(self, url: str, timeout_s: float = 120.0, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
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
        async with self._http.get().post(self.url + "/v1/score", data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"}) as resp:
            status, raw = resp.status, await resp.read()
        if status != 200:
            raise RuntimeError(f"reward service {self.url}: HTTP {status}: {raw[:300].decode('utf-8', 'replace')}")
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

    async def aclose(self) -> None:
        await self._http.aclose()
