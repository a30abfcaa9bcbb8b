"""Trainer numerics on the tiny model: every parameter moves for each loss,
gradient accumulation is invariant to the micro-batch size, KL and TIS paths, LoRA freezes the
base."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from rft_runtime.algos import compute_advantages
from rft_runtime.trainer.batch import collate, sequences_from_groups
from rft_runtime.trainer.learner import Learner, LearnerConfig, build_optimizer, lr_lambda, sequence_logprobs


def _inputs(groups, n_groups=2, n=4, steps=1):
    seqs = sequences_from_groups(groups(n_groups, n, steps=steps))
    batch = collate(seqs)
    rewards = torch.tensor([s.reward for s in seqs], dtype=torch.float64)
    adv = compute_advantages("grpo", rewards, [s.group for s in seqs])
    return batch, adv


def _learner(model, **kw):
    cfg = LearnerConfig(**{"micro_batch_size": 4, **kw})
    params = [p for p in model.parameters() if p.requires_grad]
    return Learner(model, cfg, build_optimizer(params, 1e-3, 0.0))


@pytest.mark.parametrize("loss,agg", [("ppo_clip", "token-mean"), ("gspo", "seq-mean-token-mean"),
                                      ("cispo", "token-mean"), ("reinforce", "seq-mean-token-sum-norm")])
def test_every_parameter_moves_after_one_step(tiny_model, groups, loss, agg):
    batch, adv = _inputs(groups)
    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    learner = _learner(tiny_model, policy_loss=loss, loss_aggregation=agg, clip_low=0.2, clip_high=0.28)
    old = learner.logprobs(batch)
    m = learner.update(batch, adv.advantages.float(), adv.valid, old)
    still = [n for n, p in tiny_model.named_parameters() if torch.equal(p.detach(), before[n])]
    assert still == [], f"{loss}: parameters did not move: {still}"
    assert m["grad_norm"] > 0 and m["loss_tokens"] == float(batch.loss_mask.sum())
    assert 0.0 <= m["entropy"] and "clip_fraction" in m


def test_accumulation_invariance_1x8_equals_8x1(tiny_model_dir, groups):
    """The update with micro-batches of 1 equals the update with one micro-batch of 8."""
    from transformers import AutoModelForCausalLM

    batch, adv = _inputs(groups, 2, 4)
    results = []
    for mbs in (8, 1):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        learner = Learner(model, LearnerConfig(micro_batch_size=mbs, grad_clip=1e9), opt)
        old = sequence_logprobs(model, batch, 1.0, 8).double()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        # a perturbed old policy so that the ratio (and clipping) is not trivially 1
        learner.update(batch, adv.advantages.double(), adv.valid, old + 0.05 * torch.randn(old.shape,
                       generator=torch.Generator().manual_seed(0), dtype=torch.float64))
        results.append({n: p.detach() - before[n] for n, p in model.named_parameters()})
    for n in results[0]:
        torch.testing.assert_close(results[0][n], results[1][n], rtol=1e-9, atol=1e-12, msg=n)


def test_invalid_rows_are_masked_out(tiny_model, groups):
    """A sequence excluded by the estimator (None reward) contributes no gradient."""
    batch, adv = _inputs(groups, 1, 4)
    learner = _learner(tiny_model)
    old = learner.logprobs(batch)
    valid = adv.valid.clone()
    valid[:] = False
    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    opt = torch.optim.SGD(tiny_model.parameters(), lr=1.0)
    learner.optimizer = opt
    m = learner.update(batch, adv.advantages.float(), valid, old)
    assert m["loss_tokens"] == 0.0 and m["grad_norm"] == 0.0
    assert all(torch.equal(p.detach(), before[n]) for n, p in tiny_model.named_parameters())


def test_kl_in_loss_and_tis(tiny_model, groups):
    batch, adv = _inputs(groups)
    learner = _learner(tiny_model, kl_coef=0.1, kl_estimator="k3")
    old = learner.logprobs(batch)
    ref = old.clone() - 0.1
    with pytest.raises(ValueError, match="reference"):
        learner.update(batch, adv.advantages.float(), adv.valid, old)
    w = torch.where(batch.loss_mask, torch.full_like(old, 0.5), torch.zeros_like(old))
    m = learner.update(batch, adv.advantages.float(), adv.valid, old, ref_logprobs=ref, tis_weights=w)
    assert m["kl_ref"] > 0


def test_epochs_make_several_optimizer_steps(tiny_model, groups):
    batch, adv = _inputs(groups)
    learner = _learner(tiny_model, epochs=3)
    old = learner.logprobs(batch)
    m = learner.update(batch, adv.advantages.float(), adv.valid, old)
    state = learner.optimizer.state[next(iter(learner.optimizer.state))]
    assert int(state["step"]) == 3
    assert m["approx_kl"] != 0.0  # later epochs see a moved policy


@pytest.mark.parametrize("loss,agg", [("ppo_clip", "token-mean"), ("gspo", "seq-mean-token-mean")])
def test_old_logprobs_from_the_updates_forward_equal_a_recompute_pass_before_it(tiny_model_dir, groups, loss, agg):
    """One pass (epochs 1): the update given no old log-probs takes them from its own forward. It must
    move every parameter exactly as the update after a separate no-gradient pass, and keep the same
    log-probs that pass computes (float64; temperature 0.7, micro-batches of 3 cut across groups)."""
    from transformers import AutoModelForCausalLM

    batch, adv = _inputs(groups, 2, 4)
    deltas, kept = [], []
    for separate in (True, False):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
        cfg = LearnerConfig(micro_batch_size=3, temperature=0.7, policy_loss=loss, loss_aggregation=agg,
                            clip_low=0.2, clip_high=0.28, grad_clip=1e9)
        learner = Learner(model, cfg, torch.optim.SGD(model.parameters(), lr=1.0))
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        old = learner.logprobs(batch).double() if separate else None
        m = learner.update(batch, adv.advantages.double(), adv.valid, old)
        deltas.append({n: p.detach() - before[n] for n, p in model.named_parameters()})
        kept.append(old if separate else learner.update_logprobs)
        assert m["clip_fraction"] == 0.0 and abs(m["approx_kl"]) < 1e-12
        assert (learner.update_logprobs is None) == separate
    assert all(bool(d.abs().sum() > 0) for d in deltas[0].values())
    for n in deltas[0]:
        torch.testing.assert_close(deltas[1][n], deltas[0][n], rtol=1e-9, atol=1e-12, msg=n)
    torch.testing.assert_close(kept[1].double(), kept[0], rtol=0, atol=1e-6)  # float32 storage
    assert bool((kept[1][~batch.loss_mask] == 0).all()) and bool((kept[1][batch.loss_mask] < 0).all())


def test_old_logprobs_from_the_updates_forward_need_one_pass_and_no_dropout(tiny_model, groups):
    from types import SimpleNamespace

    from rft_runtime.trainer.learner import forward_is_deterministic
    from rft_runtime.trainer.model_io import wrap_lora

    batch, adv = _inputs(groups)
    with pytest.raises(ValueError, match="epochsPerStep 1"):
        _learner(tiny_model, epochs=2).update(batch, adv.advantages.float(), adv.valid, None)
    assert forward_is_deterministic(tiny_model)
    lora = SimpleNamespace(rank=4, alpha=8.0, dropout=0.1, target_modules=["q_proj", "v_proj"])
    assert not forward_is_deterministic(wrap_lora(copy.deepcopy(tiny_model), lora))
    tiny_model.config.attention_dropout = 0.1
    assert not forward_is_deterministic(tiny_model)


def test_lora_trains_only_the_adapter(tiny_model, groups):
    from types import SimpleNamespace

    from rft_runtime.trainer.model_io import wrap_lora

    lora = SimpleNamespace(rank=4, alpha=8.0, dropout=0.0, target_modules=["q_proj", "v_proj"])
    model = wrap_lora(tiny_model, lora)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    adapter = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert adapter and all("lora_" in n for n in adapter)
    batch, adv = _inputs(groups)
    learner = _learner(model)
    learner.update(batch, adv.advantages.float(), adv.valid, learner.logprobs(batch))
    assert all(torch.equal(p.detach(), base[n]) for n, p in model.named_parameters() if n in base)
    moved = [n for n, p in model.named_parameters() if n in adapter and not torch.equal(p.detach(), adapter[n])]
    assert moved and any("lora_B" in n for n in moved)


def test_lr_schedules():
    f = lr_lambda("linear", 2, 10)
    assert [round(f(s), 3) for s in (0, 1, 2, 6, 10)] == [0.333, 0.667, 1.0, 0.5, 0.0]
    c = lr_lambda("cosine", 0, 10)
    assert c(0) == 1.0 and abs(c(5) - 0.5) < 1e-9 and abs(c(10)) < 1e-9
    assert lr_lambda("constant", 0, 10)(7) == 1.0
    with pytest.raises(ValueError, match="scheduler.kind"):
        lr_lambda("step", 0, 1)


def test_recomputed_logprobs_do_not_depend_on_micro_batching(tiny_model, groups):
    batch, _ = _inputs(groups)
    a = sequence_logprobs(tiny_model, batch, 0.7, 1)
    b = sequence_logprobs(copy.deepcopy(tiny_model), batch, 0.7, 8)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_the_optimizer_is_fused_where_torch_has_the_kernel_and_steps_like_the_loop():
    """AdamW's fused kernel (the CPU has one): the same update as the per-tensor loop, to rounding."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s)) for s in ((16, 8), (8,), (3, 16))]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    start = [p.detach().clone() for p in params]
    opt = build_optimizer(params, 1e-2, 0.1)
    assert opt.defaults["fused"] is True
    loop = torch.optim.AdamW(twins, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.999), eps=1e-8, foreach=False)
    for _ in range(5):
        grads = [torch.randn_like(p) for p in params]
        for o, ps in ((opt, params), (loop, twins)):
            for p, g in zip(ps, grads):
                p.grad = g.clone()
            o.step()
    for p, q, p0 in zip(params, twins, start):
        assert (p.detach() - p0).abs().mean() > 5e-3  # 5 steps at lr 1e-2 moved them
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=1e-6)
    # a device without the kernel keeps the default implementation
    assert build_optimizer([torch.nn.Parameter(torch.ones(2, device="meta"))], 1e-2, 0.0).defaults["fused"] is None


