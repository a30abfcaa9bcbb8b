"""Advantage estimators: hand-computed values, a plain-loop reference, None handling, errors."""

from __future__ import annotations

import math
import random

import pytest
import torch

from rft_runtime.algos import (
    ADVANTAGE_ESTIMATORS,
    AdvantageConfig,
    compute_advantages,
    group_key,
    rewards_tensor,
)

NAN = float("nan")
S3 = math.sqrt(3.0)


def _compute(name: str, rewards: torch.Tensor, groups: list[str], **kw):  # type: ignore[no-untyped-def]
    """compute_advantages; REINFORCE++-baseline whitens per sequence here unless a test says otherwise
    (its token-level default is tested on its own below)."""
    if name == "reinforce_pp_baseline" and "cfg" not in kw:
        kw["cfg"] = AdvantageConfig(whiten="sequence")
    return compute_advantages(name, rewards, groups, **kw)


def _adv(name: str, rewards: list[float | None], groups: list[str], **kw):  # type: ignore[no-untyped-def]
    out = _compute(name, rewards_tensor(rewards, torch.float64), groups, **kw)
    return out.advantages.tolist(), out.valid.tolist()


def test_group_key() -> None:
    assert group_key("task-7", "solver") == "task-7:solver"


def test_grpo_hand_values() -> None:
    adv, valid = _adv("grpo", [1.0, 0.0, 1.0, None], ["a"] * 4)
    # valid rewards 1,0,1: mean 2/3, Bessel std sqrt(1/3)
    std = 1.0 / S3
    assert adv == pytest.approx([(1 / 3) / (std + 1e-6), (-2 / 3) / (std + 1e-6), (1 / 3) / (std + 1e-6), 0.0], abs=1e-12)
    assert adv[0] == pytest.approx(1 / S3, abs=1e-5) and adv[1] == pytest.approx(-2 / S3, abs=1e-5)
    assert valid == [True, True, True, False]


def test_grpo_epsilon_is_documented_value_and_configurable() -> None:
    # two rewards 0 and 2e-3: std = sqrt(2) * 1e-3
    r = [0.0, 2e-3]
    std = math.sqrt(2) * 1e-3
    adv, _ = _adv("grpo", r, ["g", "g"])
    assert adv[1] == pytest.approx(1e-3 / (std + 1e-6), rel=1e-12)
    adv_trl, _ = _adv("grpo", r, ["g", "g"], cfg=AdvantageConfig(std_eps=1e-4))
    assert adv_trl[1] == pytest.approx(1e-3 / (std + 1e-4), rel=1e-12)
    assert adv_trl[1] < adv[1] - 0.04  # the verl/TRL difference is not negligible here
    with pytest.raises(ValueError, match="std_eps"):
        AdvantageConfig(std_eps=-1.0)


def test_dr_grpo_hand_values() -> None:
    adv, valid = _adv("dr_grpo", [1.0, 0.0, 1.0, None], ["a"] * 4)
    assert adv == pytest.approx([1 / 3, -2 / 3, 1 / 3, 0.0], abs=1e-12)
    assert valid == [True, True, True, False]


def test_rloo_hand_values() -> None:
    adv, _ = _adv("rloo", [1.0, 0.0, 1.0, None], ["a"] * 4)
    # r=1: baseline (0+1)/2; r=0: baseline (1+1)/2
    assert adv == pytest.approx([0.5, -1.0, 0.5, 0.0], abs=1e-12)


def test_reinforce_pp_baseline_hand_values() -> None:
    adv, _ = _adv("reinforce_pp_baseline", [1.0, 0.0, 1.0, 2.0, 4.0], ["a", "a", "a", "b", "b"])
    # centred: a -> 1/3, -2/3, 1/3 ; b -> -1, 1 ; batch mean 0, Bessel var (6/9 + 2)/4 = 2/3
    s = math.sqrt(2 / 3 + 1e-8)
    assert adv == pytest.approx([1 / 3 / s, -2 / 3 / s, 1 / 3 / s, -1 / s, 1 / s], abs=1e-12)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
