"""Shared prompts run once (rft_runtime.trainer.prefix): the log-probs, the loss and the update are
those of running every row whole, micro-batches are cut so that rows of one prompt sit together when
the cost model says that is cheaper, and continuations of very different lengths run in several
forwards."""

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


TOKENS = prefix.CostModel(token=1.0, pair=0.0, cached=0.0, forward=0.0)
"""Costs that count tokens only: the shared path runs wherever it runs fewer tokens, also on a model
so small that one forward's fixed cost would outweigh them."""


@pytest.fixture
def share(monkeypatch):
    monkeypatch.setattr(prefix, "COSTS", TOKENS)

    def set_(on: bool) -> None:
        monkeypatch.setattr(prefix, "SHARE_PROMPTS", on)
    return set_


def _model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)


def _grpo_batch():
    """Three prompts' groups of 2-8-token responses, collated, and their GRPO advantages."""
    seqs = _seqs(resp=(2, 8))
    adv = compute_advantages("grpo", torch.tensor([s.reward for s in seqs], dtype=torch.float64),
                             [s.group for s in seqs])
    return collate(seqs), adv


def _assert_same_step(m0, d0, m1, d1):
    """Two updates' metrics and parameter changes agree (the log-prob and loss math is float32 whatever
    the model's dtype, and the two ran different micro-batches or forwards)."""
    assert m0["grad_norm"] > 0
    assert m1["loss"] == pytest.approx(m0["loss"], rel=1e-6, abs=1e-9)
    assert m1["grad_norm"] == pytest.approx(m0["grad_norm"], rel=1e-6)
    for n in d0:
        assert torch.allclose(d1[n], d0[n], atol=1e-8, rtol=1e-5), n


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
    batch, adv = _grpo_batch()
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
    _assert_same_step(m0, d0, m1, d1)
    assert m1["entropy"] == pytest.approx(m0["entropy"], rel=1e-6)


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
    """Sharing a 2-token prompt saves little; cutting by length saves more padding and forwards."""
    share(True)
    seqs = _seqs(prompt_lens=(2, 2), n=4, resp=(1, 60), seed=3)
    batch = collate(seqs)
    order = prefix.order_rows(batch, torch.arange(batch.size), 4, costs=prefix.CostModel.of(None))
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


def test_cost_model_of_a_config_and_its_choices():
    from transformers import Qwen2Config

    cfg = Qwen2Config(hidden_size=256, intermediate_size=1024, num_attention_heads=4, num_key_value_heads=2)
    costs = prefix.CostModel.of(cfg)
    small = prefix.CostModel.of(None)  # a 64-wide layer
    assert costs.token > small.token > 0 and costs.pair > small.pair > 0 and costs.cached > small.cached > 0
    assert costs.forward == small.forward > 0
    # more rows, longer rows, a longer cache: each costs more
    assert costs.whole(8, 100) < costs.whole(8, 101) < costs.whole(9, 101)
    assert costs.continuation(8, 64, 10) < costs.continuation(8, 65, 10) < costs.continuation(8, 65, 11)
    # a long shared prompt with short answers runs shared; a short one with long answers whole
    seqs = _seqs(prompt_lens=(150,), n=8, resp=(1, 16), seed=2)
    assert prefix.prompt_owners(collate(seqs), costs=costs) is not None
    seqs = _seqs(prompt_lens=(4,), n=8, resp=(100, 120), seed=2)
    assert prefix.prompt_owners(collate(seqs), costs=costs) is None
    assert prefix.prompt_owners(collate(seqs), collective=True, costs=costs) is not None


