"""Retry policy for inference requests: which failures are retried and how long to wait."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with jitter, a bounded number of attempts and a deadline.

    Attempt k (1-based) that fails with a retryable error waits
    `min(max_backoff_s, initial_backoff_s * multiplier**(k-1)) * (1 - jitter * U[0,1))`, or the
    server's `Retry-After` when that is longer (still capped by `max_backoff_s`). The whole request,
    all attempts and waits included, must finish within `deadline_s`; one attempt within
    `attempt_timeout_s`.
    """

    max_attempts: int = 6
    initial_backoff_s: float = 0.25
    max_backoff_s: float = 8.0
    multiplier: float = 2.0
    jitter: float = 0.5
    deadline_s: float = 600.0
    attempt_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"retry.max_attempts must be >= 1, got {self.max_attempts}")
        if self.initial_backoff_s < 0 or self.max_backoff_s < self.initial_backoff_s:
            raise ValueError("retry: need 0 <= initial_backoff_s <= max_backoff_s")
        if self.multiplier < 1:
            raise ValueError(f"retry.multiplier must be >= 1, got {self.multiplier}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"retry.jitter must be in [0, 1], got {self.jitter}")
        if self.deadline_s <= 0 or self.attempt_timeout_s <= 0:
            raise ValueError("retry: deadline_s and attempt_timeout_s must be > 0")

    def backoff(self, attempt: int, rng: random.Random, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        base = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (attempt - 1))
        delay = base * (1.0 - self.jitter * rng.random())
        if retry_after is not None and retry_after > delay:
            delay = min(retry_after, self.max_backoff_s)
        return delay


def is_retryable_status(status: int) -> bool:
    """425 Too Early, 429 Too Many Requests and every 5xx are retried; other statuses are not."""
    return status in (425, 429) or 500 <= status <= 599


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a `Retry-After` header given in seconds; None when absent or not a number."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None