def test_singleton_groups_get_zero(name: str) -> None:
    # group b has one member, group c has one valid member (the other is None)
    adv, valid = _adv(name, [1.0, 0.0, 5.0, 3.0, None], ["a", "a", "b", "c", "c"])
    assert adv[2] == 0.0 and adv[3] == 0.0 and adv[4] == 0.0
    assert valid == [True, True, True, True, False]
    assert adv[0] > 0 > adv[1]


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"])
def test_none_rewards_excluded_from_baseline(name: str) -> None:
    with_none, valid = _adv(name, [1.0, None, 0.0, 0.5, None], ["a"] * 5)
    without, _ = _adv(name, [1.0, 0.0, 0.5], ["a", "a", "a"])
    assert [with_none[0], with_none[2], with_none[3]] == pytest.approx(without, abs=1e-12)
    assert with_none[1] == 0.0 and with_none[4] == 0.0
    assert valid == [True, False, True, True, False]
    # the external valid mask behaves like a None reward, whatever the masked reward's value
    masked = _compute(
        name, torch.tensor([1.0, 123.0, 0.0, 0.5], dtype=torch.float64), ["a"] * 4,
        valid=torch.tensor([True, False, True, True]),
    )
    assert [masked.advantages[i].item() for i in (0, 2, 3)] == pytest.approx(without, abs=1e-12)
    assert masked.advantages[1].item() == 0.0 and not masked.valid[1]


def test_all_equal_group_and_dtype() -> None:
    out = compute_advantages("grpo", torch.tensor([1.0, 1.0, 1.0]), ["a"] * 3)
    assert out.advantages.dtype == torch.float32
    assert out.advantages.tolist() == [0.0, 0.0, 0.0]


def test_errors() -> None:
    with pytest.raises(ValueError, match="group_ids"):
        compute_advantages("grpo", torch.tensor([1.0, 0.0]), ["a"])
    with pytest.raises(ValueError, match="finite"):
        compute_advantages("grpo", torch.tensor([1.0, math.inf]), ["a", "a"])
    with pytest.raises(ValueError, match="1-D"):
        compute_advantages("grpo", torch.zeros(2, 2), ["a", "a"])
    with pytest.raises(ValueError, match="float"):
        compute_advantages("grpo", torch.tensor([1, 0]), ["a", "a"])
    with pytest.raises(ValueError, match="valid"):
        compute_advantages("grpo", torch.tensor([1.0, 0.0]), ["a", "a"], valid=torch.tensor([True]))


# ---- reference implementation: plain Python loops -------------------------------------------


def _ref(name: str, rewards: list[float | None], groups: list[str], eps: float = 1e-6, weps: float = 1e-8) -> list[float]:
    members: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        if rewards[i] is not None:
            members.setdefault(g, []).append(i)
    out = [0.0] * len(rewards)
    centred: dict[int, float] = {}
    for idx in members.values():
        n = len(idx)
        if n < 2:
            continue
        vals = [rewards[i] for i in idx]
        mean = sum(vals) / n
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
        for i in idx:
            r = rewards[i]
            if name == "grpo":
                out[i] = (r - mean) / (std + eps)
            elif name == "dr_grpo":
                out[i] = r - mean
            elif name == "rloo":
                out[i] = r - (sum(vals) - r) / (n - 1)
            else:
                centred[i] = r - mean
    if name == "reinforce_pp_baseline" and len(centred) >= 2:
        xs = list(centred.values())
        mu = sum(xs) / len(xs)
        var = sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)
        for i, x in centred.items():
            out[i] = (x - mu) / math.sqrt(var + weps)
    return out


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS.names()))
def test_vectorised_matches_reference_loop(name: str) -> None:
    for seed in range(60):
        rng = random.Random(seed)
        n = rng.randint(1, 24)
        n_groups = rng.randint(1, 6)
        groups = [f"task{rng.randrange(n_groups)}:main" for _ in range(n)]
        rewards: list[float | None] = []
        for _ in range(n):
            u = rng.random()
            rewards.append(None if u < 0.15 else float(rng.randint(0, 1)) if u < 0.5 else rng.gauss(0, 2))
        got, valid = _adv(name, rewards, groups)
        assert got == pytest.approx(_ref(name, rewards, groups), abs=1e-9), f"seed {seed}"
        assert valid == [r is not None for r in rewards]


