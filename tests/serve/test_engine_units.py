"""Unit tests of the engine's parts: slot KV cache, single-pass runner, sampler, running batch, engine queue."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import torch

from rft_runtime.serve.batch import RunningBatch, Sequence
from rft_runtime.serve.engine import Engine, EngineError
from rft_runtime.serve.kv_cache import HUGE_PAGE, SlotKVCache, advise_huge_pages
from rft_runtime.serve.model import load_model
from rft_runtime.serve.protocol import SamplingParams
from rft_runtime.serve.runner import Chunk, SlotRunner
from rft_runtime.serve.sampler import filter_top_k_top_p, inverse_cdf, row_uniforms, sample_step, seed_of
from tests.serve.support import CHAT_PROMPT, TINY, recompute_logprobs


@pytest.fixture(scope="module")
def lm():
    return load_model(TINY, device="cpu")


def test_slot_cache_alloc_grow_copy():
    c = SlotKVCache(layers=2, kv_heads=1, head_dim=4, slots=3, max_len=100, dtype=torch.float32,
                    device=torch.device("cpu"), initial_len=16)
    assert [c.alloc(), c.alloc()] == [0, 1] and c.free_slots == 1
    c.keys[1][1, 0, :16] = torch.arange(16.0).unsqueeze(1)
    c.release(0)
    assert c.alloc() == 0  # lowest free slot first: running slots stay dense
    c.ensure(20)  # doubling keeps the contents
    assert c.capacity == 32 and c.keys[1].shape == (4, 1, 32, 4)  # and the spare row
    assert torch.equal(c.keys[1][1, 0, :16, 0], torch.arange(16.0))
    c.copy_prefix(1, 2, 5)
    assert torch.equal(c.keys[1][2, 0, :5, 0], torch.arange(5.0)) and c.keys[1][2, 0, 5:].abs().sum() == 0
    with pytest.raises(ValueError):
        c.ensure(101)


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of this process's mapping that holds ``address`` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="transparent huge pages are Linux's")
def test_slot_cache_asks_for_huge_pages():
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    offered = mode.exists() and "[never]" not in mode.read_text()
    # 65 rows x 256 columns x 64 floats: 4.3 MB, two huge pages at least
    c = SlotKVCache(layers=1, kv_heads=1, head_dim=64, slots=64, max_len=512, dtype=torch.float32,
                    device=torch.device("cpu"))
    k = c.keys[0]
    assert k.numel() * 4 >= 2 * HUGE_PAGE and k.abs().sum() == 0  # zeroed after the advice
    inner = -(-k.data_ptr() // HUGE_PAGE) * HUGE_PAGE  # the first 2 MiB boundary inside the tensor
    assert ("hg" in _vm_flags(inner)) == offered  # madvise(MADV_HUGEPAGE) took
    small = torch.empty(HUGE_PAGE // 4)  # one huge page's worth: nothing to gain, left alone
    assert advise_huge_pages(small) is False
    assert advise_huge_pages(torch.empty(4 * HUGE_PAGE // 4)) is offered


def test_runner_refuses_other_architectures():
    from transformers import GPT2Config, GPT2LMHeadModel

    from rft_runtime.serve.runner import UnsupportedModel

    with pytest.raises(UnsupportedModel):
        SlotRunner(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)))


@pytest.mark.parametrize("kernels", ["native", "torch"])
def test_runner_matches_transformers_forward(lm, kernels):
    """Decodes in scattered slots and chunked prefills in one pass give transformers' logits, with either
    kernels (native: varlen decode attention and RMSNorm; torch: batched attention with its mask)."""
    model = lm.model
    runner = SlotRunner(model, kernels=kernels)
    cache = runner.make_cache(4, 256)
    a, b = CHAT_PROMPT, [5, 17, 99, 230, 4, 8, 9, 10]
    with torch.no_grad():
        # slot 2 prefills a in two chunks; slot 0 prefills b at once
        runner.forward(cache, [], [], [], [Chunk(2, a[:10], 0), Chunk(0, b, 0)], [0])
        runner.forward(cache, [], [], [], [Chunk(2, a[10:], 10)], [0])
        # one iteration: both decode a token, while slot 1 prefills b[:3]
        out = runner.forward(cache, [0, 2], [7, 9], [len(b), len(a)], [Chunk(1, b[:3], 0)], [0, 1, 4])
        ref_a = model(torch.tensor([a + [9]])).logits[0, -1]
        ref_b = model(torch.tensor([b + [7]])).logits[0, -1]
        ref_c = model(torch.tensor([b[:3]])).logits[0, -1]
    assert torch.allclose(out[0], ref_b, atol=1e-5, rtol=0)
    assert torch.allclose(out[1], ref_a, atol=1e-5, rtol=0)
    assert torch.allclose(out[2], ref_c, atol=1e-5, rtol=0)
    with torch.no_grad():  # equal-length whole prompts in scattered slots prefill in one batched attention
        c, d = [11, 12, 13, 14], [21, 22, 23, 24]
        runner.forward(cache, [], [], [], [Chunk(3, c, 0), Chunk(1, d, 0)], [3, 7])
        out = runner.forward(cache, [1, 3], [5, 6], [4, 4], [], [0, 1])
        ref_d = model(torch.tensor([d + [5]])).logits[0, -1]
        ref_c = model(torch.tensor([c + [6]])).logits[0, -1]
    assert torch.allclose(out[0], ref_d, atol=1e-5, rtol=0)
    assert torch.allclose(out[1], ref_c, atol=1e-5, rtol=0)


def _small_decoder(kind: str):
    """A randomly initialised small decoder of one of the supported architectures (no download)."""
    import transformers

    common = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128)
    config = {"llama": lambda: transformers.LlamaConfig(**common),
              "mistral": lambda: transformers.MistralConfig(**common, sliding_window=None),
              "qwen3": lambda: transformers.Qwen3Config(**common, head_dim=16)}[kind]()
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # biases and norms away from their initial 0 / 1, so that a wrong one shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("kernels", ["native", "torch"])
@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen3"])
def test_runner_matches_transformers_on_each_supported_architecture(kind, kernels):
    """The fused projections, rotary pass and norms give each architecture's own logits (Qwen3 with its
    q/k norms), for a batched prefill and a decode step."""
    model = _small_decoder(kind)
    runner = SlotRunner(model, kernels=kernels)
    cache = runner.make_cache(2, 64)
    a, b = [3, 14, 15, 92, 65, 35], [2, 71, 82, 81, 82, 84]
    with torch.no_grad():
        out = runner.forward(cache, [], [], [], [Chunk(0, a, 0), Chunk(1, b, 0)], [5, 11])
        ref = model(torch.tensor([a, b])).logits[:, -1]
        assert torch.allclose(out, ref, atol=1e-5, rtol=0)
        out = runner.forward(cache, [0, 1], [7, 9], [6, 6], [], [0, 1])
        ref = model(torch.tensor([a + [7], b + [9]])).logits[:, -1]
        assert torch.allclose(out, ref, atol=1e-5, rtol=0)


def test_runner_sees_an_in_place_weight_update(lm):
    """The engine swaps weights by copying into the model's parameters (``state_dict()[name].copy_``): the
    runner's fused q/k/v and gate/up weights and its o and down operands are those parameters' storage (on the
    CPU in float32 laid out ``[in, out]``, contiguous, the parameters transposed views of it), so it computes
    with the new weights, as transformers' forward of the updated model does."""
    from rft_runtime.serve.model import load_model as load

    fresh = load(TINY, device="cpu")
    runner = SlotRunner(fresh.model)
    cfg = fresh.model.config
    for L in runner.layers:
        for w, cols in ((L.qkv_w, cfg.hidden_size + 2 * cfg.num_key_value_heads * runner.head_dim),
                        (L.o_w, cfg.hidden_size), (L.gate_up_w, 2 * cfg.intermediate_size)):
            assert w.is_contiguous() and w.shape == (cfg.hidden_size, cols)
        assert L.down_w.is_contiguous() and L.down_w.shape == (cfg.intermediate_size, cfg.hidden_size)
    params = fresh.model.state_dict()
    torch.manual_seed(3)
    with torch.no_grad():
        for name in ("model.layers.0.self_attn.k_proj.weight", "model.layers.1.self_attn.v_proj.bias",
                     "model.layers.1.mlp.up_proj.weight", "model.layers.0.mlp.gate_proj.weight",
                     "model.layers.1.self_attn.o_proj.weight", "model.layers.0.mlp.down_proj.weight"):
            params[name].copy_(params[name] + 0.05 * torch.randn_like(params[name]))
        out = runner.forward(runner.make_cache(1, 64), [], [], [], [Chunk(0, CHAT_PROMPT, 0)], [len(CHAT_PROMPT) - 1])
        ref = fresh.model(torch.tensor([CHAT_PROMPT])).logits[0, -1]
        stale = lm.model(torch.tensor([CHAT_PROMPT])).logits[0, -1]
    assert not torch.allclose(ref, stale, atol=1e-3), "the update changed the model"
    assert torch.allclose(out[0], ref, atol=1e-5, rtol=0)


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
    seeds = [seed_of(p) for p in params]
    full = sample_step(logits, params, seeds, [3, 3, 3, 3])
    for i, p in enumerate(params):
        one = sample_step(logits[i:i + 1], [p], [seeds[i]], [3])
        assert one.tokens[0] == full.tokens[i]
        assert one.logprobs[0] == pytest.approx(full.logprobs[i], abs=1e-6)
    assert seed_of(SamplingParams(seed=5)) == seed_of(SamplingParams(seed=5))
    assert seed_of(SamplingParams()) != seed_of(SamplingParams())


