"""Several evaluators combined by weight, each under a per-sample timeout.

Combined reward = Σ wᵢ·rᵢ / Σ wᵢ over the evaluators whose reward rᵢ is not None (None when all are
None, or when only weight-0 evaluators applied: weight 0 means "logged, not rewarded"). An evaluator
with ``domains`` is not called for a task of another domain (ROLL's per-domain reward routing).

Errors. When an evaluator *raises* (an exception, an ``EvaluatorError``) or overruns its timeout,
its result carries the error flag (``runtime_error``, the EvaluatorError's kind, ``timeout``) and its
reward follows ``on_error``: ``zero`` (default) → 0.0, so a sample whose scoring fails is never
better than a wrong one; ``exclude`` → None, so it drops out of the group baseline. A result the
evaluator *returns* with an error flag (e.g. math's parse_error with 0.0) is kept as returned: that
outcome is about the sample, not a failure of the evaluator.

Ranges. Each evaluator's rewards must lie in its ``rewardRange`` (default
:data:`~rft_api.constants.DEFAULT_REWARD_RANGE`); a reward outside it is refused like an evaluator
that raised (``runtime_error``, ``on_error``), and the result's ``reward_out_of_range`` metric counts
it: a custom evaluator returning 1e300 would otherwise overflow its group's advantages.

Timeouts: async evaluators are cancelled by ``asyncio.wait_for``; sync ones run in a thread pool and
are abandoned (a Python thread cannot be killed): the sample is reported as a timeout at once, the
thread finishes in the background. A groupwise evaluator (``grouped``: it scores the samples of one
task together, :meth:`CompositeEvaluator.score_group`) gets one timeout for the whole group.
Builtins that may run long (code_sandbox, the sympy part of math) enforce their own limits in child
processes, which are killed.
"""

from __future__ import annotations

import asyncio
import inspect
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from rft_api.constants import DEFAULT_REWARD_RANGE

from .types import EvaluatorError, Item, Sample, ScoreResult, normalise_result

__all__ = ["Slot", "CompositeEvaluator", "OnError"]

OnError = Literal["zero", "exclude"]


@dataclass
class Slot:
    """One evaluator in the composite."""

    name: str
    evaluator: Any
    weight: float = 1.0
    timeout_seconds: float = 30.0
    domains: frozenset[str] | None = None
    """The task domains it scores (``evaluators[].domains``); None: all."""
    reward_range: tuple[float, float] = DEFAULT_REWARD_RANGE
    """The rewards it may return (``evaluators[].rewardRange``): another is refused (:meth:`refuse`)."""

    def refuse(self, result: ScoreResult) -> str | None:
        """Why ``result``'s reward is refused (outside :attr:`reward_range`), or None."""
        lo, hi = self.reward_range
        if result.reward is None or lo <= result.reward <= hi:
            return None
        return f"{self.name}: reward {result.reward:g} is outside its rewardRange [{lo:g}, {hi:g}]"

    def applies(self, item: Item) -> bool:
        return self.domains is None or item.domain in self.domains


def _is_async(evaluator: Any) -> bool:
    if getattr(evaluator, "is_async", None) is not None:
        return bool(evaluator.is_async)
    return inspect.iscoroutinefunction(evaluator.score)


