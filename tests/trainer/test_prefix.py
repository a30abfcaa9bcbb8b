"""Shared prompts run once (rft_runtime.trainer.prefix): the log-probs, the loss and the update are
those of running every row whole, and micro-batches are cut so that rows of one prompt sit together
when that runs fewer tokens."""

from __future__ import annotations

import random

import pytest
import torch

from rft_runtime.algos import compute_advantages
from rft_runtime.trainer import prefix
from rft_runtime.trainer.batch import TrainSequence, collate
from rft_runtime.trainer.learner import Learner, LearnerConfig, micro_batches, sequence_logprobs


def _seqs(prompt_lens=(7, 4, 9), n=4, resp=(1, 6), seed=0, multi_turn_mask=False) -> list[TrainSequence]:
    """``len(prompt_lens)`` groups of ``n`` samples of one prompt each (prompts of different lengths),
    responses of ``resp[0]..resp[1]`` tokens; with ``multi_turn_mask`` some response tokens are
    environment tokens (mask 0)."""
    rng = random.Random(seed)
    out = []
    for g, p in enumerate(prompt_lens):
        prompt = [rng.randrange(3, 250) for _ in range(p)]
        for i in range(n):
            r = rng.randint(*resp)
            mask = [0 if multi_turn_mask and 0 < j < r - 1 and j % 3 == 0 else 1 for j in range(r)]
            out.append(TrainSequence(group=f"g{g}", prompt_ids=prompt, response_ids=[rng.randrange(3, 250)
                                     for _ in range(r)], response_mask=mask,
                                     inference_logprobs=[-1.0] * r, reward=float((i + g) % 2), version=0,
                                     truncated=False, episode_id=f"g{g}:{i}"))
    rng.shuffle(out)  # rows of a group are not adjacent in the batch
    return out


@pytest.fixture
def share(monkeypatch):
    def set_(on: bool) -> None:
        monkeypatch.setattr(prefix, "SHARE_PROMPTS", on)
    return set_


def _model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)


@pytest.mark.parametrize("resp,multi", [((1, 6), False), ((1, 1), False), ((2, 9), True)])
@pytest.mark.parametrize("micro", [3, 12])
def test_shared_prompt_logprobs_equal_whole_rows(tiny_model_dir, share, resp, multi, micro):
    batch = collate(_seqs(resp=resp, multi_turn_mask=multi))
    model = _model(tiny_model_dir)
    share(False)
    whole = sequence_logprobs(model, batch, 1.0, micro)
    share(True)
    shared = sequence_logprobs(model, batch, 1.0, micro)
    assert batch.loss_mask.sum() > 0
    assert torch.count_nonzero(whole[batch.loss_mask]) == int(batch.loss_mask.sum())
    assert torch.equal(shared[~batch.loss_mask], torch.zeros_like(shared[~batch.loss_mask]))
    assert torch.allclose(shared, whole, atol=1e-10, rtol=0), float((shared - whole).abs().max())


def test_shared_prompt_update_equals_whole_rows(tiny_model_dir, share):
    seqs = _seqs(resp=(2, 8))
    batch = collate(seqs)
    adv = compute_advantages("grpo", torch.tensor([s.reward for s in seqs], dtype=torch.float64),
                             [s.group for s in seqs])
    results = []
    for on in (False, True):
        share(on)
        model = _model(tiny_model_dir)
        learner = Learner(model, LearnerConfig(micro_batch_size=4, grad_clip=1e9), torch.optim.SGD(
            model.parameters(), lr=1.0))
        old = sequence_logprobs(model, batch, 1.0, 4) + 0.05 * torch.randn(
            batch.loss_mask.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        old = old * batch.loss_mask
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        m = learner.update(batch, adv.advantages.double(), adv.valid, old)
        results.append((m, {n: p.detach() - before[n] for n, p in model.named_parameters()}))
    (m0, d0), (m1, d1) = results
    assert m0["grad_norm"] > 0
    # the log-prob and loss math is float32 (whatever the model's dtype), and the micro-batches differ
    assert m1["loss"] == pytest.approx(m0["loss"], rel=1e-6, abs=1e-9)
    assert m1["grad_norm"] == pytest.approx(m0["grad_norm"], rel=1e-6)
    assert m1["entropy"] == pytest.approx(m0["entropy"], rel=1e-6)
    for n in d0:
        assert torch.allclose(d1[n], d0[n], atol=1e-8, rtol=1e-5), n


def test_micro_batches_hold_one_prompt_when_that_runs_fewer_tokens(share):
    share(True)
    batch = collate(_seqs(prompt_lens=(40, 30, 50, 20), n=8, resp=(2, 12)))
    rows = torch.arange(batch.size)
    chunks = micro_batches(batch.size, 8, prefix.order_rows(batch, rows, 8))
    assert sorted(torch.cat(chunks).tolist()) == list(range(batch.size))
    for c in chunks:  # each micro-batch is one group: its prompt runs once
        plan = prefix.prompt_owners(batch.select(c))
        assert plan is not None and len(plan[0]) == 1
    assert prefix.order_rows(batch, rows, 8, share=False).tolist() == \
        torch.argsort(batch.lengths, stable=True).tolist()
    assert prefix.shares(torch.device("cpu")) and not prefix.shares(torch.device("meta"))


def test_distinct_prompts_keep_the_length_order(share):
    share(True)
    batch = collate(_seqs(prompt_lens=(5, 6, 7, 8, 9, 10), n=1, resp=(1, 20)))
    assert prefix.prompt_owners(batch) is None
    order = prefix.order_rows(batch, torch.arange(batch.size), 2)
    assert order.tolist() == torch.argsort(batch.lengths, stable=True).tolist()


def test_long_responses_short_prompts_keep_the_length_order(share):
    """Sharing a 2-token prompt saves little; cutting by length saves more padding."""
    share(True)
    seqs = _seqs(prompt_lens=(2, 2), n=4, resp=(1, 60), seed=3)
    batch = collate(seqs)
    order = prefix.order_rows(batch, torch.arange(batch.size), 4)
    assert order.tolist() == torch.argsort(batch.lengths, stable=True).tolist()


@pytest.mark.parametrize("resp", [(0, 5), (1, 1), (2, 7)])
def test_collective_path_runs_two_forwards_and_equals_whole_rows(tiny_model_dir, share, resp):
    """Sharded over several ranks, every micro-batch takes the two-forward path (the ranks' forwards
    are collectives and must match in number), even with no prompt shared or no continuation."""
    from rft_runtime.trainer.learner import forward_logits

    model = _model(tiny_model_dir).eval()
    calls = []
    model.register_forward_pre_hook(lambda *a: calls.append(1))
    for rows in ([0, 1, 2, 3], [0]):  # shared prompts, then a single row
        seqs = _seqs(prompt_lens=(6,), n=4, resp=resp, seed=5)
        batch = collate([seqs[i] for i in rows])
        share(False)
        whole, s0 = forward_logits(model, batch)
        share(True)
        calls.clear()
        got, s1 = forward_logits(model, batch, collective=True)
        assert len(calls) == 2 and s0 == s1 and got.shape == whole.shape
        keep = batch.loss_mask[:, s0:]
        assert torch.allclose(got[keep], whole[keep], atol=1e-10, rtol=0)