def test_continuations_of_equal_length_run_in_one_forward_and_spread_ones_in_several():
    costs = prefix.CostModel.of(None)
    cost, chunks = prefix._chunks([50] * 8, 100, costs)
    assert chunks == [list(range(8))] and cost == pytest.approx(costs.continuation(8, 100, 50))
    rest = [2, 3, 3, 4, 200, 210, 220, 230]
    cost, chunks = prefix._chunks(rest, 100, costs)
    assert chunks == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert cost < costs.continuation(8, 100, 230)
    # rows whose only prediction is the prompt's need no forward at all
    cost, chunks = prefix._chunks([0, 1, 1, 40, 40], 20, costs)
    assert chunks[0] == [0, 1, 2] and cost == pytest.approx(costs.continuation(2, 20, 40))
    # many rows: the search runs over 32 boundaries, and every row is in one chunk
    rng = random.Random(0)
    cost, chunks = prefix._chunks(sorted(rng.randrange(1, 300) for _ in range(200)), 64, costs)
    assert sorted(r for c in chunks for r in c) == list(range(200)) and len(chunks) > 1


@pytest.mark.parametrize("grad", [False, True])
def test_split_continuations_equal_whole_rows(tiny_model_dir, share, monkeypatch, grad):
    """One 150-token prompt, continuations of 1 to 300 tokens: the continuation forwards are split by
    length (the rows of 1 token need none), and the logits and their gradients are those of whole rows."""
    from rft_runtime.trainer.learner import forward_logits

    share(True)
    rng = random.Random(11)
    prompt = [rng.randrange(3, 250) for _ in range(150)]
    seqs = [TrainSequence(group="g", prompt_ids=prompt, response_ids=[rng.randrange(3, 250) for _ in range(r)],
                          response_mask=[1] * r, inference_logprobs=[-1.0] * r, reward=float(i % 2), version=0,
                          truncated=False, episode_id=f"g:{i}")
            for i, r in enumerate([280, 1, 7, 300, 5, 250])]
    batch = collate(seqs)
    plan = prefix.prompt_owners(batch, costs=prefix.CostModel.of(None))
    assert plan is not None and len(plan.chunks) >= 2, plan
    model = _model(tiny_model_dir)
    calls = []
    model.register_forward_pre_hook(lambda *a: calls.append(1))
    got = {}
    for on in (False, True):
        share(on)
        model.zero_grad()
        monkeypatch.setattr(prefix, "COSTS", prefix.CostModel.of(None))  # several continuation forwards
        calls.clear()
        logits, start = forward_logits(model, batch)
        if on:
            assert len(calls) == 1 + sum(1 for c in plan.chunks if max(int(batch.lengths[r] - batch.prompt_lengths[r])
                                                                       for r in c) > 1)
            assert len(calls) >= 3
        keep = batch.loss_mask[:, start:]
        if grad:
            (logits[keep].logsumexp(-1).sum()).backward()
            got[on] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        else:
            got[on] = logits[keep].detach()
    # gradients: float64 sums over 450 positions in two different orders (a single continuation
    # forward differs from whole rows by as much)
    tol = (1e-10, 0.0) if not grad else (1e-7 * float(got[False].abs().max()), 0.0)
    assert torch.allclose(got[True], got[False], atol=tol[0], rtol=tol[1]), float((got[True] - got[False]).abs().max())


