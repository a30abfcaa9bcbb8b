"""The engine's native kernels (rft_runtime.serve.native), built with this machine's C compiler: the varlen
decode attention checked against softmax attention computed row by row in float64; RMSNorm, the rotary
embedding and the gated activation against torch's and transformers' own."""

from __future__ import annotations

import os
import platform
import tempfile

import pytest
import torch

from rft_runtime.serve import native
from rft_runtime.serve.model import load_model
from rft_runtime.serve.runner import SlotRunner
from tests.serve.support import TINY


@pytest.fixture(scope="module")
def kernel() -> native.Kernels:
    path, parallel = native.build()
    return native.Kernels(path, parallel)


def reference(q, keys, values, slots, lengths, scale):
    """Row by row, each row only up to its own length, in float64."""
    out = torch.empty(q.shape, dtype=torch.float64)
    for i, (slot, n) in enumerate(zip(slots.tolist(), lengths.tolist())):
        k, v = keys[slot, :, :n].double(), values[slot, :, :n].double()  # [kv, n, hd]
        scores = torch.einsum("hgd,htd->hgt", q[i].double(), k) * scale
        out[i] = torch.einsum("hgt,htd->hgd", scores.softmax(-1), v)
    return out


def case(kv_heads, group, hd, rows=7, capacity=48, seed=0, q_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(rows + 3, kv_heads, capacity, hd, generator=g)
    values = torch.randn(rows + 3, kv_heads, capacity, hd, generator=g)
    # rows in scattered, unordered slots (slot 1 and the last two not decoding), lengths from 1 to capacity
    slots = torch.tensor([5, 0, 3, 2, 9, 4, 7][:rows], dtype=torch.long)
    lengths = torch.tensor([1, capacity, 2, 17, 5, capacity - 1, 33][:rows], dtype=torch.long)
    # queries, new keys and new values as strided views of one wider tensor, as the runner passes them
    wide = torch.randn(rows, kv_heads * (group + 2) + 3, hd, generator=g)
    q = (wide[:, : kv_heads * group] * q_scale).view(rows, kv_heads, group, hd)
    k_new = wide[:, kv_heads * group: kv_heads * (group + 1)]
    v_new = wide[:, kv_heads * (group + 1): kv_heads * (group + 2)]
    return q, k_new, v_new, keys, values, slots, lengths, hd ** -0.5


def attend(kernel, q, k_new, v_new, keys, values, slots, lengths, scale):
    """The kernel's output, checked to have written the new keys and values (rounded to the cache's dtype as
    torch rounds them), and the float64 reference."""
    want_k, want_v = keys.clone(), values.clone()
    want_k[slots, :, lengths - 1] = k_new.to(keys.dtype)
    want_v[slots, :, lengths - 1] = v_new.to(values.dtype)
    out = kernel.decode_attention(q, k_new, v_new, keys, values, slots, lengths, scale)
    assert torch.equal(keys, want_k) and torch.equal(values, want_v)
    return out, reference(q, keys, values, slots, lengths, scale)


@pytest.mark.parametrize("kv_heads,group,hd", [(1, 2, 64), (2, 2, 16), (2, 7, 64), (1, 1, 128), (3, 2, 12),
                                               (2, 1, 200), (1, 4, 8)])
def test_kernel_equals_row_by_row_attention(kernel, kv_heads, group, hd):
    """Vector path (head sizes that are multiples of 8, the 128-wide blocks of 200) and scalar path (12);
    grouped queries; unordered, scattered slots; lengths 1 to the capacity; strided queries."""
    out, ref = attend(kernel, *case(kv_heads, group, hd))
    assert out.shape == ref.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kv_heads,group,hd", [(1, 2, 64), (2, 7, 64), (3, 2, 12), (2, 1, 200)])
def test_half_precision_cache(kernel, dtype, kv_heads, group, hd):
    """A float16 or bfloat16 cache (``kv_cache_dtype``): the new keys and values are stored rounded to
    nearest-even as torch's conversion rounds them (bit for bit: ties, values beyond float16's range,
    infinities, subnormals), and the attention over the stored values, read as float32, is the float64
    reference's of those values."""
    q, k_new, v_new, keys, values, slots, lengths, scale = case(kv_heads, group, hd)
    k_new = k_new.clone()
    # row 0 has length 1 (it attends to its new key alone, whose output is then not finite: not compared)
    k_new[0, 0, :7] = torch.tensor([1 + 2 ** -11, 1 + 3 * 2 ** -11, 1 + 2 ** -8 + 2 ** -9, 70000.0, float("inf"),
                                    -float("inf"), 1e-40])
    out, ref = attend(kernel, q, k_new, v_new, keys.to(dtype), values.to(dtype), slots, lengths, scale)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double()[1:], ref[1:], rtol=0, atol=2e-6)