class CompositeEvaluator:
    """Scores a sample with every slot concurrently and combines the results."""

    def __init__(self, slots: list[Slot], on_error: OnError = "zero", sync_workers: int = 16) -> None:
        if not slots:
            raise ValueError("a composite needs at least one evaluator")
        names = [s.name for s in slots]
        if len(set(names)) != len(names):
            raise ValueError(f"evaluator names must be unique, got {names}")
        if on_error not in ("zero", "exclude"):
            raise ValueError(f"on_error must be 'zero' or 'exclude', got {on_error!r}")
        self.slots = slots
        self.on_error = on_error
        self._pool = ThreadPoolExecutor(max_workers=sync_workers, thread_name_prefix="rft-reward")

    @property
    def names(self) -> list[str]:
        """Evaluator names, in order."""
        return [s.name for s in self.slots]

    def _failed(self, kind: str, reason: str) -> ScoreResult:
        return ScoreResult(0.0 if self.on_error == "zero" else None, reason, error=kind)  # type: ignore[arg-type]

    async def _invoke(self, slot: Slot, sample: Sample, item: Item) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + slot.timeout_seconds
        if _is_async(slot.evaluator):
            return await asyncio.wait_for(slot.evaluator.score(sample, item), slot.timeout_seconds)
        future = loop.run_in_executor(self._pool, slot.evaluator.score, sample, item)
        value = await asyncio.wait_for(future, slot.timeout_seconds)
        if inspect.isawaitable(value):  # a sync wrapper that returned a coroutine
            value = await asyncio.wait_for(value, max(0.0, deadline - loop.time()))
        return value

    def _failure(self, slot: Slot, exc: BaseException) -> ScoreResult:
        if isinstance(exc, asyncio.TimeoutError):
            return self._failed("timeout", f"{slot.name}: no result within {slot.timeout_seconds:g}s")
        if isinstance(exc, EvaluatorError):
            return self._failed(exc.kind, str(exc))
        if isinstance(exc, ValueError):
            return self._failed("runtime_error", f"{slot.name}: invalid result: {exc}")
        return self._failed("runtime_error", f"{slot.name}: {type(exc).__name__}: {exc}")

    def _checked(self, slot: Slot, value: Any) -> ScoreResult:
        """An evaluator's returned ``value`` as a result; a reward out of the slot's range is refused
        (a runtime error, ``onError`` applies, ``reward_out_of_range`` counts it)."""
        result = normalise_result(value)
        why = slot.refuse(result)
        if why is None:
            return result
        failed = self._failed("runtime_error", why)
        failed.metrics["reward_out_of_range"] = 1.0
        return failed

    async def _call(self, slot: Slot, sample: Sample, item: Item) -> ScoreResult:
        try:
            return self._checked(slot, await self._invoke(slot, sample, item))
        except Exception as exc:  # noqa: BLE001 - the user's code may raise anything
            return self._failure(slot, exc)

    async def _call_group(self, slot: Slot, samples: list[Sample], item: Item) -> list[ScoreResult]:
        if not getattr(slot.evaluator, "grouped", False):
            return list(await asyncio.gather(*(self._call(slot, s, item) for s in samples)))
        try:  # one call for the whole group, under the evaluator's timeout
            values = await asyncio.wait_for(slot.evaluator.score_group(samples, item), slot.timeout_seconds)
            return [self._checked(slot, v) for v in values]
        except Exception as exc:  # noqa: BLE001 - the user's code may raise anything
            return [self._failure(slot, exc)] * len(samples)

    async def score_all(self, sample: Sample, item: Item) -> dict[str, ScoreResult]:
        """Each evaluator's own result, by name (only those whose ``domains`` include the task's)."""
        slots = [s for s in self.slots if s.applies(item)]
        results = await asyncio.gather(*(self._call(s, sample, item) for s in slots))
        return {s.name: r for s, r in zip(slots, results)}

    async def score_group(self, samples: list[Sample], item: Item) -> list[ScoreResult]:
        """The combined results for the samples of one task, in order. Groupwise evaluators (those
        with ``grouped`` true, e.g. an Eval Protocol groupwise test) see the whole group in one call,
        which ``timeoutSeconds`` bounds; the others score each sample as :meth:`score` does."""
        slots = [s for s in self.slots if s.applies(item)]
        per_slot = await asyncio.gather(*(self._call_group(s, samples, item) for s in slots))
        return [self.combine({slot.name: results[i] for slot, results in zip(slots, per_slot)})
                for i in range(len(samples))]

    def combine(self, results: dict[str, ScoreResult]) -> ScoreResult:
        """The weighted mean and merged metrics of per-evaluator results (an evaluator without a
        result, one whose ``domains`` leave the task out, does not take part)."""
        total_w = total = 0.0
        metrics: dict[str, float] = {}
        error = None
        reasons = []
        for slot in self.slots:
            res = results.get(slot.name)
            if res is None:
                continue
            if res.reward is not None:
                metrics[slot.name] = res.reward
                if slot.weight > 0:
                    total_w += slot.weight
                    total += slot.weight * res.reward
            for key, value in res.metrics.items():
                metrics[f"{slot.name}/{key}"] = value
            if res.error is not None:
                metrics[f"{slot.name}/error_{res.error}"] = 1.0
                error = error or res.error
            shown = "n/a" if res.reward is None else f"{res.reward:g}"
            reasons.append(f"[{slot.name}={shown}] {res.reason}" if len(self.slots) > 1 else res.reason)
        reward = total / total_w if total_w > 0 else None
        return ScoreResult(reward, "; ".join(r for r in reasons if r), metrics, error)

    async def score(self, sample: Sample, item: Item) -> ScoreResult:
        """The combined result for one sample."""
        return self.combine(await self.score_all(sample, item))

    async def aclose(self) -> None:
        """Closes evaluators that hold resources and stops the thread pool (without waiting for
        abandoned sync calls)."""
        for slot in self.slots:
            close = getattr(slot.evaluator, "aclose", None)
            if close is not None:
                await close()
        self._pool.shutdown(wait=False, cancel_futures=True)