# ---- REINFORCE++-baseline's token-level whitening (the peers' default) ----------------------


def _verl_token_whitening(rewards: list[float | None], groups: list[str], lengths: list[int],
                          eps: float = 1e-8) -> list[float]:
    """The peers' definition, written out: the group-centred score broadcast to every response token,
    then whitened over all tokens of groups with >= 2 valid members (mean and unbiased variance over
    tokens, verl's ``masked_whiten``); every token of a sequence gets the same value."""
    members: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        if rewards[i] is not None:
            members.setdefault(g, []).append(i)
    tokens: list[tuple[int, float]] = []  # (sequence, centred score) per token
    for idx in members.values():
        if len(idx) < 2:
            continue
        mean = sum(rewards[i] for i in idx) / len(idx)  # type: ignore[misc]
        for i in idx:
            tokens += [(i, rewards[i] - mean)] * lengths[i]  # type: ignore[operator]
    out = [0.0] * len(rewards)
    if len(tokens) < 2:
        return out
    mu = sum(x for _, x in tokens) / len(tokens)
    var = sum((x - mu) ** 2 for _, x in tokens) / (len(tokens) - 1)
    for i, x in tokens:
        out[i] = (x - mu) / math.sqrt(var + eps)
    return out


def test_reinforce_pp_token_whitening_is_the_default_and_matches_the_peers_in_float64() -> None:
    for seed in range(40):
        rng = random.Random(1000 + seed)
        n = rng.randint(2, 20)
        groups = [f"t{rng.randrange(4)}:main" for _ in range(n)]
        rewards = [None if rng.random() < 0.1 else rng.gauss(0, 1) for _ in range(n)]
        lengths = [rng.randint(1, 40) for _ in range(n)]
        out = compute_advantages("reinforce_pp_baseline", rewards_tensor(rewards, torch.float64), groups,
                                 token_counts=torch.tensor(lengths, dtype=torch.float64))
        assert out.advantages.tolist() == pytest.approx(_verl_token_whitening(rewards, groups, lengths), abs=1e-12)


def test_token_and_sequence_whitening_differ_only_by_length_weighting() -> None:
    r, g = [1.0, 0.0, 1.0, 0.0], ["a", "a", "b", "b"]
    same = torch.tensor([5.0, 5.0, 5.0, 5.0], dtype=torch.float64)
    by_token = compute_advantages("reinforce_pp_baseline", rewards_tensor(r, torch.float64), g, token_counts=same)
    by_seq = compute_advantages("reinforce_pp_baseline", rewards_tensor(r, torch.float64), g,
                                cfg=AdvantageConfig(whiten="sequence"))
    # equal lengths: the same mean; Σx² = 1 gives variance 5/19 over 20 tokens and 1/3 over 4 sequences
    assert torch.allclose(by_token.advantages * math.sqrt(5 / 19), by_seq.advantages * math.sqrt(1 / 3))
    long_first = torch.tensor([50.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    weighted = compute_advantages("reinforce_pp_baseline", rewards_tensor(r, torch.float64), g,
                                  token_counts=long_first)
    assert not torch.allclose(weighted.advantages, by_token.advantages)
    with pytest.raises(ValueError, match="token_counts"):
        compute_advantages("reinforce_pp_baseline", rewards_tensor(r, torch.float64), g)
    with pytest.raises(ValueError, match="whiten"):
        AdvantageConfig(whiten="word")
