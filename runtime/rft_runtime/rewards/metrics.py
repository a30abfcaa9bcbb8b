"""Prometheus metrics of the reward service (one registry per service, so tests can run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from rft_api.telemetry import job_registry

from .types import ERROR_KINDS, ScoreResult

__all__ = ["RewardMetrics"]


class RewardMetrics:
    """``rft_reward_samples_total``, ``rft_reward_errors_total{kind,evaluator}``,
    ``rft_reward_not_applicable_total``, ``rft_reward_score_seconds`` (latency per sample) and
    ``rft_reward_value`` (distribution of combined rewards)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or job_registry("reward")
        self.samples = Counter("rft_reward_samples", "Samples scored", registry=self.registry)
        self.errors = Counter("rft_reward_errors", "Samples with an error flag, by kind and evaluator",
                              ["kind", "evaluator"], registry=self.registry)
        self.not_applicable = Counter("rft_reward_not_applicable", "Samples whose combined reward is None",
                                      registry=self.registry)
        self.latency = Histogram("rft_reward_score_seconds", "Time to score one sample",
                                 buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
                                 registry=self.registry)
        self.value = Histogram("rft_reward_value", "Combined reward per sample",
                               buckets=(-1, -0.5, 0, 0.1, 0.25, 0.5, 0.75, 0.9, 1, 2, 5, 10), registry=self.registry)
        for kind in ERROR_KINDS:  # expose zeros from the start
            self.errors.labels(kind=kind, evaluator="any")

    def observe(self, result: ScoreResult, seconds: float) -> None:
        """Records one scored sample (``evaluator/error_<kind>`` metrics name the failing evaluators)."""
        self.samples.inc()
        self.latency.observe(seconds)
        if result.reward is None:
            self.not_applicable.inc()
        else:
            self.value.observe(result.reward)
        if result.error is not None:
            self.errors.labels(kind=result.error, evaluator="any").inc()
        for key in result.metrics:
            name, sep, flag = key.rpartition("/error_")
            if sep and flag in ERROR_KINDS:
                self.errors.labels(kind=flag, evaluator=name).inc()

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
