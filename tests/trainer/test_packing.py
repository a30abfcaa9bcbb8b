"""trainer.sequencePacking: a micro-batch's rows packed into one sequence give the padded computation's
log-probs, loss and gradients (1e-6 in float64, 1e-5 in float32)."""

from __future__ import annotations

import random

import pytest
import torch

from rft_runtime.algos import compute_advantages
from rft_runtime.trainer.batch import TrainSequence, collate
from rft_runtime.trainer.learner import Learner, LearnerConfig, sequence_logprobs
from rft_runtime.trainer.packing import packed_layout


def _seqs(n=10, seed=0) -> list[TrainSequence]:
    """Rows of very different prompt and response lengths, two rows per prompt."""
    rng = random.Random(seed)
    out = []
    for g in range(n // 2):
        prompt = [rng.randrange(3, 250) for _ in range(rng.randint(3, 30))]
        for i in range(2):
            r = rng.randint(1, 40)
            out.append(TrainSequence(group=f"g{g}", prompt_ids=prompt, response_ids=[rng.randrange(3, 250)
                                     for _ in range(r)], response_mask=[1] * r, inference_logprobs=[-1.0] * r,
                                     reward=float((i + g) % 2), version=0, truncated=False, episode_id=f"g{g}:{i}"))
    return out


def test_layout_by_hand():
    # rows of 3 and 5 tokens, padded to 5, targets from column 1 on
    positions, keep, index = packed_layout([3, 5], start=1, width=5)
    assert positions.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4]]
    # row 0: columns 1 (predicts token 2) -> packed 1; row 1: columns 1..3 -> packed 4, 5, 6
    assert keep.tolist() == [1, 4, 5, 6]
    assert index.tolist() == [[0, 0, 0], [1, 2, 3]]  # row 0's columns 2, 3 are past its end: a copy


def _model(model_dir, dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)


@pytest.mark.parametrize("dtype,tol,attention", [(torch.float64, 1e-6, "sdpa"), (torch.float32, 1e-5, "sdpa"),
                                                 (torch.float32, 1e-5, "rft_sdpa_float32")])
def test_logprobs_equal_the_padded_ones(tiny_model_dir, dtype, tol, attention):
    """Also with the trainer's float32 attention of CPU bfloat16 compute (:mod:`.attention`), whose mask is
    sdpa's."""
    from rft_runtime.trainer.attention import use_float32_attention

    batch = collate(_seqs())
    model = _model(tiny_model_dir, dtype)
    if attention != "sdpa":
        assert use_float32_attention(model)
    padded = sequence_logprobs(model, batch, 0.7, 4)
    calls: list[tuple[int, ...]] = []
    model.model.register_forward_pre_hook(lambda m, a, kw: calls.append(tuple(kw["input_ids"].shape)),
                                          with_kwargs=True)
    packed = sequence_logprobs(model, batch, 0.7, 4, packing=True)
    assert calls and all(c[0] == 1 for c in calls)  # one packed row per micro-batch
    assert sum(c[1] for c in calls) == int(batch.lengths.sum())  # no padding ran
    assert padded.abs().sum() > 0
    torch.testing.assert_close(packed, padded, rtol=tol, atol=tol)


def _step(model_dir, batch, adv, dtype, **cfg):
    """One update with SGD at learning rate 1: (loss, every parameter's gradient)."""
    model = _model(model_dir, dtype)
    learner = Learner(model, LearnerConfig(micro_batch_size=4, grad_clip=1e9, **cfg),
                      torch.optim.SGD(model.parameters(), lr=1.0))
    old = sequence_logprobs(model, batch, 1.0, 4).to(dtype)
    old = old + 0.05 * torch.randn(old.shape, generator=torch.Generator().manual_seed(0), dtype=dtype)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    m = learner.update(batch, adv.advantages.to(dtype), adv.valid, old)
    return m, {n: before[n] - p.detach() for n, p in model.named_parameters()}


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-6), (torch.float32, 1e-5)])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_loss_and_gradients_equal_the_padded_ones(tiny_model_dir, dtype, tol, checkpointing):
    seqs = _seqs()
    batch = collate(seqs)
    adv = compute_advantages("grpo", torch.tensor([s.reward for s in seqs], dtype=torch.float64),
                             [s.group for s in seqs])
    m0, g0 = _step(tiny_model_dir, batch, adv, dtype)
    m1, g1 = _step(tiny_model_dir, batch, adv, dtype, sequence_packing=True, gradient_checkpointing=checkpointing)
    assert m1["loss"] == pytest.approx(m0["loss"], rel=tol, abs=tol)
    assert m1["entropy"] == pytest.approx(m0["entropy"], rel=tol, abs=tol)
    assert any(g.abs().max() > 0 for g in g0.values())
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=tol, atol=tol, msg=n)


def test_own_logprobs_of_a_packed_update_equal_a_padded_pass(tiny_model_dir):
    seqs = _seqs()
    batch = collate(seqs)
    adv = compute_advantages("grpo", torch.tensor([s.reward for s in seqs], dtype=torch.float64),
                             [s.group for s in seqs])
    model = _model(tiny_model_dir, torch.float64)
    padded = sequence_logprobs(model, batch, 1.0, 4)
    learner = Learner(model, LearnerConfig(micro_batch_size=4, sequence_packing=True),
                      torch.optim.SGD(model.parameters(), lr=0.0))
    learner.update(batch, adv.advantages.double(), adv.valid, None)
    assert learner.update_logprobs is not None
    torch.testing.assert_close(learner.update_logprobs, padded, rtol=1e-6, atol=1e-6)