@pytest.fixture(scope="module")
def portable_kernel(tmp_path_factory) -> native.Kernels:
    """The kernels as a compiler without ``_Float16`` or F16C builds them (GCC 11 on x86): float16 by the
    library's own bit manipulations."""
    src = tmp_path_factory.mktemp("portable") / "kernels.c"
    src.write_text("#define RFT_PORTABLE_HALF 1\n" + native.SOURCE.read_text())
    return native.Kernels(*native.build(src))


def _halves_and_floats(dtype):
    """Every 16-bit pattern of ``dtype`` (as float32), then floats that round: random ones over the whole
    exponent range (half's subnormals and overflow included), and exact ties between neighbours."""
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype).float()
    g = torch.Generator().manual_seed(1)
    spread = torch.randn(200_000, generator=g) * torch.exp2(torch.randint(-40, 40, (200_000,), generator=g).float())
    finite = every[torch.isfinite(every)].unique()
    ties = (finite[:-1].double() + finite[1:].double()).div(2).float()  # exactly halfway: representable in float32
    return every, torch.cat([spread, ties, torch.tensor([65519.0, 65520.0, -65520.0, 3e38, 1e-45])])


@pytest.mark.parametrize("build", ["native", "portable"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cache_conversions_are_torchs(kernel, portable_kernel, build, dtype):
    """What the attention stores for a float (``kv_convert``) is torch's rounding of it, bit for bit, and what
    it reads back is the stored value exactly: every 16-bit pattern round-trips, NaN stays NaN; with the
    compiler's conversions and with the portable ones."""
    k = kernel if build == "native" else portable_kernel
    every, rounded = _halves_and_floats(dtype)
    stored, back = k.kv_convert(every, dtype)
    nan = torch.isnan(every)
    assert torch.equal(stored.view(torch.int16)[~nan], every.to(dtype).view(torch.int16)[~nan])
    assert torch.isnan(back[nan]).all() and torch.equal(back[~nan], every[~nan])
    stored, back = k.kv_convert(rounded, dtype)
    assert torch.equal(stored.view(torch.int16), rounded.to(dtype).view(torch.int16))
    assert torch.equal(back, rounded.to(dtype).float())


def test_portable_half_cache_attends_as_the_native_one(kernel, portable_kernel):
    """The attention over a float16 cache gives the same output with the portable conversions."""
    args = case(2, 2, 64)
    q, k_new, v_new, keys, values, slots, lengths, scale = args
    a = kernel.decode_attention(q, k_new, v_new, keys.half(), values.half(), slots, lengths, scale)
    b = portable_kernel.decode_attention(q, k_new, v_new, keys.half(), values.half(), slots, lengths, scale)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kv_heads,group,hd", [(1, 2, 64), (2, 3, 16), (3, 2, 12)])
def test_packed_projections_give_the_same_bits(kernel, kv_heads, group, hd):
    """``decode_attention_packed`` reads queries, new keys and new values where the fused q/k/v projection
    left them (strided tokens, beyond the decoding ones too): the same output and cache as the views."""
    g = torch.Generator().manual_seed(hd)
    heads, rows = kv_heads * group, 7
    qkv = torch.randn(rows + 2, heads + 2 * kv_heads + 1, hd, generator=g)[:, : heads + 2 * kv_heads]
    _, _, _, keys, values, slots, lengths, scale = case(kv_heads, group, hd, rows=rows)
    keys2, values2 = keys.clone(), values.clone()
    out = kernel.decode_attention_packed(qkv, rows, heads, keys, values, slots, lengths, scale)
    want = kernel.decode_attention(qkv[:rows, :heads].reshape(rows, kv_heads, group, hd),
                                   qkv[:rows, heads: heads + kv_heads], qkv[:rows, heads + kv_heads:], keys2, values2,
                                   slots, lengths, scale)
    assert torch.equal(out, want) and torch.equal(keys, keys2) and torch.equal(values, values2)
    with pytest.raises(ValueError, match="decode attention: qkv must be float32"):
        kernel.decode_attention_packed(qkv, rows, heads + 1, keys, values, slots, lengths, scale)
    with pytest.raises(ValueError, match="decode attention: qkv must be float32"):
        kernel.decode_attention_packed(qkv.transpose(1, 2), rows, heads, keys, values, slots, lengths, scale)


def test_kernel_with_scores_far_apart(kernel):
    """Scores that differ by far more than float32's exp range: the small ones give 0, none gives NaN
    (scores of magnitude ~400 carry float32 rounding of ~1e-5 into the weights)."""
    out, ref = attend(kernel, *case(1, 2, 64, q_scale=40.0))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=2e-5)


def test_prefetching_the_next_row_changes_no_bits(kernel):
    """While it attends a (row, KV head) pair the kernel prefetches the next pair's keys and values, only while
    four times a row's keys fit the core's L2 (a row of 4096 positions of 128 floats does not fit anywhere);
    with a longer row in the call, each row prefetches its own columns further on instead: the short rows come
    out bit for bit the same whichever way they were prefetched, and each row is the reference's."""
    q, k_new, v_new, keys, values, slots, lengths, scale = case(2, 2, 128, capacity=4096)
    lengths = torch.tensor([1, 4096, 2, 17, 5, 300, 33])
    short = torch.tensor([0, 2, 3, 4, 5, 6])
    alone = kernel.decode_attention(q[short], k_new[short], v_new[short], keys.clone(), values.clone(),
                                    slots[short], lengths[short], scale)
    out, ref = attend(kernel, q, k_new, v_new, keys, values, slots, lengths, scale)
    assert torch.equal(out[short], alone)
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=2e-6)


