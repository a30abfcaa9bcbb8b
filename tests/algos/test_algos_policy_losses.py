"""Policy losses: hand-computed values and gradients, a plain-loop reference, masking, errors."""

from __future__ import annotations

import math
import random

import pytest
import torch

from rft_runtime.algos import POLICY_LOSSES, PolicyLossConfig, aggregate_loss, compute_policy_loss

D = torch.float64


def _lp(ratios: list[list[float]]) -> torch.Tensor:
    return torch.log(torch.tensor(ratios, dtype=D)).requires_grad_(True)


def _grad(loss: torch.Tensor, lp: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss.sum(), lp, retain_graph=True)
    return g


def _close(actual: torch.Tensor, expected: list, atol: float = 1e-12) -> None:  # type: ignore[type-arg]
    torch.testing.assert_close(actual.detach(), torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def test_ppo_clip_hand_values_with_clip_higher_and_dual_clip() -> None:
    lp = _lp([[1.5, 0.5, 1.1, 4.0]])
    old = torch.zeros(1, 4, dtype=D)
    adv = torch.tensor([[1.0, -1.0, 1.0, -2.0]], dtype=D)
    mask = torch.ones(1, 4, dtype=torch.bool)
    cfg = PolicyLossConfig(clip_low=0.2, clip_high=0.28, dual_clip_c=3.0)
    loss, m = compute_policy_loss("ppo_clip", lp, old, adv, mask, cfg)
    # t0 clipped high (-1.28); t1 clipped low (0.8); t2 free (-1.1); t3 dual clip (-c*A = 6)
    _close(loss, [[-1.28, 0.8, -1.1, 6.0]], 1e-12)
    _close(_grad(loss, lp), [[0.0, 0.0, -1.1, 0.0]], 1e-12)
    assert m["clip_fraction"].item() == pytest.approx(0.75)
    assert m["clip_fraction_low"].item() == pytest.approx(0.25)
    assert m["clip_fraction_high"].item() == pytest.approx(0.25)
    assert m["dual_clip_fraction"].item() == pytest.approx(0.25)
    assert m["ratio_mean"].item() == pytest.approx((1.5 + 0.5 + 1.1 + 4.0) / 4)
    assert m["ratio_max"].item() == pytest.approx(4.0) and m["ratio_min"].item() == pytest.approx(0.5)
    assert m["approx_kl"].item() == pytest.approx(-sum(map(math.log, [1.5, 0.5, 1.1, 4.0])) / 4)
    # without dual clip the negative-advantage token's loss is unbounded: -A * r = 8
    loss2, m2 = compute_policy_loss("ppo_clip", lp, old, adv, mask, PolicyLossConfig(0.2, 0.28, None))
    assert loss2[0, 3].item() == pytest.approx(8.0)
    assert _grad(loss2, lp)[0, 3].item() == pytest.approx(8.0)
    assert m2["dual_clip_fraction"].item() == 0.0


def test_ppo_clip_symmetric_vs_clip_higher() -> None:
    lp = _lp([[1.25]])
    old = torch.zeros(1, 1, dtype=D)
    adv = torch.ones(1, dtype=D)
    mask = torch.ones(1, 1)
    sym, _ = compute_policy_loss("ppo_clip", lp, old, adv, mask, PolicyLossConfig(0.2, 0.2))
    hi, _ = compute_policy_loss("ppo_clip", lp, old, adv, mask, PolicyLossConfig(0.2, 0.28))
    assert sym.item() == pytest.approx(-1.2) and hi.item() == pytest.approx(-1.25)
    assert _grad(sym, lp)[0, 0].item() == 0.0 and _grad(hi, lp)[0, 0].item() == pytest.approx(-1.25)


def test_gspo_hand_values() -> None:
    old = torch.zeros(2, 3, dtype=D)
    lp = torch.tensor([[0.1, -0.2, 0.4], [0.01, -0.03, 7.0]], dtype=D, requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    adv = torch.tensor([1.0, -2.0], dtype=D)
    loss, m = compute_policy_loss("gspo", lp, old, adv, mask, PolicyLossConfig(0.05, 0.05))
    s1 = math.exp(-0.01)  # seq 1: mean log-ratio (0.01 - 0.03) / 2, unclipped
    # seq 0: s = e^0.1 = 1.105 > 1.05 with A > 0: clipped to 1.05, no gradient
    _close(loss, [[-1.05] * 3, [2 * s1, 2 * s1, 0.0]], 1e-12)
    _close(_grad(loss, lp), [[0.0] * 3, [2 * s1, 2 * s1, 0.0]], 1e-12)
    assert m["clip_fraction"].item() == pytest.approx(3 / 5)
    assert m["ratio_max"].item() == pytest.approx(math.exp(0.1))
    assert m["ratio_min"].item() == pytest.approx(s1)


def test_gspo_gradient_equals_sequence_objective() -> None:
    """GSPO-token + seq-mean-token-mean has the gradient of GSPO's sequence objective."""
    g = torch.Generator().manual_seed(3)
    old = torch.randn(4, 6, generator=g, dtype=D)
    lp = (old + 0.1 * torch.randn(4, 6, generator=g, dtype=D)).requires_grad_(True)
    mask = torch.rand(4, 6, generator=g) > 0.3
    mask[:, 0] = True
    adv = torch.randn(4, generator=g, dtype=D)
    cfg = PolicyLossConfig(10.0, 10.0)  # wide: nothing clipped
    loss, _ = compute_policy_loss("gspo", lp, old, adv, mask, cfg)
    (g_tok,) = torch.autograd.grad(aggregate_loss("seq-mean-token-mean", loss, mask), lp)
    lens = mask.sum(-1)
    s = torch.exp(((lp - old) * mask).sum(-1) / lens)
    (g_seq,) = torch.autograd.grad((-adv * s).mean(), lp)
    torch.testing.assert_close(g_tok, g_seq, atol=1e-12, rtol=1e-10)


def test_cispo_hand_values_verl_convention() -> None:
    lp = _lp([[1.5, 0.5, 1.1]])
    old = torch.zeros(1, 3, dtype=D)
    adv = torch.tensor([[1.0, -1.0, 2.0]], dtype=D)
    mask = torch.ones(1, 3)
    loss, m = compute_policy_loss("cispo", lp, old, adv, mask, PolicyLossConfig(clip_low=1.0, clip_high=0.28))
    w = [1.28, 0.5, 1.1]  # 1.5 capped at 1 + 0.28; no lower bound (clip_low = 1)
    expect = [-a * wi * math.log(r) for a, wi, r in zip([1.0, -1.0, 2.0], w, [1.5, 0.5, 1.1])]
    _close(loss, [expect], 1e-12)
    # stop-gradient weight: d/dlogp = -w * A, including the clipped token (never dropped)
    _close(_grad(loss, lp), [[-1.28, 0.5, -2.2]], 1e-12)
    assert m["clip_fraction"].item() == pytest.approx(1 / 3)
    loss_lo, _ = compute_policy_loss("cispo", lp, old, adv, mask, PolicyLossConfig(clip_low=0.2, clip_high=0.28))
    assert _grad(loss_lo, lp)[0, 1].item() == pytest.approx(0.8)  # 0.5 raised to 1 - 0.2


def test_reinforce_hand_values() -> None:
    lp = _lp([[2.0, 0.5]])
    loss, m = compute_policy_loss("reinforce", lp, torch.zeros(1, 2, dtype=D), torch.tensor([1.5], dtype=D), torch.ones(1, 2))
    _close(loss, [[-3.0, -0.75]])
    _close(_grad(loss, lp), [[-3.0, -0.75]])
    assert m["clip_fraction"].item() == 0.0


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES.names()))
def test_masked_positions_are_inert(name: str) -> None:
    lp = torch.tensor([[-1.0, float("nan")], [-0.5, -2.0]], dtype=D, requires_grad=True)
    old = torch.tensor([[-1.1, float("nan")], [-0.6, float("inf")]], dtype=D)
    mask = torch.tensor([[1, 0], [1, 0]], dtype=torch.bool)
    loss, metrics = compute_policy_loss(name, lp, old, torch.tensor([1.0, -1.0], dtype=D), mask)
    assert loss[0, 1].item() == 0.0 and loss[1, 1].item() == 0.0
    (g,) = torch.autograd.grad(loss.sum(), lp)
    assert torch.isfinite(g).all() and g[:, 1].abs().sum() == 0
    assert all(torch.isfinite(v) for v in metrics.values())
    for v in metrics.values():
        assert v.dim() == 0 and not v.requires_grad


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES.names()))
def test_shape_errors(name: str) -> None:
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="old_logprobs"):
        compute_policy_loss(name, lp, torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3))
    with pytest.raises(ValueError, match="advantages"):
        compute_policy_loss(name, lp, lp, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="mask"):
        compute_policy_loss(name, lp, lp, torch.zeros(2), torch.ones(3, 3))
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        compute_policy_loss(name, torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.ones(3))


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="clip_low"):
        PolicyLossConfig(clip_low=-0.1)
    with pytest.raises(ValueError, match="clip_high"):
        PolicyLossConfig(clip_high=float("nan"))
    with pytest.raises(ValueError, match="dual_clip_c"):
        PolicyLossConfig(dual_clip_c=1.0)


