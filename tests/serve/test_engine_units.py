"""Unit tests of the engine's parts: padded KV cache, sampler, running batch, engine queue."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import DynamicCache

from rft_runtime.serve.batch import RunningBatch, Sequence
from rft_runtime.serve.engine import Engine, EngineError
from rft_runtime.serve.kv_cache import PaddedKV
from rft_runtime.serve.model import load_model
from rft_runtime.serve.protocol import SamplingParams
from rft_runtime.serve.sampler import filter_top_k_top_p, make_generator, sample_step
from tests.serve.support import CHAT_PROMPT, TINY, recompute_logprobs


@pytest.fixture(scope="module")
def lm():
    return load_model(TINY, device="cpu")


def _kv(rows: int, length: int, fill: float, real: list[int]) -> PaddedKV:
    cache = DynamicCache()
    for layer in range(2):
        cache.update(torch.full((rows, 1, length, 4), fill + layer), torch.full((rows, 1, length, 4), -fill), layer)
    mask = torch.zeros(rows, length, dtype=torch.long)
    for r, n in enumerate(real):
        mask[r, length - n:] = 1
    return PaddedKV(cache, mask)


def test_padded_kv_extend_select_trim():
    a, b = _kv(2, 3, 1.0, [3, 2]), _kv(1, 5, 2.0, [5])
    a.extend(b)
    assert a.rows == 3 and a.length == 5
    assert a.mask.tolist() == [[0, 0, 1, 1, 1], [0, 0, 0, 1, 1], [1, 1, 1, 1, 1]]
    keys = a.cache.layers[1].keys
    assert keys.shape == (3, 1, 5, 4)
    assert keys[0, 0, :2].abs().sum() == 0 and bool((keys[0, 0, 2:] == 2.0).all())  # left padding
    a.select(torch.tensor([1]))  # keep the shortest row: 3 all-padding columns go
    assert a.length == 2 and a.mask.tolist() == [[1, 1]]
    assert a.cache.layers[0].keys.shape == (1, 1, 2, 4)
    a.select(torch.tensor([0, 0]))  # rows can be repeated (n > 1 from one prefill)
    assert a.rows == 2 and a.cache.layers[0].values.shape[0] == 2


def test_filter_matches_naive_definition():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g)
    logits[0, :5] = 3.0  # ties at the k-th value are kept
    top_k = torch.tensor([3, 50, 10, 1, 50, 4])
    top_p = torch.tensor([1.0, 0.5, 0.9, 1.0, 1.0, 0.3])
    out = filter_top_k_top_p(logits, top_k, top_p)
    for r in range(6):
        row = logits[r]
        kth = row.sort(descending=True).values[top_k[r] - 1]
        kept = row >= kth
        probs = torch.softmax(torch.where(kept, row, torch.tensor(-float("inf"))), -1)
        order = probs.argsort(descending=True)
        cum, nucleus = 0.0, torch.zeros_like(kept)
        for i in order.tolist():
            nucleus[i] = True
            cum += probs[i].item()
            if cum >= top_p[r].item() - 1e-7:
                break
        assert torch.equal(torch.isfinite(out[r]), kept & nucleus), r
    assert int(torch.isfinite(out[0]).sum()) == 5


def test_seeded_sampling_ignores_batch_neighbours():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 100, generator=g)
    params = [SamplingParams(temperature=0.9, seed=s) for s in (1, 2, 3, 4)]
    full = sample_step(logits, params, [make_generator(p.seed, torch.device("cpu")) for p in params])
    for i, p in enumerate(params):
        one = sample_step(logits[i:i + 1], [p], [make_generator(p.seed, torch.device("cpu"))])
        assert one.tokens[0] == full.tokens[i]
        assert one.logprobs[0] == pytest.approx(full.logprobs[i], abs=1e-6)


def test_staggered_joins_equal_single_runs(lm):
    """Sequences joining a running batch at different steps produce what they produce alone, and their
    logprobs equal a full-forward recomputation."""
    model = lm.model

    def run(schedule):
        b = RunningBatch(model, pad_token_id=lm.pad_token_id, eos_token_ids=frozenset(), device=lm.device)
        pending, step = list(schedule), 0
        with torch.no_grad():
            while pending or len(b):
                b.step([s for t, s in pending if t == step])
                pending = [(t, s) for t, s in pending if t != step]
                step += 1

    def mk(prompt, seed, mt):
        return Sequence(prompt=prompt, params=SamplingParams(max_tokens=mt, temperature=0.7, seed=seed))

    specs = [(0, CHAT_PROMPT, 7, 6), (0, CHAT_PROMPT[:10], 3, 20), (2, CHAT_PROMPT[5:], 4, 30), (5, [5, 6, 7], 5, 10),
             (7, CHAT_PROMPT, 7, 6)]
    together = [(t, mk(p, s, m)) for t, p, s, m in specs]
    run(together)
    for _, seq in together:
        alone = mk(seq.prompt, seq.params.seed, seq.params.max_tokens)
        run([(0, alone)])
        assert alone.output == seq.output
        assert len(seq.output) == seq.params.max_tokens and seq.finish_reason == "length"
        ref = recompute_logprobs(model, seq.prompt, seq.output, 0.7)
        want = ref[torch.arange(len(seq.output)), torch.tensor(seq.output)]
        assert torch.allclose(torch.tensor(seq.logprobs), want, atol=1e-4, rtol=0)


def test_finish_on_eos_stop_token_and_stop_string(lm):
    greedy = [285, 285, 285]  # the greedy continuation of "what is"
    cases = [
        (frozenset({285}), SamplingParams(max_tokens=3, temperature=0), ("stop", None, 1)),
        (frozenset({285}), SamplingParams(max_tokens=3, temperature=0, ignore_eos=True), ("length", None, 3)),
        (frozenset(), SamplingParams(max_tokens=3, temperature=0, stop_token_ids=(285,)), ("stop", 285, 1)),
        (frozenset(), SamplingParams(max_tokens=3, temperature=0, stop=("9 1",)), ("stop", "9 1", 2)),
    ]
    for eos, params, (reason, stop_reason, n) in cases:
        b = RunningBatch(lm.model, pad_token_id=0, eos_token_ids=eos, device=lm.device,
                         decode_text=lm.codec.decode_text)
        seq = Sequence(prompt=[269, 272], params=params)
        with torch.no_grad():
            while not seq.finished:
                b.step([seq] if not seq.output else [])
        assert (seq.finish_reason, seq.stop_reason, len(seq.output)) == (reason, stop_reason, n)
        assert seq.output == greedy[:n]
        assert len(b) == 0


async def test_engine_cancel_frees_the_batch(lm):
    engine = Engine(lm, max_batch_size=4)
    engine.start()
    try:
        task = asyncio.ensure_future(engine.generate([[269, 272]], [SamplingParams(max_tokens=200, ignore_eos=True)]))
        for _ in range(200):
            await asyncio.sleep(0.01)
            if engine.num_running:
                break
        assert engine.num_running == 1
        task.cancel()
        for _ in range(500):
            await asyncio.sleep(0.01)
            if engine.num_running == 0:
                break
        assert engine.num_running == 0 and engine.num_aborted == 1
        result = await engine.generate([[269, 272]], [SamplingParams(max_tokens=2, temperature=0)])
        assert result.sequences[0].output == [285, 285]
    finally:
        engine.stop()
    with pytest.raises(EngineError):
        await engine.generate([[1]], [SamplingParams(max_tokens=1)])