def test_kernel_threads_give_the_same_bits(kernel):
    """Split over OpenMP threads (a call large enough to be split), every (row, head) is computed as by one
    thread."""
    if not kernel.parallel:
        pytest.skip("the compiler here has no OpenMP")
    args = case(2, 2, 64, capacity=256)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel.decode_attention(*args)
        torch.set_num_threads(2)
        two = kernel.decode_attention(*args)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


@pytest.fixture
def no_cache(tmp_path, monkeypatch):
    """HOME and the temporary directory of this test only: no library built before is found."""
    for d in ("home", "tmp"):
        (tmp_path / d).mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return tmp_path


def test_build_once_per_source_and_machine(no_cache, monkeypatch):
    """Built into $RFT_NATIVE_CACHE, renamed into place whole; a second build finds it."""
    cache = no_cache / "cache"
    monkeypatch.setenv("RFT_NATIVE_CACHE", str(cache))
    path, _ = native.build()
    assert path.parent == cache and path.name.startswith("kernels-") and path.suffix == ".so"
    stamp = path.stat().st_mtime_ns
    again, _ = native.build()
    assert again == path and path.stat().st_mtime_ns == stamp
    assert [p.name for p in cache.iterdir()] == [path.name]  # no temporary file left


def test_build_in_the_next_writable_directory(no_cache, monkeypatch):
    """Cache directories that cannot be created (a read-only root filesystem) are skipped: the temporary
    directory is the last resort."""
    blocker = no_cache / "file"
    blocker.write_text("")
    monkeypatch.setenv("RFT_NATIVE_CACHE", str(blocker / "sub"))
    monkeypatch.setenv("HOME", str(blocker))
    path, _ = native.build()
    assert path.parent == no_cache / "tmp" / f"rft-operator-native-{os.getuid()}" and path.is_file()


def test_no_compiler(monkeypatch):
    """auto falls back to torch's attention; native is refused naming the setting and the cause."""
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(native.NativeUnavailable, match="no C compiler"):
        native.build()
    assert native.kernels.__wrapped__("auto") is None
    with pytest.raises(native.NativeUnavailable, match=r"RFT_ENGINE_KERNELS=native: no C compiler"):
        native.kernels.__wrapped__("native")