# ---- reference implementation: plain Python loops -------------------------------------------


def _ref(name: str, lp, old, adv, mask, cfg: PolicyLossConfig):  # type: ignore[no-untyped-def]
    """Per-token (loss, d loss / d logprob) from scalar loops."""
    B, T = len(lp), len(lp[0])
    loss = [[0.0] * T for _ in range(B)]
    grad = [[0.0] * T for _ in range(B)]
    lo, hi = 1 - cfg.clip_low, 1 + cfg.clip_high
    for i in range(B):
        idx = [t for t in range(T) if mask[i][t]]
        seq_ratio = math.exp(sum(lp[i][t] - old[i][t] for t in idx) / len(idx)) if idx else 1.0
        for t in idx:
            a = adv[i][t]
            r = math.exp(lp[i][t] - old[i][t])
            if name == "ppo_clip" or name == "gspo":
                rr = r if name == "ppo_clip" else seq_ratio
                unclipped, clipped = -a * rr, -a * min(max(rr, lo), hi)
                val, g = (unclipped, -a * rr) if unclipped >= clipped else (clipped, 0.0)
                if name == "ppo_clip" and cfg.dual_clip_c is not None and a < 0 and val > -a * cfg.dual_clip_c:
                    val, g = -a * cfg.dual_clip_c, 0.0
            elif name == "cispo":
                w = min(max(r, max(lo, 0.0)), hi)
                val, g = -a * w * lp[i][t], -a * w
            else:
                val, g = -a * r, -a * r
            loss[i][t], grad[i][t] = val, g
    return loss, grad


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES.names()))
def test_vectorised_matches_reference_loop(name: str) -> None:
    for seed in range(40):
        rng = random.Random(seed)
        B, T = rng.randint(1, 5), rng.randint(1, 7)
        old = [[rng.uniform(-4, -0.1) for _ in range(T)] for _ in range(B)]
        scale = 0.002 if name == "gspo" else 0.4
        lp = [[o + rng.gauss(0, scale) for o in row] for row in old]
        mask = [[rng.random() > 0.25 for _ in range(T)] for _ in range(B)]
        per_seq = rng.random() < 0.5
        adv_seq = [rng.gauss(0, 1) for _ in range(B)]
        adv = [[adv_seq[i]] * T for i in range(B)] if per_seq else [[rng.gauss(0, 1) for _ in range(T)] for _ in range(B)]
        if name == "gspo":
            cfg = PolicyLossConfig(rng.choice([3e-4, 1e-3]), rng.choice([4e-4, 2e-3]))
        else:
            cfg = PolicyLossConfig(rng.choice([0.1, 0.2, 1.0]), rng.choice([0.2, 0.28, 0.5]),
                                   rng.choice([None, 3.0]) if name == "ppo_clip" else None)
        lp_t = torch.tensor(lp, dtype=D, requires_grad=True)
        adv_t = torch.tensor(adv_seq, dtype=D) if per_seq else torch.tensor(adv, dtype=D)
        loss, metrics = compute_policy_loss(name, lp_t, torch.tensor(old, dtype=D), adv_t, torch.tensor(mask), cfg)
        (g,) = torch.autograd.grad(loss.sum(), lp_t)
        ref_loss, ref_grad = _ref(name, lp, old, adv, mask, cfg)
        _close(loss, ref_loss, 1e-10)
        _close(g, ref_grad, 1e-10)
        assert 0.0 <= metrics["clip_fraction"].item() <= 1.0
