"""KL estimators: hand values, exact expectations over a small vocabulary, loss/reward helpers."""

from __future__ import annotations

import math
import random

import pytest
import torch

from rft_runtime.algos import KL_ESTIMATORS, apply_kl_to_rewards, kl_in_loss, kl_reward_penalty

D = torch.float64
L2 = math.log(2.0)


def _kl(name: str, lp: float, ref: float) -> float:
    return KL_ESTIMATORS[name](torch.tensor([[lp]], dtype=D), torch.tensor([[ref]], dtype=D)).item()


def test_hand_values() -> None:
    lp, ref = math.log(0.5), math.log(0.25)  # log rho = -log 2
    assert _kl("k1", lp, ref) == pytest.approx(L2)
    assert _kl("k2", lp, ref) == pytest.approx(0.5 * L2 * L2)
    assert _kl("k3", lp, ref) == pytest.approx(0.5 - 1 + L2)
    for name in ("k1", "k2", "k3"):
        assert _kl(name, -1.3, -1.3) == 0.0
    assert _kl("k3", 0.0, 5.0) == 10.0  # clamped (unclamped: e^5 - 6 = 142.4)
    assert _kl("k1", -0.2, -1.0) == pytest.approx(0.8)


def test_reference_loop_random() -> None:
    for seed in range(30):
        rng = random.Random(seed)
        lp = [[rng.uniform(-6, 0) for _ in range(5)] for _ in range(3)]
        ref = [[rng.uniform(-6, 0) for _ in range(5)] for _ in range(3)]
        lt, rt = torch.tensor(lp, dtype=D), torch.tensor(ref, dtype=D)
        for i in range(3):
            for t in range(5):
                lr = ref[i][t] - lp[i][t]
                assert KL_ESTIMATORS["k1"](lt, rt)[i, t].item() == pytest.approx(-lr, abs=1e-12)
                assert KL_ESTIMATORS["k2"](lt, rt)[i, t].item() == pytest.approx(0.5 * lr * lr, abs=1e-12)
                assert KL_ESTIMATORS["k3"](lt, rt)[i, t].item() == pytest.approx(min(math.exp(lr) - 1 - lr, 10.0), abs=1e-12)


def test_k1_k3_unbiased_exact_expectation() -> None:
    """Summing π(y)·k(y) over the whole vocabulary gives KL(π‖ref) exactly for k1 and k3."""
    for seed in range(10):
        g = torch.Generator().manual_seed(seed)
        logp = torch.log_softmax(torch.randn(7, generator=g, dtype=D), -1)
        logr = torch.log_softmax(torch.randn(7, generator=g, dtype=D), -1)
        kl = (logp.exp() * (logp - logr)).sum()
        for name in ("k1", "k3"):
            est = KL_ESTIMATORS[name](logp[None], logr[None])[0]
            assert (logp.exp() * est).sum().item() == pytest.approx(kl.item(), abs=1e-12)
        assert (KL_ESTIMATORS["k3"](logp[None], logr[None]) >= 0).all()
        assert (KL_ESTIMATORS["k2"](logp[None], logr[None]) >= 0).all()


def test_k2_gradient_matches_kl_gradient_in_expectation() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, generator=g, dtype=D, requires_grad=True)
    logr = torch.log_softmax(torch.randn(6, generator=g, dtype=D), -1)
    logp = torch.log_softmax(logits, -1)
    (g_true,) = torch.autograd.grad((logp.exp() * (logp - logr)).sum(), logits, retain_graph=True)
    surrogate = (logp.exp().detach() * KL_ESTIMATORS["k2"](logp[None], logr[None])[0]).sum()
    (g_k2,) = torch.autograd.grad(surrogate, logits)
    torch.testing.assert_close(g_k2, g_true, atol=1e-12, rtol=1e-10)


def test_kl_in_loss() -> None:
    lp = torch.tensor([[math.log(0.5), 0.0]], dtype=D, requires_grad=True)
    ref = torch.tensor([[math.log(0.25), float("nan")]], dtype=D, requires_grad=True)
    base = torch.tensor([[1.0, 0.0]], dtype=D)
    mask = torch.tensor([[True, False]])
    out, m = kl_in_loss(base, lp, ref, mask, "k1", coef=0.1)
    assert out.tolist() == [[pytest.approx(1.0 + 0.1 * L2), 0.0]]
    assert m["kl_mean"].item() == pytest.approx(L2) and m["kl_coef"].item() == pytest.approx(0.1)
    out.sum().backward()
    assert lp.grad is not None and lp.grad.tolist() == [[pytest.approx(0.1), 0.0]]
    assert ref.grad is None  # the reference is frozen
    with pytest.raises(KeyError, match="k1, k2, k3"):
        kl_in_loss(base, lp, ref, mask, "k4", coef=0.1)


def test_kl_in_reward() -> None:
    lp = torch.tensor([[math.log(0.5), math.log(0.5)], [-1.0, -2.0]], dtype=D, requires_grad=True)
    ref = torch.tensor([[math.log(0.25), math.log(0.5)], [-1.5, 0.0]], dtype=D)
    mask = torch.tensor([[True, True], [True, False]])
    pen = kl_reward_penalty(lp, ref, mask, "k1", coef=0.5)
    assert not pen.requires_grad
    assert pen.tolist() == [[pytest.approx(0.5 * L2), 0.0], [pytest.approx(0.25), 0.0]]
    rewards = torch.tensor([1.0, float("nan")], dtype=D)
    out = apply_kl_to_rewards(rewards, pen)
    assert out[0].item() == pytest.approx(1.0 - 0.5 * L2) and math.isnan(out[1].item())
    with pytest.raises(ValueError, match="rewards"):
        apply_kl_to_rewards(torch.zeros(3), pen)
