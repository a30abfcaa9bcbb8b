"""Decode iterations in fixed shapes, replayed from CUDA graphs (:mod:`rft_runtime.serve.graphs`).

On the CPU the fixed-shape iteration runs uncaptured (``cuda_graphs="uncaptured"``): its padding rows,
spare-row writes, width buckets and masks are checked against transformers and the eager path. With a
GPU the same checks run captured, plus what only a graph can get wrong: replays after the inputs
change, a cache that grows, weights updated in place. Nothing here imports the HTTP side or the API
models, so the file runs on a bare GPU machine (``pytest --noconftest``).
"""

from __future__ import annotations

import pytest
import torch

from rft_runtime.serve import graphs
from rft_runtime.serve.batch import RunningBatch
from rft_runtime.serve.protocol import SamplingParams
from rft_runtime.serve.runner import Chunk, SlotRunner
from rft_runtime.serve.sequence import Sequence

CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


def small_decoder(kind: str = "qwen2", device: str = "cpu", dtype: torch.dtype = torch.float32, positions: int = 1024):
    """A randomly initialised small decoder (no download), norms and biases away from their initial values."""
    import transformers

    common = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=positions)
    config = {"qwen2": lambda: transformers.Qwen2Config(**common),
              "llama": lambda: transformers.LlamaConfig(**common),
              "qwen3": lambda: transformers.Qwen3Config(**common, head_dim=16)}[kind]()
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.uniform_(-0.2, 0.2)
    return model.to(device=device, dtype=dtype)


def reference(model, ids: list[int]) -> torch.Tensor:
    """transformers' last-position logits for ``ids``."""
    with torch.no_grad():
        return model(torch.tensor([ids], device=model.device)).logits[0, -1].float()


def test_buckets_and_setting():
    assert [graphs.span_bucket(s, 256) for s in (1, 3, 5, 17, 33, 100, 129, 200)] == [1, 4, 8, 24, 48, 112, 192, 256]
    assert graphs.span_bucket(30, 30) == 30 and graphs.span_bucket(5, 6) == 6  # never past the cache's slots
    assert [graphs.width_bucket(w, 4096) for w in (1, 256, 257, 1000, 4096)] == [256, 256, 512, 1024, 4096]
    assert graphs.width_bucket(100, 128) == 128
    for bad in ((0, 4), (5, 4)):
        with pytest.raises(ValueError):
            graphs.span_bucket(*bad)
    with pytest.raises(ValueError):
        graphs.width_bucket(300, 256)
    with pytest.raises(ValueError, match="cuda_graphs must be one of auto, never, uncaptured; got 'yes'"):
        graphs.setting("yes")


def test_env_setting_is_checked(monkeypatch):
    monkeypatch.setenv(graphs.ENV, "always")
    with pytest.raises(ValueError, match=r"\$RFT_ENGINE_CUDA_GRAPHS must be one of"):
        SlotRunner(small_decoder())
    monkeypatch.setenv(graphs.ENV, "never")
    assert SlotRunner(small_decoder(device="cuda" if CUDA else "cpu")).graphs is None


def test_auto_captures_on_cuda_only():
    runner = SlotRunner(small_decoder(), cuda_graphs="auto")
    assert runner.graphs is None  # on the CPU, auto runs every iteration eagerly
    if CUDA:
        assert SlotRunner(small_decoder(device="cuda"), cuda_graphs="auto").graphs.capture