def test_row_uniforms_are_uniform_and_keyed():
    n = 20000
    u = torch.tensor(row_uniforms(list(range(n)), [0] * n), dtype=torch.float64)
    assert bool((u > 0).all()) and bool((u < 1).all())
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.var()) - 1 / 12) < 0.005
    # ten equal bins, chi-square with 9 degrees of freedom far below its 0.1 % point (27.9)
    counts = torch.bincount((u * 10).long(), minlength=10).double()
    assert float(((counts - n / 10) ** 2 / (n / 10)).sum()) < 27.9
    a, b, c = row_uniforms([11, 11, 12], [0, 1, 0])
    assert len({a, b, c}) == 3 and row_uniforms([11], [0]) == [a]


def test_inverse_cdf_sampling_follows_p_and_never_picks_a_zero():
    p = torch.tensor([0.5, 0.0, 0.3, 0.0, 0.2])
    n = 20000
    picks = inverse_cdf(p.expand(n, 5), row_uniforms(list(range(n)), [3] * n))
    freq = torch.bincount(picks, minlength=5).double() / n
    assert freq[1] == 0 and freq[3] == 0
    assert torch.allclose(freq, p.double(), atol=0.02)
    # the extremes of u: the first token of positive probability, and the last one, never past the end
    assert inverse_cdf(torch.tensor([[0.0, 0.7, 0.3, 0.0]] * 2), [2.0 ** -41, 1 - 2.0 ** -41]).tolist() == [1, 2]
    # a row that does not sum to 1 is sampled as it is (scaled by its own total)
    assert inverse_cdf(torch.tensor([[0.2, 0.2]]), [0.49]).tolist() == [0]
    assert inverse_cdf(torch.tensor([[0.2, 0.2]]), [0.51]).tolist() == [1]


