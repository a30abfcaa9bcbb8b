"""DAPO dynamic sampling (filter_groups, DynamicSampler) and overlong reward shaping."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from rft_runtime.algos import (
    DynamicSampler,
    apply_overlong_penalty,
    filter_groups,
    has_signal,
    overlong_penalty,
)


@dataclass
class Group:
    key: str
    rewards: list[float | None]


def test_has_signal() -> None:
    assert has_signal([1.0, 0.0])
    assert not has_signal([1.0, 1.0, 1.0])
    assert not has_signal([1.0, None, 1.0])  # None is not a different reward
    assert not has_signal([0.3, None])  # one valid reward: no spread
    assert not has_signal([float("nan"), 2.0])
    assert has_signal([0.0, None, 0.5])
    assert not has_signal([0.0, 0.05], tol=0.1)


def test_filter_groups_keeps_order_and_accepts_shapes() -> None:
    groups = [Group("a", [1, 0]), Group("b", [1, 1]), Group("c", [None, None]), Group("d", [0.2, 0.7, None])]
    kept, dropped = filter_groups(groups)
    assert [g.key for g in kept] == ["a", "d"] and [g.key for g in dropped] == ["b", "c"]
    # mappings and plain sequences of rewards
    k2, d2 = filter_groups([{"rewards": [0, 1]}, [1.0, 1.0]])
    assert k2 == [{"rewards": [0, 1]}] and d2 == [[1.0, 1.0]]
    # custom accessor
    k3, _ = filter_groups([("x", [0, 1]), ("y", [0, 0])], rewards_of=lambda g: g[1])
    assert k3 == [("x", [0, 1])]
    with pytest.raises(TypeError, match="rewards"):
        filter_groups([3])


def _round(prefix: str, n_signal: int, n_flat: int) -> list[Group]:
    return [Group(f"{prefix}s{i}", [0.0, 1.0]) for i in range(n_signal)] + [
        Group(f"{prefix}f{i}", [1.0, 1.0]) for i in range(n_flat)
    ]


def test_dynamic_sampler_refills_to_target() -> None:
    s: DynamicSampler[Group] = DynamicSampler(target_groups=4, max_rounds=2)
    assert s.groups_needed() == 4 and not s.done
    s.add_round(_round("r1", 2, 2))
    assert s.groups_needed() == 2 and s.state == "collecting"
    with pytest.raises(RuntimeError, match="still collecting"):
        s.result()
    s.add_round(_round("r2", 3, 1))
    assert s.done and s.state == "complete" and s.groups_needed() == 0
    r = s.result()
    assert r.complete and r.rounds == 2
    assert [g.key for g in r.groups] == ["r1s0", "r1s1", "r2s0", "r2s1"]
    assert [g.key for g in r.surplus] == ["r2s2"]
    assert len(r.dropped) == 3 and "4 groups" in r.message
    with pytest.raises(RuntimeError, match="complete"):
        s.add_round(_round("r3", 1, 0))


def test_dynamic_sampler_bound_returns_what_it_has() -> None:
    # max_rounds counts EXTRA rounds: 1 extra -> 2 rounds in all
    s: DynamicSampler[Group] = DynamicSampler(target_groups=5, max_rounds=1)
    s.add_round(_round("r1", 1, 3))
    assert not s.done and s.groups_needed() == 4
    s.add_round(_round("r2", 2, 2))
    assert s.state == "exhausted"
    r = s.result()
    assert not r.complete and len(r.groups) == 3 and r.rounds == 2 and len(r.dropped) == 5
    assert "max_rounds=1" in r.message and "3/5" in r.message
    # nothing is lost: every group is in exactly one list
    assert len(r.groups) + len(r.surplus) + len(r.dropped) == 8


def test_dynamic_sampler_validation() -> None:
    with pytest.raises(ValueError, match="target_groups"):
        DynamicSampler(target_groups=0, max_rounds=1)
    with pytest.raises(ValueError, match="max_rounds"):
        DynamicSampler(target_groups=1, max_rounds=-1)
    never_refill = DynamicSampler(target_groups=2, max_rounds=0)
    never_refill.add_round([])
    assert never_refill.state == "exhausted" and never_refill.result().groups == []


@pytest.mark.parametrize(
    ("length", "expected"),
    [(0, 0.0), (12, 0.0), (13, -0.25), (14, -0.5), (15, -0.75), (16, -1.0), (17, -1.0), (100, -1.0)],
)
def test_overlong_penalty_hand_values(length: int, expected: float) -> None:
    # max 16, buffer 4: free up to 12, linear -1/4 per token after, -1 beyond 16
    assert overlong_penalty(length, 16, 4) == pytest.approx(expected)
    assert overlong_penalty(length, 16, 4, penalty_factor=2.0) == pytest.approx(2 * expected)
    t = overlong_penalty(torch.tensor([length]), 16, 4, 2.0)
    assert t.item() == pytest.approx(2 * expected)


def test_overlong_penalty_matches_formula_everywhere() -> None:
    lens = torch.arange(0, 40)
    got = overlong_penalty(lens, 32, 8, 0.5)
    for n in range(40):
        ref = 0.0 if n <= 24 else (-1.0 if n > 32 else (24 - n) / 8)
        assert got[n].item() == pytest.approx(0.5 * ref)
        assert overlong_penalty(n, 32, 8, 0.5) == pytest.approx(0.5 * ref)


def test_apply_overlong_penalty_keeps_none() -> None:
    rewards = torch.tensor([1.0, float("nan"), 0.0])
    out = apply_overlong_penalty(rewards, torch.tensor([14, 16, 5]), 16, 4)
    assert out[0].item() == pytest.approx(0.5) and math.isnan(out[1].item()) and out[2].item() == 0.0
    with pytest.raises(ValueError, match="response_len"):
        apply_overlong_penalty(rewards, torch.tensor([1, 2]), 16, 4)


def test_overlong_validation() -> None:
    with pytest.raises(ValueError, match=r"buffer_len \(16\) must be < max_tokens \(16\)"):
        overlong_penalty(3, 16, 16)
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty(3, 16, 0)
    with pytest.raises(ValueError, match="max_tokens"):
        overlong_penalty(3, 0, 1)
    with pytest.raises(ValueError, match="penalty_factor"):
        overlong_penalty(3, 16, 4, -1.0)
    with pytest.raises(ValueError, match="response_len"):
        overlong_penalty(-1, 16, 4)