def _scattered_decodes(model, mode: str, kernels: str = "torch", kv_cache_dtype: str | None = None
                       ) -> tuple[SlotRunner, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Prompts in slots 0, 1, 3 and 5 (2 and 4 free, 4 once used); decode-only iterations of some of them
    while the others wait, then of those. Returns each decoded row's (logits, transformers' logits)."""
    runner = SlotRunner(model, kernels=kernels, cuda_graphs=mode, kv_cache_dtype=kv_cache_dtype)
    cache = runner.make_cache(6, 1024)
    texts = {0: [3, 14, 15, 92, 65], 1: [2, 71, 82], 3: [5, 17, 89, 23, 4, 8, 9], 4: [44, 45], 5: [60, 61, 62, 63]}
    pairs = []
    with torch.no_grad():
        runner.forward(cache, [], [], [], [Chunk(s, t, 0) for s, t in texts.items()], [0])
        del texts[4]  # slot 4 is free again; its old keys stay in the cache
        rounds = [[0, 3], [0, 3, 5], [1], [0, 1, 3, 5], [5]]
        for r, slots in enumerate(rounds):
            toks = [(7 * s + r) % 90 + 3 for s in slots]
            out = runner.forward(cache, slots, toks, [len(texts[s]) for s in slots], [], list(range(len(slots))))
            for i, s in enumerate(slots):
                texts[s] = texts[s] + [toks[i]]
                pairs.append((out[i].float(), reference(model, texts[s])))
        # a long row: past the first width bucket (256 columns) while a short one decodes beside it
        long_prompt = [(11 * i) % 90 + 3 for i in range(300)]
        runner.forward(cache, [], [], [], [Chunk(2, long_prompt, 0)], [0])
        texts[2] = long_prompt
        out = runner.forward(cache, [1, 2], [9, 10], [len(texts[1]), len(texts[2])], [], [1, 0])
        texts[1], texts[2] = texts[1] + [9], texts[2] + [10]
        pairs += [(out[0].float(), reference(model, texts[2])), (out[1].float(), reference(model, texts[1]))]
    return runner, pairs


@pytest.mark.parametrize("kernels", ["torch", "native"])
@pytest.mark.parametrize("kind", ["qwen2", "llama", "qwen3"])
def test_fixed_shape_decode_matches_transformers(kind, kernels):
    """Decoding rows in scattered slots, some slots holding waiting sequences or stale keys, rows past
    256 columns, logit rows asked for out of order: the fixed-shape iteration gives transformers' logits,
    and no padding row writes into a slot (the waiting sequences decode correctly afterwards)."""
    runner, pairs = _scattered_decodes(small_decoder(kind), "uncaptured", kernels)
    g = runner.graphs
    assert g is not None and g.replays == 6
    # (rows, columns): (4, 256), (6, 256), (2, 256), then the cache grew to 512 columns: (4, 512)
    assert g.builds == 4 and sorted(g._graphs) == [(4, 512)]
    for got, want in pairs:
        assert torch.allclose(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_kv_cache(dtype):
    """``kv_cache_dtype`` float16 / bfloat16 under a float32 model: the cache holds that type, and the three
    decode paths (the native kernel, torch's batched attention, the fixed-shape iteration) read the same rounded
    keys and values; against transformers' float32 logits they differ by what the rounding of the cached keys and
    values makes (float16's 11-bit significand, bfloat16's 8), and no more. The paths' float32 keys can differ in
    their last bit (the native rotary embedding fuses its multiply-adds), which rounds a key that lies on a
    boundary of the cache's type to its neighbour: so the paths agree within a quarter of what the rounding itself
    makes against transformers (one such key moves a bfloat16 cache's logits by about a fifth of it), where a path
    reading unrounded or other values would differ by about all of it."""
    model = small_decoder("qwen2")
    results = {}
    for mode, kernels in (("never", "native"), ("never", "torch"), ("uncaptured", "torch")):
        runner, pairs = _scattered_decodes(model, mode, kernels, kv_cache_dtype=dtype)
        assert runner.kv_dtype == getattr(torch, dtype) and runner.make_cache(1, 16).keys[0].dtype == runner.kv_dtype
        results[(mode, kernels)] = pairs
    native = results[("never", "native")]
    worst = max((got - want).abs().max().item() for got, want in native)
    assert 1e-6 < worst < {"float16": 5e-4, "bfloat16": 4e-3}[dtype]  # rounded, but no more than that
    for other in (results[("never", "torch")], results[("uncaptured", "torch")]):
        for (got, _), (want, _) in zip(other, native):
            assert torch.allclose(got, want, atol=max(1e-5, worst / 4), rtol=0)


def test_kv_cache_dtype_is_checked(monkeypatch):
    """auto is the model's dtype; a type the engine does not store is refused, naming the argument or the
    variable it came from."""
    from rft_runtime.serve.runner import resolve_kv_cache_dtype

    assert resolve_kv_cache_dtype(None, torch.bfloat16) == torch.bfloat16
    assert resolve_kv_cache_dtype("float16", torch.float32) == torch.float16
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, float32, float16, bfloat16; got 'fp8'"):
        SlotRunner(small_decoder(), kv_cache_dtype="fp8")
    monkeypatch.setenv("RFT_ENGINE_KV_CACHE_DTYPE", "half")
    with pytest.raises(ValueError, match=r"\$RFT_ENGINE_KV_CACHE_DTYPE must be one of .*; got 'half'"):
        resolve_kv_cache_dtype(None, torch.float32)
    monkeypatch.setenv("RFT_ENGINE_KV_CACHE_DTYPE", "bfloat16")
    assert resolve_kv_cache_dtype(None, torch.float32) == torch.bfloat16


def test_running_batch_same_tokens_with_fixed_shapes():
    """The engine's batch, sequences joining and leaving: the same tokens and (to float rounding) the same
    logprobs whether its decode iterations run eagerly or in fixed shapes."""
    model = small_decoder()

    def run(mode: str) -> list[Sequence]:
        b = RunningBatch(model, pad_token_id=0, eos_token_ids=frozenset(), device=torch.device("cpu"), max_slots=8,
                         max_len=512, cuda_graphs=mode)
        seqs = [Sequence(prompt=[3 + i, 40 + i, 7], params=SamplingParams(max_tokens=5 + 7 * i, temperature=0.8,
                                                                          seed=i, logprobs=2)) for i in range(6)]
        schedule = {0: seqs[:3], 2: seqs[3:5], 9: seqs[5:]}
        step = 0
        while step in schedule or len(b) or step < max(schedule):
            b.step(schedule.get(step, []))
            step += 1
        return seqs

    eager, fixed = run("never"), run("uncaptured")
    for a, b in zip(eager, fixed):
        assert a.output == b.output and len(a.output) == a.params.max_tokens
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
        assert [[t for t, _ in alts] for alts in a.top] == [[t for t, _ in alts] for alts in b.top]


# ---------------------------------------------------------------------------------------------- on a GPU


@gpu
@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_captured_graphs_match_transformers(kind):
    """Captured and replayed, float32: transformers' logits for every decoded row, a graph per shape."""
    runner, pairs = _scattered_decodes(small_decoder(kind, device="cuda"), "auto")
    g = runner.graphs
    assert g is not None and g.capture and g.disabled is None, g and g.disabled
    assert g.builds == 4 and g.replays == 6
    for got, want in pairs:
        assert torch.allclose(got, want, atol=1e-4, rtol=0), (got - want).abs().max()


@gpu
def test_captured_graphs_bfloat16_match_eager():
    """bfloat16 on the GPU: the replayed iteration's logits against the eager path's on the same cache."""
    model = small_decoder(device="cuda", dtype=torch.bfloat16)
    captured, pairs_c = _scattered_decodes(model, "auto")
    _, pairs_e = _scattered_decodes(model, "never")
    assert captured.graphs.disabled is None and captured.graphs.builds == 4
    for (got, ref), (eager, _) in zip(pairs_c, pairs_e):
        assert (got - eager).abs().max() <= 0.05 * ref.abs().max(), ((got - eager).abs().max(), ref.abs().max())


@gpu
def test_graphs_follow_in_place_weight_updates_and_cache_growth():
    """A weight copied into the parameters (as the engine swaps weights) is read by the existing graphs; a
    cache that grows past its capacity drops them and captures anew."""
    model = small_decoder(device="cuda")
    runner = SlotRunner(model, cuda_graphs="auto")
    cache = runner.make_cache(2, 1024)
    cache_cap = cache.capacity
    prompt = [3, 4, 5, 6]
    with torch.no_grad():
        runner.forward(cache, [], [], [], [Chunk(0, prompt, 0)], [0])
        runner.forward(cache, [0], [7], [4], [], [0])
        assert runner.graphs.builds == 1
        p = dict(model.named_parameters())["model.layers.1.mlp.up_proj.weight"]
        p.copy_(p + 0.05 * torch.randn_like(p))
        out = runner.forward(cache, [0], [8], [5], [], [0])
        assert runner.graphs.builds == 1 and runner.graphs.replays == 2
        assert torch.allclose(out[0].float(), reference(model, prompt + [7, 8]), atol=1e-4, rtol=0)
        long_prompt = [(5 * i) % 90 + 3 for i in range(cache_cap + 10)]  # grows the cache
        runner.forward(cache, [], [], [], [Chunk(1, long_prompt, 0)], [0])
        assert cache.capacity > cache_cap
        out = runner.forward(cache, [0, 1], [9, 9], [6, len(long_prompt)], [], [0, 1])
    assert runner.graphs.builds == 2 and runner.graphs.disabled is None
    assert torch.allclose(out[0].float(), reference(model, prompt + [7, 8, 9]), atol=1e-4, rtol=0)
    assert torch.allclose(out[1].float(), reference(model, long_prompt + [9]), atol=1e-4, rtol=0)


@gpu
def test_running_batch_on_gpu_same_tokens_captured_or_eager():
    """The engine's batch on the GPU in float32, sequences joining and leaving: greedy tokens and logprobs
    the same with graphs as without."""
    model = small_decoder(device="cuda")

    def run(mode: str) -> tuple[list[Sequence], RunningBatch]:
        b = RunningBatch(model, pad_token_id=0, eos_token_ids=frozenset(), device=torch.device("cuda"), max_slots=8,
                         max_len=512, cuda_graphs=mode)
        seqs = [Sequence(prompt=[3 + i, 40 + i, 7], params=SamplingParams(max_tokens=5 + 7 * i, temperature=0))
                for i in range(6)]
        schedule = {0: seqs[:3], 2: seqs[3:5], 9: seqs[5:]}
        step = 0
        while step in schedule or len(b) or step < max(schedule):
            b.step(schedule.get(step, []))
            step += 1
        return seqs, b

    (eager, _), (fixed, batch) = run("never"), run("auto")
    assert batch.runner.graphs.replays > 20 and batch.runner.graphs.disabled is None
    for a, b in zip(eager, fixed):
        assert a.output == b.output
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


def test_a_new_cache_drops_the_shapes_of_the_old():
    """The fixed shapes belong to the cache they were built for: a runner given another cache builds
    anew, and each cache's sequences decode correctly (uncaptured here; captured graphs read the tensors
    they were captured with, so this is what keeps them from reading another cache's)."""
    model = small_decoder()
    runner = SlotRunner(model, cuda_graphs="uncaptured")
    a, b = runner.make_cache(2, 256), runner.make_cache(2, 256)
    with torch.no_grad():
        runner.forward(a, [], [], [], [Chunk(0, [3, 4, 5], 0)], [0])
        runner.forward(b, [], [], [], [Chunk(0, [7, 8], 0)], [0])
        out_a = runner.forward(a, [0], [6], [3], [], [0])
        out_b = runner.forward(b, [0], [9], [2], [], [0])
        out_a2 = runner.forward(a, [0], [10], [4], [], [0])
    assert runner.graphs.builds == 3
    assert torch.allclose(out_a[0], reference(model, [3, 4, 5, 6]), atol=1e-5, rtol=0)
    assert torch.allclose(out_b[0], reference(model, [7, 8, 9]), atol=1e-5, rtol=0)
    assert torch.allclose(out_a2[0], reference(model, [3, 4, 5, 6, 10]), atol=1e-5, rtol=0)