def test_whole_rows_run_without_a_mask_and_give_the_padded_masks_logits(tiny_model_dir, monkeypatch):
    """Rows are padded on the right and the model is causal, so :func:`forward_logits` drops the
    attention mask (the causal attention kernel instead of a masked one): every position a loss reads
    has the logits that the padding mask gives, for rows of very different lengths."""
    from transformers import AutoModelForCausalLM

    from rft_runtime.trainer import prefix
    from rft_runtime.trainer.batch import TrainSequence
    from rft_runtime.trainer.learner import forward_logits

    monkeypatch.setattr(prefix, "SHARE_PROMPTS", False)
    g = torch.Generator().manual_seed(1)
    seqs = [TrainSequence(group=f"t{i}", prompt_ids=torch.randint(3, 200, (2 + 5 * i,), generator=g).tolist(),
                          response_ids=torch.randint(3, 200, (1 + 7 * (3 - i),), generator=g).tolist(),
                          response_mask=[1] * (1 + 7 * (3 - i)), inference_logprobs=[-1.0] * (1 + 7 * (3 - i)),
                          reward=0.0, version=0, truncated=False, episode_id=f"e{i}") for i in range(4)]
    batch = collate(seqs)
    assert int(batch.attention_mask.sum()) < batch.attention_mask.numel()  # there is padding
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64).eval()
    calls = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **kw: calls.append(kw.get("attention_mask")) or forward(*a, **kw))
    with torch.no_grad():
        logits, start = forward_logits(model, batch)
        masked = forward(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
    assert calls == [None]
    expected = masked[:, start:-1]
    read = batch.loss_mask[:, start:]
    assert torch.allclose(logits[read], expected[read].float(), atol=1e-5, rtol=0)
    assert not torch.allclose(logits, expected.float(), atol=1e-3)  # only padding positions may differ


@pytest.mark.parametrize("poison", ["huge-reward", "nan-advantage"])
def test_a_non_finite_gradient_makes_no_step_and_the_weights_stay_finite(tiny_model, groups, poison):
    """A reward far out of scale overflows its advantage in float32 (RLOO on [1e200, 0, 0, 0] in
    float64 is finite; the loss's float32 is not), a NaN anywhere in the loss: the pass is skipped."""
    batch, _ = _inputs(groups, 1, 4)
    rewards = torch.tensor([1e200 if poison == "huge-reward" else 1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    adv = compute_advantages("rloo", rewards, [0, 0, 0, 0])
    advantages = adv.advantages.float()
    if poison == "nan-advantage":
        advantages[1] = float("nan")
    learner = _learner(tiny_model)
    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    m = learner.update(batch, advantages, adv.valid, learner.logprobs(batch))
    assert m["nonfinite_skipped"] == 1.0 and not math.isfinite(m["grad_norm"])
    assert all(torch.equal(p.detach(), before[n]) for n, p in tiny_model.named_parameters())
    assert learner.weights_finite()
    # the next, sane step trains as usual from the same weights
    batch, adv = _inputs(groups, 1, 4)
    m = learner.update(batch, adv.advantages.float(), adv.valid, learner.logprobs(batch))
    assert m["nonfinite_skipped"] == 0.0 and math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0
    assert any(not torch.equal(p.detach(), before[n]) for n, p in tiny_model.named_parameters())


def test_weights_that_are_not_finite_after_a_step_are_refused(tiny_model, groups):
    from rft_runtime.trainer.finite import NonFiniteWeights

    batch, adv = _inputs(groups, 1, 4)
    learner = _learner(tiny_model)
    with torch.no_grad():
        next(tiny_model.parameters()).view(-1)[0] = float("inf")  # what an overflow in the step would leave
    learner.optimizer = torch.optim.SGD([p for p in tiny_model.parameters() if p.requires_grad], lr=0.0)
    with pytest.raises(NonFiniteWeights, match="published or checkpointed"):
        learner.update(batch, adv.advantages.float(), adv.valid, learner.logprobs(batch))


def test_the_guard_fails_the_run_after_the_limit_of_skipped_steps_in_a_row():
    from rft_runtime.trainer.finite import NonFiniteSteps, NonFiniteTraining

    g = NonFiniteSteps(2)
    g.observe(1, 1, 1, None)
    g.observe(2, 0, 1, None)  # a good step resets the count
    g.observe(3, 1, 2, None)  # one pass of two skipped: the weights moved, the count resets
    g.observe(4, 1, 1, 2)
    assert (g.in_a_row, g.total) == (1, 3)
    with pytest.raises(NonFiniteTraining, match=r"2 steps in a row \(up to step 5\).*maxNonFiniteSteps=2.*step 2\) is intact"):
        g.observe(5, 1, 1, 2)
    with pytest.raises(ValueError, match="maxNonFiniteSteps"):
        NonFiniteSteps(0)
