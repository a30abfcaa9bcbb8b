"""DAPO dynamic sampling (Yu et al. 2025, §3.2): keep only groups that carry a learning signal.

A group (the n samples of one prompt) whose valid rewards are all equal has group-relative
advantages of 0 everywhere: it costs compute and adds nothing but noise to the normaliser. DAPO
over-samples and keeps groups with ``0 < #correct < G``; generalised here to "at least two valid
(non-None) rewards whose spread exceeds ``tol``" (std > 0 for ``tol = 0``).

A group is anything :func:`rewards_of` can read rewards from: an object with a ``rewards``
attribute (a sequence, or a method returning one), a mapping with a ``"rewards"`` key, or a plain
sequence of ``float | None``. Pass ``rewards_of=`` to read other shapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, NamedTuple, TypeVar

G = TypeVar("G")
RewardsOf = Callable[[G], Sequence[float | None]]


def rewards_of(group: object) -> Sequence[float | None]:
    """Read the per-sample rewards of a group (see the module docstring for accepted shapes)."""
    if isinstance(group, Mapping):
        if "rewards" not in group:
            raise TypeError("a group mapping needs a 'rewards' key")
        return group["rewards"]
    r = getattr(group, "rewards", None)
    if r is not None:
        return r() if callable(r) else r
    if isinstance(group, Sequence) and not isinstance(group, (str, bytes)):
        return group
    raise TypeError(f"cannot read rewards from a {type(group).__name__}; pass rewards_of=")


def _valid(rewards: Iterable[float | None]) -> list[float]:
    return [float(r) for r in rewards if r is not None and not math.isnan(float(r))]


def has_signal(rewards: Iterable[float | None], tol: float = 0.0) -> bool:
    """True when at least two rewards are valid and ``max - min > tol`` among them."""
    v = _valid(rewards)
    return len(v) >= 2 and max(v) - min(v) > tol


class FilterResult(NamedTuple, Generic[G]):
    """Groups kept (with signal) and dropped (without), each in input order."""

    kept: list[G]
    dropped: list[G]


def filter_groups(
    groups: Iterable[G], rewards_of: RewardsOf[G] = rewards_of, tol: float = 0.0
) -> FilterResult[G]:
    """Split ``groups`` into those with a learning signal and those without (pure function)."""
    kept: list[G] = []
    dropped: list[G] = []
    for g in groups:
        (kept if has_signal(rewards_of(g), tol) else dropped).append(g)
    return FilterResult(kept, dropped)


State = Literal["collecting", "complete", "exhausted"]


@dataclass
class SamplingResult(Generic[G]):
    """What a :class:`DynamicSampler` collected.

    Attributes:
        groups: the groups to train on (at most ``target_groups``, in arrival order).
        surplus: kept groups beyond the target (valid data the caller may reuse or log).
        dropped: groups filtered out for lack of signal (still count for reward metrics).
        rounds: generation rounds used (the first included).
        complete: True when ``groups`` reached the target; False when ``max_rounds`` was hit first.
        message: a human-readable summary (says when the target was not reached).
    """

    groups: list[G]
    surplus: list[G]
    dropped: list[G]
    rounds: int
    complete: bool
    message: str


@dataclass
class DynamicSampler(Generic[G]):
    """Collects groups over generation rounds until ``target_groups`` have signal.

    ``max_rounds`` bounds the EXTRA generation rounds after the first (the API's
    ``trainer.dynamicSampling.maxRounds``): at most ``1 + max_rounds`` rounds in all;
    ``max_rounds=0`` means "filter, never refill". Usage::

        sampler = DynamicSampler(target_groups=8, max_rounds=2)
        while not sampler.done:
            sampler.add_round(generate(sampler.groups_needed()))
        result = sampler.result()  # result.complete is False if the bound was hit

    States: ``collecting`` → ``complete`` (target reached) or ``exhausted`` (bound hit); both are
    terminal and :meth:`add_round` then raises.
    """

    target_groups: int
    max_rounds: int
    rewards_of: RewardsOf[G] = rewards_of
    tol: float = 0.0
    rounds: int = 0
    state: State = "collecting"
    _kept: list[G] = field(default_factory=list, repr=False)
    _dropped: list[G] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.target_groups, int) or self.target_groups < 1:
            raise ValueError(f"target_groups must be an int >= 1, got {self.target_groups!r}")
        if not isinstance(self.max_rounds, int) or self.max_rounds < 0:
            raise ValueError(f"max_rounds must be an int >= 0, got {self.max_rounds!r}")
        if not self.tol >= 0:
            raise ValueError(f"tol must be >= 0, got {self.tol}")

    @property
    def done(self) -> bool:
        """True once the sampler is complete or exhausted."""
        return self.state != "collecting"

    def groups_needed(self) -> int:
        """Groups still missing to reach the target (0 when done)."""
        return 0 if self.done else max(self.target_groups - len(self._kept), 0)

    def add_round(self, groups: Iterable[G]) -> FilterResult[G]:
        """Add one generation round's groups; returns how this round was split."""
        if self.done:
            raise RuntimeError(f"DynamicSampler is {self.state}; no more rounds are accepted")
        split = filter_groups(groups, self.rewards_of, self.tol)
        self.rounds += 1
        self._kept.extend(split.kept)
        self._dropped.extend(split.dropped)
        if len(self._kept) >= self.target_groups:
            self.state = "complete"
        elif self.rounds >= 1 + self.max_rounds:
            self.state = "exhausted"
        return split

    def result(self) -> SamplingResult[G]:
        """The collected groups; only once :attr:`done`."""
        if not self.done:
            raise RuntimeError(
                f"DynamicSampler still collecting ({len(self._kept)}/{self.target_groups} groups "
                f"after {self.rounds} of at most {1 + self.max_rounds} rounds)"
            )
        groups = self._kept[: self.target_groups]
        surplus = self._kept[self.target_groups :]
        complete = self.state == "complete"
        if complete:
            msg = (
                f"{len(groups)} groups with signal after {self.rounds} round(s); "
                f"{len(self._dropped)} dropped, {len(surplus)} surplus"
            )
        else:
            msg = (
                f"max_rounds={self.max_rounds} extra round(s) used up with {len(groups)}/{self.target_groups} "
                f"groups with signal; training on what there is ({len(self._dropped)} dropped)"
            )
        return SamplingResult(list(groups), list(surplus), list(self._dropped), self.rounds, complete, msg)