def test_a_failing_compiler_is_reported(tmp_path, no_cache, monkeypatch):
    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo fake 1.0; exit 0; }\necho 'no such flag' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.setenv("RFT_NATIVE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(native.NativeUnavailable, match="the C compiler failed: .*no such flag"):
        native.build()
    assert not [p for p in (tmp_path / "cache").iterdir()]


def test_setting_is_checked(monkeypatch):
    assert native.setting("torch") == "torch"
    with pytest.raises(ValueError, match="kernels must be one of auto, native, torch; got 'fast'"):
        native.setting("fast")
    monkeypatch.setenv(native.ENV, "fast")
    with pytest.raises(ValueError, match=r"\$RFT_ENGINE_KERNELS must be one of"):
        native.setting()
    monkeypatch.setenv(native.ENV, "torch")
    assert native.setting() == "torch"
    monkeypatch.delenv(native.ENV)
    assert native.setting() == "auto"


def test_runner_uses_the_kernel_where_it_applies():
    """float32 on the CPU: the kernel; bfloat16: torch's attention under auto, a refusal naming the reason
    under native."""
    lm = load_model(TINY, device="cpu")
    runner = SlotRunner(lm.model, kernels="auto")
    assert runner.kernels is not None
    # transformers' SiLU module is known to be F.silu: the native gated activation replaces it
    assert all(layer.act is torch.nn.functional.silu for layer in runner.layers)
    assert SlotRunner(lm.model, kernels="torch").kernels is None
    half = load_model(TINY, device="cpu", dtype="bfloat16")
    assert SlotRunner(half.model, kernels="auto").kernels is None
    with pytest.raises(native.NativeUnavailable, match="need float32 on the CPU"):
        SlotRunner(half.model, kernels="native")


@pytest.mark.parametrize("rows,width", [(1, 128), (32, 128), (300, 896), (5, 13)])
def test_rms_norm_matches_torch(kernel, rows, width):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(1, rows, width, generator=g) * 3
    w = torch.rand(width, generator=g) + 0.5
    out = kernel.rms_norm(x, w, 1e-6)
    torch.testing.assert_close(out, torch.nn.functional.rms_norm(x, (width,), w, 1e-6), rtol=2e-6, atol=1e-6)
    strided = torch.randn(rows, 2 * width, generator=g)[:, ::2]  # copied to contiguous first
    torch.testing.assert_close(kernel.rms_norm(strided, w, 1e-5),
                               torch.nn.functional.rms_norm(strided, (width,), w, 1e-5), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("tokens,heads,extra,hd", [(1, 3, 1, 64), (37, 2, 2, 16), (5, 14, 4, 128), (3, 1, 0, 6)])
def test_rope_matches_transformers(kernel, tokens, heads, extra, hd):
    """In place on the first ``heads`` heads of strided tokens (packed q/k/v rows: the value heads after them
    stay as they were), at scattered positions of the model's own tables: transformers'
    ``apply_rotary_pos_emb``, to float rounding."""
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding, apply_rotary_pos_emb

    cfg = Qwen2Config(hidden_size=hd * 2, num_attention_heads=2, rope_theta=10000.0, max_position_embeddings=300)
    x = torch.randn(1, 300, hd)
    cos, sin = (t[0].contiguous() for t in Qwen2RotaryEmbedding(cfg)(x, torch.arange(300).unsqueeze(0)))
    g = torch.Generator().manual_seed(tokens)
    wide = torch.randn(tokens, heads + extra + 1, hd, generator=g)
    packed = wide[:, : heads + extra]  # strided tokens, contiguous heads
    positions = torch.randint(0, 300, (tokens,), generator=g)
    before, wide_before = packed.clone(), wide.clone()
    kernel.rope(packed, heads, cos, sin, positions)
    # transformers' layout: [batch, heads, tokens, head_dim], tables [batch, tokens, head_dim]
    want, _ = apply_rotary_pos_emb(before[:, :heads].transpose(0, 1).unsqueeze(0), before[:, :1].transpose(0, 1)
                                   .unsqueeze(0), cos[positions].unsqueeze(0), sin[positions].unsqueeze(0))
    torch.testing.assert_close(packed[:, :heads], want[0].transpose(0, 1), rtol=1e-6, atol=1e-6)
    assert torch.equal(wide[:, heads:], wide_before[:, heads:]), "value heads and the row's rest untouched"


def test_rope_refuses_positions_beyond_its_tables(kernel):
    x = torch.randn(2, 2, 8)
    cos, sin = torch.ones(4, 8), torch.zeros(4, 8)
    before = x.clone()
    with pytest.raises(ValueError, match=r"positions must lie in the tables' \[0, 4\)"):
        kernel.rope(x, 2, cos, sin, torch.tensor([1, 4]))
    assert torch.equal(x, before), "nothing turned"
    with pytest.raises(ValueError, match="rope: x must be float32"):
        kernel.rope(x.transpose(1, 2), 2, cos, sin, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="rope: cos must be a contiguous float32 table"):
        kernel.rope(x, 2, cos.t(), sin, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="rope: positions must be contiguous int64"):
        kernel.rope(x, 2, cos, sin, torch.tensor([1, 2], dtype=torch.int32))


@pytest.mark.parametrize("rows,inter", [(1, 256), (32, 256), (7, 4864), (3, 13)])
def test_silu_mul_matches_torch(kernel, rows, inter):
    """``silu(gate) * up`` of fused gate/up rows (strided rows too), also where the exponential leaves float's
    range (gates of +-100 and beyond: no inf, no NaN)."""
    g = torch.Generator().manual_seed(inter)
    gate_up = torch.randn(rows, 2 * inter, generator=g) * 4
    gate_up[0, :3] = torch.tensor([-100.0, 100.0, -1e4])
    want = torch.nn.functional.silu(gate_up[:, :inter]) * gate_up[:, inter:]
    out = kernel.silu_mul(gate_up, inter)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, want, rtol=2e-6, atol=1e-6)
    strided = torch.cat([gate_up, torch.randn(rows, 5, generator=g)], dim=1)[:, : 2 * inter]
    torch.testing.assert_close(kernel.silu_mul(strided, inter), want, rtol=2e-6, atol=1e-6)
    with pytest.raises(ValueError, match=rf"silu_mul: gate_up must be float32 \[rows, {2 * inter + 2}\]"):
        kernel.silu_mul(gate_up, inter + 1)


def test_sample_matches_the_torch_sampler(kernel):
    """The one-call sampling step gives sample_step's tokens (the same seeded uniforms: signed, large and
    small seeds) and its processed logprobs to float rounding: sampled rows at temperatures 1 and 0.7,
    greedy rows, a row with one dominant token; then top alternatives as the torch path reports them."""
    from rft_runtime.serve.protocol import SamplingParams
    from rft_runtime.serve.sampler import sample_step

    g = torch.Generator().manual_seed(5)
    rows, vocab = 64, 348
    logits = torch.randn(rows, vocab, generator=g) * 3
    logits[7, 11] = 60.0
    params = [SamplingParams(temperature=[1.0, 0.7, 0.0][i % 3], logprobs=i % 2 * 3) for i in range(rows)]
    seeds = [(-1) ** i * (i * 0x9E3779B97F4A7C15 % 2 ** 63) for i in range(rows)]
    steps = [i * 7 % 50 for i in range(rows)]
    want = sample_step(logits, params, seeds, steps)
    got = sample_step(logits, params, seeds, steps, kernel)
    assert got.tokens == want.tokens and got.tokens[7] == 11
    torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(want.logprobs), rtol=0, atol=2e-6)
    for a, b in zip(got.top, want.top):
        assert (a is None) == (b is None)
        if a is not None:
            assert [t for t, _ in a] == [t for t, _ in b]
            torch.testing.assert_close(torch.tensor([v for _, v in a]), torch.tensor([v for _, v in b]), rtol=0,
                                       atol=2e-6)
    # many draws of one row: the tokens follow its probabilities, as the torch sampler's do
    row = torch.tensor([[0.0, 1.0, 2.0, -30.0]])
    one = [SamplingParams(temperature=1.0)]
    drawn = [sample_step(row, one, [s], [0], kernel).tokens[0] for s in range(4000)]
    assert drawn == [sample_step(row, one, [s], [0]).tokens[0] for s in range(4000)]
    freq = torch.bincount(torch.tensor(drawn), minlength=4).double() / 4000
    torch.testing.assert_close(freq, row[0].double().softmax(0), rtol=0, atol=0.03)