def test_row_keys_are_splitmix64():
    """A row's key is splitmix64's finaliser computed in Python integers; checked against the same
    function on numpy's wrapping uint64 arithmetic (no Python big integers involved)."""
    import numpy as np

    from rft_runtime.serve.sampler import _GOLDEN, _STEP, _i64, row_keys

    def mix(x):
        with np.errstate(over="ignore"):
            x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            return x ^ (x >> np.uint64(31))

    seeds = [0, 1, -1, 2**63 - 1, -2**63, _i64(0xDEADBEEFCAFEF00D), 123456789]
    steps = [0, 1, 4095, 7, 0, 99999, 3]
    with np.errstate(over="ignore"):
        x = (np.array(seeds, dtype=np.int64).astype(np.uint64) * np.uint64(_GOLDEN % 2**64)
             + np.array(steps, dtype=np.uint64) * np.uint64(_STEP % 2**64) + np.uint64(1))
    assert row_keys(seeds, steps) == [_i64(int(v)) for v in mix(x)]


def test_staggered_joins_equal_single_runs(lm):
    """Sequences joining a running batch at different steps produce what they produce alone, and their
    logprobs equal a full-forward recomputation."""
    model = lm.model

    def run(schedule):
        b = RunningBatch(model, pad_token_id=lm.pad_token_id, eos_token_ids=frozenset(), device=lm.device,
                         max_slots=8, prefill_tokens=16)  # small budget: long prompts prefill in chunks
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


