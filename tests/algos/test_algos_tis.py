"""Truncated / masked importance sampling: hand values, reference loop, metrics, errors."""

from __future__ import annotations

import math
import random

import pytest
import torch

from rft_runtime.algos import tis_weights

D = torch.float64


def _w(old_ratios: list[list[float]], mask: list[list[int]], **kw):  # type: ignore[no-untyped-def]
    old = torch.log(torch.tensor(old_ratios, dtype=D))
    return tis_weights(old, torch.zeros_like(old), torch.tensor(mask, dtype=torch.bool), **kw)


def test_token_truncate_hand_values() -> None:
    w, m = _w([[1.0, 3.0, 0.5]], [[1, 1, 1]], level="token", mode="truncate", cap=2.0)
    assert w.tolist() == [[pytest.approx(1.0), pytest.approx(2.0), pytest.approx(0.5)]]
    assert m["fraction_truncated"].item() == pytest.approx(1 / 3) and m["fraction_masked"].item() == 0.0
    assert m["mismatch_kl_k1"].item() == pytest.approx(-(math.log(3.0) + math.log(0.5)) / 3)
    k3 = sum(r - 1 - math.log(r) for r in (1.0, 3.0, 0.5)) / 3
    assert m["mismatch_kl_k3"].item() == pytest.approx(k3)
    assert m["ratio_max"].item() == pytest.approx(3.0)
    assert m["weight_mean"].item() == pytest.approx(3.5 / 3)
    assert not w.requires_grad


def test_token_mask_hand_values() -> None:
    w, m = _w([[1.0, 3.0, 0.5]], [[1, 1, 1]], mode="mask", cap=2.0)
    assert w.tolist() == [[pytest.approx(1.0), 0.0, pytest.approx(0.5)]]
    assert m["fraction_masked"].item() == pytest.approx(1 / 3)
    w, m = _w([[1.0, 3.0, 0.5]], [[1, 1, 1]], mode="mask", cap=2.0, lower=0.6)
    assert w.tolist() == [[pytest.approx(1.0), 0.0, 0.0]]
    assert m["fraction_masked"].item() == pytest.approx(2 / 3) and m["fraction_truncated"].item() == 0.0


def test_sequence_level_hand_values() -> None:
    ratios = [[2.0, 1.5], [0.5, 7.0]]  # seq ratios 3.0 and 0.5 (second token of seq 1 masked)
    mask = [[1, 1], [1, 0]]
    w, m = _w(ratios, mask, level="sequence", mode="truncate", cap=2.0)
    assert w.tolist() == [[pytest.approx(2.0), pytest.approx(2.0)], [pytest.approx(0.5), 0.0]]
    assert m["fraction_truncated"].item() == pytest.approx(0.5)
    assert m["ratio_max"].item() == pytest.approx(3.0) and m["ratio_mean"].item() == pytest.approx(1.75)
    w, m = _w(ratios, mask, level="sequence", mode="mask", cap=2.0)
    assert w.tolist() == [[0.0, 0.0], [pytest.approx(0.5), 0.0]]
    assert m["fraction_masked"].item() == pytest.approx(0.5)


def test_weights_multiply_the_loss_without_gradient() -> None:
    lp = torch.tensor([[-1.0, -2.0]], dtype=D, requires_grad=True)
    old = lp.detach() + torch.tensor([[0.5, -0.1]], dtype=D)
    w, _ = tis_weights(old, lp, torch.ones(1, 2))  # inference logprobs may even require grad
    assert not w.requires_grad
    (w * -lp).sum().backward()
    assert lp.grad is not None
    assert lp.grad.tolist() == [[pytest.approx(-min(math.exp(0.5), 2.0)), pytest.approx(-math.exp(-0.1))]]


def test_errors() -> None:
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="level"):
        tis_weights(z, z, z.bool(), level="episode")
    with pytest.raises(KeyError, match="known: mask, truncate"):
        tis_weights(z, z, z.bool(), mode="clip")
    with pytest.raises(ValueError, match="cap"):
        tis_weights(z, z, z.bool(), cap=0.5)
    with pytest.raises(ValueError, match="lower"):
        tis_weights(z, z, z.bool(), mode="truncate", lower=0.5)
    with pytest.raises(ValueError, match="lower"):
        tis_weights(z, z, z.bool(), mode="mask", lower=1.5)
    with pytest.raises(ValueError, match="inference_logprobs"):
        tis_weights(z, torch.zeros(2, 4), z.bool())


def _ref(old, inf, mask, level, mode, cap):  # type: ignore[no-untyped-def]
    B, T = len(old), len(old[0])
    w = [[0.0] * T for _ in range(B)]
    for i in range(B):
        if level == "sequence":
            R = math.exp(max(min(sum(old[i][t] - inf[i][t] for t in range(T) if mask[i][t]), 20), -20))
        for t in range(T):
            if not mask[i][t]:
                continue
            r = R if level == "sequence" else math.exp(old[i][t] - inf[i][t])
            w[i][t] = min(r, cap) if mode == "truncate" else (r if r <= cap else 0.0)
    return w


def test_vectorised_matches_reference_loop() -> None:
    for seed in range(60):
        rng = random.Random(seed)
        B, T = rng.randint(1, 5), rng.randint(1, 8)
        inf = [[rng.uniform(-5, -0.05) for _ in range(T)] for _ in range(B)]
        old = [[x + rng.gauss(0, 0.5) for x in row] for row in inf]
        mask = [[rng.random() > 0.3 for _ in range(T)] for _ in range(B)]
        level, mode, cap = rng.choice(["token", "sequence"]), rng.choice(["truncate", "mask"]), rng.choice([1.0, 1.5, 2.0, 5.0])
        w, m = tis_weights(torch.tensor(old, dtype=D), torch.tensor(inf, dtype=D), torch.tensor(mask), level, mode, cap)
        expect = _ref(old, inf, mask, level, mode, cap)
        torch.testing.assert_close(w, torch.tensor(expect, dtype=D), atol=1e-10, rtol=1e-10)
        assert 0.0 <= m["fraction_affected"].item() <= 1.0
