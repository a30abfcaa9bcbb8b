"""RewardService: scores batches with bounded concurrency and records metrics."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Iterable, Mapping

from rft_api.runtime import RuntimeConfig
from rft_api.spec import EvaluatorSpec

from .composite import CompositeEvaluator
from .config import RewardConfig, from_runtime_config, from_spec
from .factory import build_composite
from .metrics import RewardMetrics
from .types import Item, Sample, ScoreResult

__all__ = ["RewardService"]


class RewardService:
    """Scores samples with a CompositeEvaluator, at most ``concurrency`` samples at once."""

    def __init__(self, evaluator: CompositeEvaluator, concurrency: int = 16, metrics: RewardMetrics | None = None) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.evaluator = evaluator
        self.concurrency = concurrency
        self.metrics = metrics or RewardMetrics()
        self._sem: asyncio.Semaphore | None = None

    @classmethod
    def from_config(cls, config: RewardConfig | RuntimeConfig | EvaluatorSpec | Mapping[str, Any],
                    concurrency: int | None = None) -> "RewardService":
        """From a RewardConfig, a job's runtime config, or ``spec.evaluator`` (the model or its dict)."""
        if isinstance(config, RuntimeConfig):
            config = from_runtime_config(config)
        elif not isinstance(config, RewardConfig):
            config = from_spec(config, concurrency=concurrency or 16)
        return cls(build_composite(config), concurrency=concurrency or config.concurrency)

    async def score(self, sample: Sample | Mapping[str, Any], item: Item | Mapping[str, Any] | None) -> ScoreResult:
        """Scores one sample (waits for a concurrency slot): a group of one."""
        return (await self.score_group([sample], item))[0]

    async def score_group(self, samples: list[Sample | Mapping[str, Any]],
                          item: Item | Mapping[str, Any] | None) -> list[ScoreResult]:
        """Scores the samples of one task together (groupwise evaluators see them in one call); one
        concurrency slot for the group."""
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.concurrency)
        group, i = [Sample.from_any(s) for s in samples], Item.from_any(item)
        async with self._sem:
            started = time.perf_counter()
            results = await self.evaluator.score_group(group, i)
            elapsed = time.perf_counter() - started
        for r in results:
            self.metrics.observe(r, elapsed / max(1, len(results)))
        return results

    async def score_batch(self, samples_with_items: Iterable[tuple[Any, Any]]) -> list[ScoreResult]:
        """One ScoreResult per (sample, item), in order; samples are converted with
        ``Sample.from_any`` / ``Item.from_any`` (ValueError names a bad field)."""
        pairs = [(Sample.from_any(s), Item.from_any(i)) for s, i in samples_with_items]
        return list(await asyncio.gather(*(self.score(s, i) for s, i in pairs)))

    async def aclose(self) -> None:
        """Releases the evaluators' resources."""
        await self.evaluator.aclose()