async def test_engine_serves_bfloat16():
    """--dtype bfloat16: the slot cache takes the model's dtype; logprobs stay float32 and finite."""
    engine = Engine(load_model(TINY, device="cpu", dtype="bfloat16"), max_batch_size=4)
    engine.start()
    try:
        assert engine._batch.cache.keys[0].dtype == torch.bfloat16
        params = [SamplingParams(max_tokens=5, temperature=0.7, seed=s, ignore_eos=True) for s in (1, 2, 3)]
        result = await engine.generate([CHAT_PROMPT, CHAT_PROMPT, [269, 272]], params)
        for s in result.sequences:
            assert len(s.output) == 5 and all(lp <= 0 and lp > -1e4 for lp in s.logprobs)
    finally:
        engine.stop()


def test_serve_enforce_eager_cuda_graphs_pacing_and_kv_cache_dtype_reach_the_engine():
    """``rft serve --enforce-eager``, ``--engine-pacing`` and ``--kv-cache-dtype`` parse, and build_engine hands
    the graph setting and the cache type to the runner and the pacing to the engine."""
    from rft_runtime.serve.server import build_engine, build_parser

    assert build_parser().parse_args(["--model", "m", "--enforce-eager"]).enforce_eager
    assert not build_parser().parse_args(["--model", "m"]).enforce_eager
    kwargs = dict(engine_process=False, max_batch_size=2, load_kwargs={"device": "cpu"})
    fixed = build_engine(str(TINY), cuda_graphs="uncaptured", **kwargs)._batch.runner.graphs
    assert fixed is not None and not fixed.capture
    assert build_engine(str(TINY), cuda_graphs="never", **kwargs)._batch.runner.graphs is None
    args = build_parser().parse_args(["--model", "m", "--engine-pacing", "never"])
    assert args.engine_pacing == "never" and build_parser().parse_args(["--model", "m"]).engine_pacing is None
    assert build_engine(str(TINY), pacing="never", **kwargs).pacing == "never"
    assert build_engine(str(TINY), **kwargs).pacing == "auto"
    # --kv-cache-dtype: auto (None) keeps the model's float32; another type reaches the cache; others are refused
    assert build_parser().parse_args(["--model", "m"]).kv_cache_dtype is None
    assert build_parser().parse_args(["--model", "m", "--kv-cache-dtype", "bfloat16"]).kv_cache_dtype == "bfloat16"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--model", "m", "--kv-cache-dtype", "fp8"])
    assert build_engine(str(TINY), **kwargs)._batch.cache.keys[0].dtype == torch.float32
    assert build_engine(str(TINY), kv_cache_dtype="bfloat16", **kwargs)._batch.cache.keys[0].dtype == torch.bfloat16


def test_the_apis_builtin_engine_options_are_rft_serves():
    """rft_api's table of the builtin engine's options (what inference.extraArgs may pass, checked by the CRD and
    the operator) is rft serve's parser: the same names, flags where it has flags, values it takes where the
    table's pattern matches them, choices it refuses where the pattern does; each option of the parser is
    either in the table, reserved (set from other fields) or --policy-version."""
    import argparse
    import re

    from rft_api.spec import BUILTIN_ENGINE_OPTIONS, RESERVED_ENGINE_ARGS
    from rft_runtime.serve.server import build_parser

    parser = build_parser()
    options = {o: a for a in parser._actions for o in a.option_strings}
    assert set(options) - {"-h", "--help"} == set(BUILTIN_ENGINE_OPTIONS) | (set(RESERVED_ENGINE_ARGS) & set(options)) \
        | {"--policy-version"}
    for name, takes in BUILTIN_ENGINE_OPTIONS.items():
        action = options[name]
        if takes is None:
            assert action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction), name
            parser.parse_args(["--model", "m", name])
            continue
        pattern = takes[0]
        assert action.nargs is None, name
        for choice in action.choices or ():
            assert re.fullmatch(pattern, choice), (name, choice)
        for value in ("7", "0.5", "cpu", "cuda:1", "never", "float16", "debug", "fp8", "0", "-1", ""):
            if re.fullmatch(pattern, value):
                parser.parse_args(["--model", "m", name, value])  # what the API accepts, rft serve takes
            elif action.choices:
                with pytest.raises(SystemExit):
                    parser.parse_args(["--model", "m", name, value])


def test_null_sampling_fields_mean_their_defaults():
    """OpenAI clients send ``null`` for an unset field: the request gets the default, never ``None``."""
    from rft_runtime.serve.protocol import parse_completion

    req, _ = parse_completion({"prompt": [1, 2], "n": None, "temperature": None, "top_k": None, "top_p": None,
                               "max_tokens": None}, vocab_size=64)
    plain, _ = parse_completion({"prompt": [1, 2]}, vocab_size=64)
    assert req == plain
    assert req.n == 1