def test_source_is_packaged():
    """The C source ships with the package (the image builds the kernels from it at run time)."""
    assert native.SOURCE.is_file() and os.access(native.SOURCE, os.R_OK)


def test_layouts_the_kernels_do_not_assume_are_refused(kernel):
    """The attention writes into the cache through raw pointers: a cache of another dtype or layout, or
    slots and lengths of another dtype or length, are refused before the call."""
    q, k_new, v_new, keys, values, slots, lengths, scale = case(1, 2, 64)
    with pytest.raises(ValueError, match="keys must be a contiguous float32, float16 or bfloat16 cache"):
        kernel.decode_attention(q, k_new, v_new, keys.transpose(2, 3), values, slots, lengths, scale)
    with pytest.raises(ValueError, match="values must be a contiguous float32, float16 or bfloat16 cache"):
        kernel.decode_attention(q, k_new, v_new, keys, values.double(), slots, lengths, scale)
    with pytest.raises(ValueError, match="keys torch.float16 .* and values torch.float32 .* differ"):
        kernel.decode_attention(q, k_new, v_new, keys.half(), values, slots, lengths, scale)
    with pytest.raises(ValueError, match="lengths must be contiguous int64"):
        kernel.decode_attention(q, k_new, v_new, keys, values, slots, lengths.int(), scale)
    with pytest.raises(ValueError, match="slots must be contiguous int64"):
        kernel.decode_attention(q, k_new, v_new, keys, values, slots[:-1], lengths, scale)
    with pytest.raises(ValueError, match=r"slots must lie in \[0, 10\) and lengths in \[1, 48\]"):
        kernel.decode_attention(q, k_new, v_new, keys, values, slots + 1, lengths, scale)
    with pytest.raises(ValueError, match=r"slots must lie in \[0, 10\) and lengths in \[1, 48\]"):
        kernel.decode_attention(q, k_new, v_new, keys, values, slots, lengths - 1, scale)
    with pytest.raises(ValueError, match="rms_norm: float32"):
        kernel.rms_norm(torch.ones(2, 8), torch.ones(7), 1e-6)