@pytest.mark.parametrize("micro,prompt_runs", [(4, 1), (2, 2)])
def test_a_pass_runs_its_prompts_in_few_forwards_and_equals_whole_rows(tiny_model_dir, share, micro, prompt_runs):
    """Rows of 3 prompts (7, 4 and 9 tokens) in micro-batches of one prompt each: an update's pass runs the
    distinct prompts of consecutive micro-batches together, at most ``micro`` of them a forward (micro 4:
    the three in one; micro 2: two and one), each run's backward after its last micro-batch's; the step is
    that of whole rows, and so are the recomputed log-probs."""
    batch, adv = _grpo_batch()
    results = []
    for on in (False, True):
        share(on)
        model = _model(tiny_model_dir)
        calls: list[bool] = []  # per forward: whether it was a prompt run (no cache given)

        def hook(m, a, kw, calls=calls):
            calls.append(kw.get("past_key_values") is None)
        model.register_forward_pre_hook(hook, with_kwargs=True)
        learner = Learner(model, LearnerConfig(micro_batch_size=micro, grad_clip=1e9),
                          torch.optim.SGD(model.parameters(), lr=1.0))
        lp = learner.logprobs(batch)
        if on:  # prompt runs (no cache given) and continuation forwards
            assert calls.count(True) == prompt_runs and calls.count(False) >= 3, calls
        calls.clear()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        m = learner.update(batch, adv.advantages.double(), adv.valid, lp + 0.05 * batch.loss_mask)
        if on:
            assert calls.count(True) == prompt_runs, calls
        else:
            assert all(calls) and len(calls) == -(-batch.size // micro)
        results.append((lp, m, {n: p.detach() - before[n] for n, p in model.named_parameters()}))
    (lp0, m0, d0), (lp1, m1, d1) = results
    assert torch.allclose(lp1, lp0, atol=1e-10, rtol=0)
    _assert_same_step(m0, d0, m1, d1)


def test_step_prompts_group_consecutive_micro_batches_by_size():
    """A micro-batch's prompts all sit in one run; a run holds at most ``size`` distinct prompts (or one
    micro-batch's, when that has more), and a prompt seen in an earlier run is run again in a later one
    rather than splitting a micro-batch over two runs."""
    seqs = _seqs(prompt_lens=(5, 5, 5, 5), n=4, resp=(2, 4), seed=1)
    batch = collate(seqs)
    keys = prefix._prompt_keys(batch)
    by_prompt = sorted(range(batch.size), key=lambda i: keys[i])
    pick = [by_prompt[0:2], by_prompt[2:4], by_prompt[4:8], by_prompt[8:16], by_prompt[14:16] + by_prompt[0:1]]
    parts = [batch.select(p) for p in pick]
    sp = prefix.StepPrompts(batch, parts, 2, TOKENS)
    assert all(p is not None for p in sp.plans)
    # prompts: A | A | B | C, D (two in one micro-batch) | D, A
    assert sp.group_of == [0, 0, 0, 1, 2]
    assert [len(g) for g in sp.groups] == [2, 2, 2] and sp.last_use == [2, 3, 4]
    assert set(sp.groups[2]) == set(prefix._row_prompts(parts[4], sp.plans[4].leaders))


def test_a_pass_of_prompt_runs_trains_a_lora_adapter_as_whole_rows_do(tiny_model_dir, share):
    """Under a LoRA adapter on the value projections the prompt run's keys need no gradient (the
    base model is frozen): their leaves get none, and the adapter's update equals that of whole rows."""
    from types import SimpleNamespace

    from rft_runtime.trainer.model_io import wrap_lora

    batch, adv = _grpo_batch()
    deltas = []
    for on in (False, True):
        share(on)
        torch.manual_seed(0)  # the same adapter initialisation
        model = wrap_lora(_model(tiny_model_dir), SimpleNamespace(rank=4, alpha=8.0, dropout=0.0,
                                                                  target_modules=["v_proj"]))
        for n, p in model.named_parameters():  # lora_B starts at zero: move it, so lora_A gets a gradient too
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.02)
        start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        learner = Learner(model, LearnerConfig(micro_batch_size=4, grad_clip=1e9),
                          torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0))
        m = learner.update(batch, adv.advantages.double(), adv.valid, None)
        assert m["grad_norm"] > 0
        deltas.append({n: p.detach() - start[n] for n, p in model.named_parameters() if n in start})
    assert deltas[0].keys() == deltas[1].keys() and any("lora_A" in n for n in deltas[0])
    for n in deltas[0]:
        assert deltas[0][n].abs().max() > 0, n
        assert torch.allclose(deltas[1][n], deltas[0][n], atol=1e-8, rtol=1e-5), n
