"""The losses on a tiny real Qwen2 model: every parameter moves, and accumulation invariance."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rft_api.presets import ALGORITHM_PRESETS
from rft_runtime.algos import (
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    PolicyLossConfig,
    aggregate_loss,
    compute_advantages,
    compute_global_normaliser,
    kl_in_loss,
    tis_weights,
)

MAX_LEN = 16
LOSS_PRESET = {"ppo_clip": "dapo", "gspo": "gspo", "cispo": "cispo"}
# old-logprob perturbation per loss: GSPO's clip range is ~1e-4, so its ratios must stay near 1
NOISE = {"ppo_clip": 0.3, "gspo": 1e-3, "cispo": 0.3, "reinforce": 0.3}


def _cfg(loss: str) -> PolicyLossConfig:
    preset = LOSS_PRESET.get(loss)
    if loss == "cispo":  # the preset caps the weight at 5; a tighter cap engages clipping here
        return PolicyLossConfig(clip_low=ALGORITHM_PRESETS["cispo"].clip_low, clip_high=0.28)
    if preset is None:
        return PolicyLossConfig()
    p = ALGORITHM_PRESETS[preset]
    return PolicyLossConfig(clip_low=p.clip_low, clip_high=p.clip_high, dual_clip_c=p.dual_clip_c)


def _advantages(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 2, (n,), generator=g).to(torch.float64) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    groups = [f"t{i // 4}:main" for i in range(n)]
    adv = compute_advantages("grpo", rewards, groups).advantages
    assert adv.abs().min() > 0
    return adv


@pytest.mark.parametrize("loss_name", sorted(POLICY_LOSSES.names()))
def test_every_parameter_moves_after_one_step(tiny: SimpleNamespace, loss_name: str) -> None:
    model = tiny.model(seed=0, dtype=torch.float64)
    batch = tiny.batch(seed=1, n=8)
    mask = batch.response_mask
    adv = _advantages(8, seed=2)
    preset = LOSS_PRESET.get(loss_name)
    mode = ALGORITHM_PRESETS[preset].loss_aggregation if preset else "token-mean"

    def objective() -> torch.Tensor:
        lp = tiny.logprobs(model, batch)
        per_tok, _ = POLICY_LOSSES[loss_name](lp, old, adv, mask, _cfg(loss_name))
        return aggregate_loss(mode, per_tok, mask, max_len=MAX_LEN)

    def pg_objective() -> float:
        lp = tiny.logprobs(model, batch)
        return aggregate_loss(mode, -adv[:, None] * lp, mask, max_len=MAX_LEN).item()

    with torch.no_grad():
        old = tiny.logprobs(model, batch)  # first epoch: on-policy
        pg_before = pg_objective()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)  # no decay: only gradients move
    loss = objective()
    loss.backward()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert no_grad == [], f"parameters without gradient under {loss_name}: {no_grad}"
    opt.step()
    unchanged = [n for n, p in model.named_parameters() if torch.equal(before[n], p.detach())]
    assert unchanged == [], f"parameters that did not move under {loss_name}: {unchanged}"
    # the step improves the policy-gradient objective (all losses have the REINFORCE gradient
    # on-policy); CISPO's own loss value is not monotone because its weights are recomputed
    with torch.no_grad():
        assert pg_objective() < pg_before


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def _accumulated_grads(tiny, model, batch, old, adv, loss_name, mode, splits, *, normaliser, extras=None):  # type: ignore[no-untyped-def]
    """Gradients after backward over the micro-batches ``splits`` (lists of row indices)."""
    model.zero_grad(set_to_none=True)
    for rows in splits:
        mb = tiny.slice(batch, rows)
        width = mb.response_mask.shape[1]
        lp = tiny.logprobs(model, mb)
        per_tok, _ = POLICY_LOSSES[loss_name](lp, old[rows, :width], adv[rows], mb.response_mask, _cfg(loss_name))
        if extras is not None:
            w, _ = tis_weights(old[rows, :width], extras["inference"][rows, :width], mb.response_mask, cap=2.0)
            per_tok = per_tok * w
            per_tok, _ = kl_in_loss(per_tok, lp, extras["ref"][rows, :width], mb.response_mask, "k3", 0.05)
        aggregate_loss(mode, per_tok, mb.response_mask, global_normaliser=normaliser, max_len=MAX_LEN).backward()
    return _grads(model)


def _setup(tiny: SimpleNamespace, loss_name: str):  # type: ignore[no-untyped-def]
    model = tiny.model(seed=0, dtype=torch.float64)
    batch = tiny.batch(seed=5, n=8)
    assert len(set(batch.response_lens)) > 2  # lengths differ: token- and sequence-level weights differ
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        lp = tiny.logprobs(model, batch)
    old = lp + NOISE[loss_name] * torch.randn(lp.shape, generator=g, dtype=lp.dtype)
    return model, batch, old, _advantages(8, seed=3)


@pytest.mark.parametrize("mode", sorted(LOSS_AGGREGATIONS.names()))
@pytest.mark.parametrize("loss_name", sorted(POLICY_LOSSES.names()))
def test_gradient_accumulation_invariance(tiny: SimpleNamespace, loss_name: str, mode: str) -> None:
    model, batch, old, adv = _setup(tiny, loss_name)
    with torch.no_grad():
        _, metrics = POLICY_LOSSES[loss_name](tiny.logprobs(model, batch), old, adv, batch.response_mask, _cfg(loss_name))
    if loss_name != "reinforce":  # clipping is engaged on some tokens but not all
        assert 0.0 < metrics["clip_fraction"].item() < 1.0
    norm = compute_global_normaliser(mode, batch.response_mask)
    one_batch = _accumulated_grads(tiny, model, batch, old, adv, loss_name, mode, [list(range(8))], normaliser=norm)
    assert sum(g.abs().sum() for g in one_batch) > 0
    eight = _accumulated_grads(tiny, model, batch, old, adv, loss_name, mode, [[i] for i in range(8)], normaliser=norm)
    uneven = _accumulated_grads(tiny, model, batch, old, adv, loss_name, mode, [[0, 1, 2], [3, 4, 5, 6, 7]], normaliser=norm)
    for a, b, c in zip(one_batch, eight, uneven):
        torch.testing.assert_close(b, a, atol=1e-12, rtol=1e-9)
        torch.testing.assert_close(c, a, atol=1e-12, rtol=1e-9)
    # the test can fail: per-micro-batch normalisers (no global count) give a different gradient
    naive = _accumulated_grads(tiny, model, batch, old, adv, loss_name, mode, [[i] for i in range(8)], normaliser=None)
    assert max((x - y).abs().max().item() for x, y in zip(naive, one_batch)) > 1e-6


def test_accumulation_invariance_with_tis_and_kl(tiny: SimpleNamespace) -> None:
    model, batch, old, adv = _setup(tiny, "ppo_clip")
    ref_model = tiny.model(seed=11, dtype=torch.float64)
    g = torch.Generator().manual_seed(13)
    with torch.no_grad():
        ref = tiny.logprobs(ref_model, batch)
    extras = {"ref": ref, "inference": old + 0.5 * torch.randn(old.shape, generator=g, dtype=old.dtype)}
    for mode in ("token-mean", "seq-mean-token-mean"):
        norm = compute_global_normaliser(mode, batch.response_mask)
        a = _accumulated_grads(tiny, model, batch, old, adv, "ppo_clip", mode, [list(range(8))], normaliser=norm, extras=extras)
        b = _accumulated_grads(tiny, model, batch, old, adv, "ppo_clip", mode, [[i] for i in range(8)], normaliser=norm, extras=extras)
        assert sum(x.abs().sum() for x in a) > 0
        for x, y in zip(a, b):
            torch.testing.assert_close(y, x, atol=1e-12, rtol=1e-9)


def test_float32_accumulation_invariance(tiny: SimpleNamespace) -> None:
    model = tiny.model(seed=0, dtype=torch.float32)
    batch = tiny.batch(seed=5, n=8)
    with torch.no_grad():
        old = tiny.logprobs(model, batch) + 0.2
    adv = _advantages(8, seed=3).float()
    norm = compute_global_normaliser("token-mean", batch.response_mask)
    a = _accumulated_grads(tiny, model, batch, old, adv, "ppo_clip", "token-mean", [list(range(8))], normaliser=norm)
    b = _accumulated_grads(tiny, model, batch, old, adv, "ppo_clip", "token-mean", [[i] for i in range(8)], normaliser=norm)
    for x, y in zip(a, b):
        torch.testing.assert_close(y, x, atol=1e-6, rtol=1e-4)