def test_prebuilt_levels_are_loaded_without_a_compiler(no_cache, monkeypatch):
    """An image prebuilds one library per x86-64 level; the engine then loads the highest level this CPU
    runs, and invokes no compiler (CC names none)."""
    if platform.machine() != "x86_64":
        pytest.skip("x86-64 levels")
    built = native.prebuild(no_cache / "prebuilt")
    assert [p.name.split("-", 2)[2] for p in built] == [
        f"{level}-omp.so" if "-omp" in p.name else f"{level}.so" for p, (level, _) in zip(built, native.LEVELS)]
    levels = native._levels()
    assert levels and levels[-1] == "x86-64" and levels == [lv for lv, _ in native.LEVELS][-len(levels):]
    monkeypatch.setenv(native.PREBUILT_ENV, str(no_cache / "prebuilt"))
    monkeypatch.setenv("CC", "/nonexistent/cc")
    path, parallel = native.build()
    assert path in built and f"-{levels[0]}" in path.name and parallel == ("-omp" in path.name)
    kernel = native.Kernels(path, parallel)
    x, w = torch.randn(3, 64), torch.randn(64)
    assert torch.allclose(kernel.rms_norm(x, w, 1e-6), torch.nn.functional.rms_norm(x, (64,), w, 1e-6), atol=1e-5)
    # a CPU without AVX-512 takes the AVX2 level
    monkeypatch.setattr(native, "_cpu_signature", lambda: "flags\t: " + " ".join(
        sorted(set().union(*(need for lv, need in native.LEVELS if lv != "x86-64-v4")))))
    assert native._levels()[0] == "x86-64-v3" and "-x86-64-v3" in native.build()[0].name
    # a source the prebuilt files were not made from is compiled as before (and here, with no compiler, refused)
    src = no_cache / "kernels.c"
    src.write_text(native.SOURCE.read_text() + "\n/* changed */\n")
    with pytest.raises(native.NativeUnavailable, match="no C compiler"):
        native.build(src)


def test_a_cache_directory_another_user_may_write_is_never_used(no_cache, monkeypatch):
    """The temporary directory's cache is skipped when anyone else could have planted a library in it."""
    cache = no_cache / "cache"
    cache.mkdir(mode=0o777)
    cache.chmod(0o777)
    monkeypatch.setenv("RFT_NATIVE_CACHE", str(cache))
    path, _ = native.build()
    assert path.parent == no_cache / "home" / ".cache" / "rft-operator" / "native" and not list(cache.iterdir())
    path.unlink()
    cache.chmod(0o700)
    assert native.build()[0].parent == cache
