"""One forward pass per engine iteration over a Hugging Face decoder, with a per-slot KV cache.

The iteration's tokens are packed into one row: first one token per decoding sequence, then the
prompt chunks being prefilled. Every linear layer, norm and MLP runs once over the packed tokens;
attention writes the new keys and values into :class:`~rft_runtime.serve.kv_cache.SlotKVCache` in
place and reads them back as views. Decoding sequences attend in one call: on the CPU in float32 the
varlen kernel of :mod:`.native` (it writes each sequence's new key and value and reads only its own
columns of its slot), else one batched attention (slots handed out lowest-first are dense, so
``keys[:S]`` needs no copy; it reads every row up to the longest and masks the rest). Queries are
grouped by KV head in both, so grouped-query attention needs no expanded copy of the cache;
consecutive whole prompts of one length prefill in one batched causal
``scaled_dot_product_attention``, and a chunk continuing a prompt attends to its slot (causal, offset
by the tokens already in the cache).

The model's own weights do the work, with fewer, larger operations than its modules would run (on a
CPU, and for small batches on a GPU, an iteration's time is mostly per-operation overhead): each
layer's q/k/v projections are one matrix multiplication, and so are the MLP's gate and up projections
(the model's parameters become views into those fused weights, so an in-place weight update reaches
both); the residual is added by the output projections' matrix multiplications (``addmm``); the packed
tokens are one ``[T, hidden]`` matrix throughout. With :mod:`.native`'s kernels (float32 on the CPU)
the rotary embedding turns the queries and keys in place, the decode attention reads them, and the new
keys and values, where the q/k/v projection left them, RMSNorm is one pass and the MLP's
``silu(gate) * up`` another; otherwise torch turns queries and keys in one pass, ``F.rms_norm`` (bitwise
the model's own) normalises and the activation is the model's. Embedding, q/k norms (Qwen3), rotary
tables and the head are the model's own modules. Supported are decoders shaped like
Llama / Qwen2 / Qwen3 / Mistral with full attention; tests check the logits against transformers'
forward to 1e-5. The cache may hold a narrower type than the model computes in (``kv_cache_dtype``:
float16 or bfloat16 under a float32 model): keys and values are rounded as they are stored and read back
converted, the native kernel converting them as it reads.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from . import graphs, native
from .choices import pick
from .kv_cache import SlotKVCache

KV_CACHE_DTYPE_ENV = "RFT_ENGINE_KV_CACHE_DTYPE"
KV_CACHE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_kv_cache_dtype(value: str | None, model_dtype: torch.dtype) -> torch.dtype:
    """The KV cache's element type: ``value`` (``auto``: the model's dtype, or ``float32``, ``float16``,
    ``bfloat16``), else ``$RFT_ENGINE_KV_CACHE_DTYPE``, else auto; anything else is refused, naming it."""
    picked = pick(value, name="kv_cache_dtype", env=KV_CACHE_DTYPE_ENV, choices=("auto", *KV_CACHE_DTYPES))
    return model_dtype if picked == "auto" else KV_CACHE_DTYPES[picked]


@dataclass
class Chunk:
    """Prompt tokens ``tokens`` of the sequence in ``slot``, at positions ``start`` onwards."""

    slot: int
    tokens: list[int]
    start: int


class UnsupportedModel(ValueError):
    """The model's architecture is not one the runner knows how to drive."""


# Decoders whose layer is exactly: RMSNorm -> q/k/v projections (+ optional q/k norm) -> rotary -> attention
# -> o_proj -> residual -> RMSNorm -> MLP -> residual, with plain token embeddings (no scaling).
SUPPORTED_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def _fuse_rows(mods: list[Any], name: str) -> torch.Tensor | None:
    """Concatenate the ``name`` tensors (weight or bias) of ``mods`` along their output rows into one
    new tensor, and make each module's parameter a view of its rows in it (no extra memory; an in-place
    update of a parameter, as a weight swap does, updates the fused tensor). None where they have none."""
    parts: list[Any] = [getattr(m, name, None) for m in mods]
    if all(p is None for p in parts):
        return None
    if any(p is None for p in parts):
        raise UnsupportedModel(f"{name}: some of the projections to fuse have one and some do not")
    fused = torch.cat([p.detach() for p in parts])
    row = 0
    for p in parts:
        p.data = fused[row: row + p.shape[0]]
        row += p.shape[0]
    return fused


def _fuse_weights(mods: list[Any], in_major: bool) -> torch.Tensor:
    """The weights ``[out, in]`` of ``mods`` (linear layers on one input) as one ``[in, sum of outs]``
    operand of ``x @ w``, each module's weight a view of its part of it (a weight swap's in-place update of
    a parameter updates it). ``in_major``: the operand is stored contiguous, ``[in, out]`` rows, the
    modules' weights becoming transposed views of it: MKL's decode-sized multiplications (8-128 rows) run
    up to 2.5x faster against it on one thread than against the transpose of ``[out, in]`` weights
    (0.8-1.7x on two, measured on an Intel Xeon with MKL). Else (GPUs, other dtypes: not measured)
    the operand is a transposed view of the weights as the model stores them (fused with
    :func:`_fuse_rows`)."""
    if not in_major:
        fused = mods[0].weight if len(mods) == 1 else _fuse_rows(mods, "weight")
        assert fused is not None
        return fused.detach().t()
    weights = [m.weight for m in mods]
    fused = torch.cat([w.detach().t() for w in weights], dim=1)
    col = 0
    for w in weights:
        w.data = fused[:, col: col + w.shape[0]].t()
        col += w.shape[0]
    return fused


@dataclass
class _Layer:
    """One decoder layer's fused weights and what its forward needs."""

    qkv_w: torch.Tensor  # each weight the [in, out] operand of x @ w (_fuse_weights: contiguous on the CPU in float32)
    qkv_b: torch.Tensor | None
    o_w: torch.Tensor
    o_b: torch.Tensor | None
    gate_up_w: torch.Tensor
    gate_up_b: torch.Tensor | None
    down_w: torch.Tensor
    down_b: torch.Tensor | None
    intermediate: int
    act: Any
    qk_norm: bool


def _silu_modules() -> tuple[type, ...]:
    """The module classes that compute exactly ``F.silu``: torch's, and transformers' own (its ``silu``
    activation since 5.0)."""
    try:
        from transformers.activations import SiLUActivation
    except ImportError:
        return (torch.nn.SiLU,)
    return (torch.nn.SiLU, SiLUActivation)


def _fused_layer(layer: Any, in_major: bool) -> _Layer:
    attn, mlp = layer.self_attn, layer.mlp
    for name in ("gate_proj", "up_proj", "down_proj", "act_fn"):
        if not hasattr(mlp, name):
            raise UnsupportedModel(f"{type(mlp).__name__} has no {name}")
    act = F.silu if isinstance(mlp.act_fn, _silu_modules()) else mlp.act_fn
    qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
    return _Layer(qkv_w=_fuse_weights(qkv, in_major), qkv_b=_fuse_rows(qkv, "bias"),
                  o_w=_fuse_weights([attn.o_proj], in_major), o_b=attn.o_proj.bias,
                  gate_up_w=_fuse_weights([mlp.gate_proj, mlp.up_proj], in_major),
                  gate_up_b=_fuse_rows([mlp.gate_proj, mlp.up_proj], "bias"),
                  down_w=_fuse_weights([mlp.down_proj], in_major), down_b=mlp.down_proj.bias,
                  intermediate=int(mlp.gate_proj.weight.shape[0]), act=act,
                  qk_norm=getattr(attn, "q_norm", None) is not None)


def _linear(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight_t.t(), bias)`` of ``[T, in]`` rows, calling what it calls without its layers."""
    return torch.mm(x, weight_t) if bias is None else torch.addmm(bias, x, weight_t)


def _plus_linear(h: torch.Tensor, x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``h + _linear(x, weight_t, bias)``; without a bias one ``addmm`` (the residual added by the matrix
    multiplication) instead of two operations."""
    if bias is not None:
        return h + torch.addmm(bias, x, weight_t)
    return torch.addmm(h, x, weight_t)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass
class _Iteration:
    """What every layer of one :meth:`SlotRunner.forward` reads, worked out once per iteration."""

    total: int  # packed tokens T
    n_dec: int  # decoding sequences: the first n_dec packed rows
    pos_t: torch.Tensor  # [T] each packed token's position
    # the rotary embedding: the tables [positions, hd] (the native kernel looks them up itself), or the
    # packed tokens' cos/sin [1, T, hd] (the model's apply_rotary_pos_emb) and [1, 1, T, hd] (every head alike)
    cos_t: torch.Tensor | None = None
    sin_t: torch.Tensor | None = None
    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None
    cos_h: torch.Tensor | None = None
    sin_h: torch.Tensor | None = None
    # decode attention: the rows' slots and positions; the native kernel's lengths and output buffer, or
    # torch's batched plan (SlotRunner._batched_plan)
    dslots: torch.Tensor | None = None
    dpos: torch.Tensor | None = None
    lengths: torch.Tensor | None = None
    attn_out: torch.Tensor | None = None
    plan: tuple[bool, int, int, torch.Tensor | None] | None = None
    # prefill attention: (offset, length, slots, mask) per run (SlotRunner._plan_prefill), the slots of a
    # run of several prompts on the device, each chunk's first position by slot
    runs: list[tuple[int, int, list[int], torch.Tensor | None]] = field(default_factory=list)
    run_slots: list[torch.Tensor | None] = field(default_factory=list)
    starts: dict[int, int] = field(default_factory=dict)


class SlotRunner:
    """Drives ``model`` (a ``*ForCausalLM``) over packed tokens and a slot cache.

    ``kernels``: ``native`` (the kernels of :mod:`.native`: varlen decode attention, each sequence reading
    only its own columns, and RMSNorm in one pass), ``torch`` (one batched attention over every row up to
    the longest, masked; torch's RMSNorm), or ``auto`` (native where they build and apply: float32 on the
    CPU); unset: ``$RFT_ENGINE_KERNELS``, else auto. ``cuda_graphs``: decode-only iterations replayed
    from CUDA graphs (:mod:`.graphs`): ``auto`` (on a CUDA device), ``never``, or ``uncaptured`` (their
    fixed-shape iteration, run eagerly); unset: ``$RFT_ENGINE_CUDA_GRAPHS``, else auto. ``kv_cache_dtype``:
    the KV cache's element type (:func:`resolve_kv_cache_dtype`; ``auto``, the model's, unless set): a float16 or
    bfloat16 cache under a float32 model halves the bytes decode attention reads, the keys and values rounded
    as they are stored and every product and sum still in the model's dtype.
    """

    def __init__(self, model: Any, kernels: str | None = None, cuda_graphs: str | None = None,
                 kv_cache_dtype: str | None = None):
        base = getattr(model, "model", None)
        head = getattr(model, "lm_head", None)
        needed = ("embed_tokens", "layers", "norm", "rotary_emb")
        if base is None or head is None or not all(hasattr(base, n) for n in needed):
            raise UnsupportedModel(f"{type(model).__name__} is not a Llama/Qwen2-style decoder")
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        if getattr(cfg, "model_type", None) not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModel(f"model_type {getattr(cfg, 'model_type', None)!r} is not supported by the builtin "
                                   f"engine (supported: {', '.join(sorted(SUPPORTED_MODEL_TYPES))})")
        types = set(getattr(cfg, "layer_types", None) or ["full_attention"])
        if types != {"full_attention"}:
            raise UnsupportedModel(f"only full attention is supported, the model has {sorted(types)}")
        self.model, self.base, self.head = model, base, head
        attn = base.layers[0].self_attn
        for name in ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling"):
            if not hasattr(attn, name):
                raise UnsupportedModel(f"{type(attn).__name__} has no {name}")
        self.rope = getattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb", None)
        if self.rope is None:
            raise UnsupportedModel(f"{type(attn).__module__} has no apply_rotary_pos_emb")
        self.num_layers = len(base.layers)
        self.head_dim = int(attn.head_dim)
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        self.scaling = float(attn.scaling)
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.kv_dtype = resolve_kv_cache_dtype(kv_cache_dtype, self.dtype)
        in_major = self.device.type == "cpu" and self.dtype == torch.float32
        self.layers = [_fused_layer(layer, in_major) for layer in base.layers]
        self._qk_norm = any(L.qk_norm for L in self.layers)
        self._norms = [(layer.input_layernorm, layer.post_attention_layernorm) for layer in base.layers]
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None  # cos, sin for positions 0..n-1
        choice = native.setting(kernels)
        kernel = native.kernels(choice)
        if kernel is not None and not kernel.usable(self.device, self.dtype):
            if choice == "native":
                raise native.NativeUnavailable(
                    f"kernels native: need float32 on the CPU{'' if kernel.parallel else ' and one thread'}, "
                    f"the model is {self.dtype} on {self.device} with {torch.get_num_threads()} threads")
            kernel = None
        self.kernels = kernel
        # each norm's (weight, eps) where the native RMSNorm computes it, else None (the model's own module)
        self._native_norms = {id(m): self._native_norm(m) for pair in self._norms for m in pair}
        self._native_norms[id(base.norm)] = self._native_norm(base.norm)
        self._attn_out: torch.Tensor | None = None  # the kernel's output, reused by every layer and iteration
        mode = graphs.setting(cuda_graphs)
        capture = mode == "auto" and self.device.type == "cuda"
        self.graphs = graphs.DecodeGraphs(self, capture=capture) if capture or mode == "uncaptured" else None

    def rope_tables(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's rotary cos and sin ``[positions, head_dim]`` for at least ``length`` positions, computed
        once by the model's own rotary embedding (they depend on positions only, never on the weights)."""
        table = self._rope_table
        if table is None or table[0].shape[0] < length:
            n = max(length, 2 * table[0].shape[0] if table is not None else 256)
            positions = torch.arange(n, device=self.device).unsqueeze(0)
            like = self.base.embed_tokens.weight[:1]  # the hidden states' dtype and device
            cos, sin = self.base.rotary_emb(like[None].expand(1, n, like.shape[-1]), positions)
            table = self._rope_table = (cos[0].contiguous(), sin[0].contiguous())
        return table

    def _rope(self, pos_t: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's rotary cos/sin ``[1, T, head_dim]`` at ``pos_t``, looked up in :meth:`rope_tables`."""
        cos, sin = self.rope_tables(length)
        return cos[pos_t].unsqueeze(0), sin[pos_t].unsqueeze(0)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The output layer's logits of last hidden states ``h`` ``[rows, hidden]`` (the final norm first)."""
        return self.head(self._norm(self.base.norm, h))

    def make_cache(self, slots: int, max_len: int) -> SlotKVCache:
        """A cache sized for this model."""
        return SlotKVCache(layers=self.num_layers, kv_heads=self.kv_heads, head_dim=self.head_dim, slots=slots,
                           max_len=max_len, dtype=self.kv_dtype, device=self.device)

    @staticmethod
    def _eps(module: Any) -> float | None:
        eps = getattr(module, "variance_epsilon", None) or getattr(module, "eps", None)
        return None if eps is None else float(eps)

    def _native_norm(self, module: Any) -> tuple[torch.Tensor, float] | None:
        eps, weight = self._eps(module), getattr(module, "weight", None)
        if self.kernels is None or eps is None or weight is None or weight.dtype != torch.float32:
            return None
        return weight, eps

    def _norm(self, module: Any, x: torch.Tensor) -> torch.Tensor:
        """The model's RMSNorm: the native kernel's in float32 (to float rounding), else ``F.rms_norm``
        in float32 (bitwise the same), else its own module (which rounds to the model's dtype before the
        weight multiplies)."""
        fast = self._native_norms.get(id(module))
        if fast is not None and self.kernels is not None and x.dtype == torch.float32:
            return self.kernels.rms_norm(x, *fast)
        if x.dtype == torch.float32 and module.weight.dtype == torch.float32:
            eps = self._eps(module)
            if eps is not None:
                return F.rms_norm(x, module.weight.shape, module.weight, eps)
        return module(x)

    @staticmethod
    def _batched_plan(decode_slots: list[int], decode_pos: list[int], dslots: torch.Tensor, dpos: torch.Tensor,
                      dtype: torch.dtype) -> tuple[bool, int, int, torch.Tensor | None]:
        """For torch's batched decode attention, once per iteration: whether the decoding slots are
        ``0..D-1``, the slots spanned, the columns read (the longest row's), and the additive mask
        ``[span, 1, 1, width]`` hiding each row's columns beyond its position (None when every row decodes
        at one position)."""
        dev = dslots.device
        dense = decode_slots == list(range(len(decode_slots)))
        span = max(decode_slots) + 1
        width = max(decode_pos) + 1
        if min(decode_pos) == width - 1:
            return dense, span, width, None
        if dense:
            row_pos = dpos
        else:
            row_pos = torch.zeros(span, dtype=torch.long, device=dev)
            row_pos[dslots] = dpos
        visible = torch.arange(width, device=dev).unsqueeze(0) <= row_pos.unsqueeze(1)
        mask = torch.zeros(visible.shape, dtype=dtype, device=dev).masked_fill_(~visible, float("-inf"))
        return dense, span, width, mask[:, None, None, :]

    def _batched_decode(self, qd: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, dslots: torch.Tensor,
                        plan: tuple[bool, int, int, torch.Tensor | None]) -> torch.Tensor:
        """Decode attention as one batched matmul over the slots ``0..span-1`` up to the longest row (rows
        of slots that do not decode compute and are dropped)."""
        dense, span, width, mask = plan
        if not dense:
            full = qd.new_zeros((span, *qd.shape[1:]))
            full[dslots] = qd
            qd = full
        scores = torch.matmul(qd, keys[:span, :, :width].to(qd.dtype).transpose(-1, -2)).mul_(self.scaling)
        if mask is not None:
            scores.add_(mask)
        o = torch.matmul(scores.softmax(dim=-1), values[:span, :, :width].to(qd.dtype))
        return o if dense else o[dslots]

    @torch.inference_mode()
    def forward(self, cache: SlotKVCache, decode_slots: list[int], decode_tokens: list[int], decode_pos: list[int],
                chunks: list[Chunk], logit_rows: list[int]) -> torch.Tensor:
        """Run one iteration; return the logits ``[len(logit_rows), vocab]`` of the packed rows asked for.

        Packed row ``i < len(decode_slots)`` is decoding sequence ``i``; prefill chunk tokens follow in order.
        A decode-only iteration runs from a CUDA graph where :attr:`graphs` are on (:mod:`.graphs`).
        """
        if not chunks and self.graphs is not None:
            out = self.graphs.decode(cache, decode_slots, decode_tokens, decode_pos, logit_rows)
            if out is not None:
                return out
        it, h, rows = self._pack(cache, decode_slots, decode_tokens, decode_pos, chunks, logit_rows)
        for li, (L, layer) in enumerate(zip(self.layers, self.base.layers)):
            h = self._layer(cache, it, li, L, layer, h)
        return self.logits(h.index_select(0, rows))

    def _pack(self, cache: SlotKVCache, decode_slots: list[int], decode_tokens: list[int], decode_pos: list[int],
              chunks: list[Chunk], logit_rows: list[int]) -> tuple[_Iteration, torch.Tensor, torch.Tensor]:
        """The iteration's tokens packed into one sequence (the decoding sequences' first, then the chunks'):
        what every layer reads (:class:`_Iteration`), the embedded tokens ``[T, hidden]``, and the packed rows
        whose logits are returned. Makes room in ``cache`` for the furthest position."""
        dev = self.device
        n_dec = len(decode_slots)
        ids = list(decode_tokens)
        pos = list(decode_pos)
        for c in chunks:
            ids.extend(c.tokens)
            pos.extend(range(c.start, c.start + len(c.tokens)))
        total = len(ids)
        cache.ensure(max(pos) + 1)
        # every index this iteration needs in one host-to-device tensor (each torch.tensor call costs
        # microseconds, a batch-1 iteration a few hundred): ids, positions, the decode rows' slots and
        # lengths, the rows whose logits are returned
        lengths_l = [p + 1 for p in decode_pos]
        packed = torch.tensor(ids + pos + decode_slots + lengths_l + logit_rows, dtype=torch.long, device=dev)
        ids_t, pos_t = packed[:total], packed[total:2 * total]
        idx = 2 * total + 2 * n_dec
        rows = packed[idx:idx + len(logit_rows)]
        h = self.base.embed_tokens(ids_t)  # [T, hidden]: the packed tokens are one sequence
        it = _Iteration(total=total, n_dec=n_dec, pos_t=pos_t)
        if self.kernels is not None:  # the native rotary embedding reads the tables at each token's position itself
            it.cos_t, it.sin_t = self.rope_tables(max(pos) + 1)
        if self.kernels is None or self._qk_norm:
            it.cos, it.sin = self._rope(pos_t, max(pos) + 1)
            it.cos_h, it.sin_h = it.cos.unsqueeze(1), it.sin.unsqueeze(1)  # [1, 1, T, hd]: every head alike
        if n_dec:
            self._plan_decode(it, packed[2 * total:2 * total + n_dec], packed[2 * total + n_dec:idx], decode_slots,
                              decode_pos, h.dtype)
        self._plan_prefill(it, chunks)
        return it, h, rows

    def _plan_decode(self, it: _Iteration, dslots: torch.Tensor, lengths: torch.Tensor, decode_slots: list[int],
                     decode_pos: list[int], dtype: torch.dtype) -> None:
        """The decoding rows' slots ``dslots`` and lengths ``lengths`` (on the device) into ``it``, with what
        their attention needs: the native kernel's output buffer, or torch's batched plan."""
        n_dec = it.n_dec
        it.dslots, it.dpos = dslots, it.pos_t[:n_dec]
        if self.kernels is not None:
            it.lengths = lengths
            buf = self._attn_out
            if buf is None or buf.shape[0] < n_dec:
                buf = self._attn_out = torch.empty((max(n_dec, 32), self.kv_heads, self.heads // self.kv_heads,
                                                    self.head_dim), dtype=self.dtype)
            it.attn_out = buf[:n_dec]
        else:
            it.plan = self._batched_plan(decode_slots, decode_pos, dslots, it.dpos, dtype)

    def _plan_prefill(self, it: _Iteration, chunks: list[Chunk]) -> None:
        """The prefill's attention work into ``it``: runs of consecutive whole-prompt chunks of one length
        (attention among their own tokens, batched), and single chunks continuing a prompt (attention over
        their slot's cache, under a causal mask offset by the tokens already there)."""
        dev = self.device
        runs: list[tuple[int, int, list[int], torch.Tensor | None]] = []  # (offset, length, slots, mask)
        off = it.n_dec
        for c in chunks:
            n = len(c.tokens)
            if c.start == 0 and runs and runs[-1][3] is None and runs[-1][1] == n \
                    and runs[-1][0] + n * len(runs[-1][2]) == off:
                runs[-1][2].append(c.slot)
            elif c.start == 0:
                runs.append((off, n, [c.slot], None))
            else:
                end = c.start + n
                q_pos = torch.arange(c.start, end, device=dev)
                runs.append((off, n, [c.slot], torch.arange(end, device=dev).unsqueeze(0) <= q_pos.unsqueeze(1)))
            off += n
        it.runs = runs
        it.run_slots = [torch.tensor(r[2], dtype=torch.long, device=dev) if len(r[2]) > 1 else None for r in runs]
        it.starts = {c.slot: c.start for c in chunks}

    def _layer(self, cache: SlotKVCache, it: _Iteration, li: int, L: _Layer, layer: Any,
               h: torch.Tensor) -> torch.Tensor:
        """Decoder layer ``li`` over the packed hidden states ``h`` ``[T, hidden]``: attention (writing the new
        keys and values into ``cache``), then the MLP, each added to the residual."""
        residual = h
        qkv, q, k, v = self._qkv(it, li, L, layer, h)
        keys, values = cache.keys[li], cache.values[li]
        outs = []
        if it.n_dec:
            outs.append(self._decode_attention(it, L, qkv, q, k, v, keys, values))
        for (off, n, slots, m), slot_t in zip(it.runs, it.run_slots):
            if m is None:
                outs.append(self._prompts_attention(q, k, v, keys, values, off, n, slots, slot_t))
            else:
                outs.append(self._chunk_attention(q, k, v, keys, values, off, n, slots[0], it.starts[slots[0]], m))
        h = _plus_linear(residual, torch.cat(outs) if len(outs) > 1 else outs[0], L.o_w, L.o_b)
        return self._mlp(li, L, h)

    def _qkv(self, it: _Iteration, li: int, L: _Layer, layer: Any, h: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """Layer ``li``'s queries, keys and values of the packed tokens, q and k normalised (Qwen3) and turned
        by the rotary embedding: ``qkv`` ``[T, heads + 2 * kv_heads, hd]`` and ``q``, ``k``, ``v``
        ``[1, heads, T, hd]`` (None where only the native decode attention reads them, from ``qkv``)."""
        hd, nh, nkv = self.head_dim, self.heads, self.kv_heads
        kernel = self.kernels
        qkv = _linear(self._norm(self._norms[li][0], h), L.qkv_w, L.qkv_b).view(it.total, nh + 2 * nkv, hd)
        q = k = v = None
        if L.qk_norm:
            attn = layer.self_attn
            q, k, v = qkv.split((nh, nkv, nkv), dim=1)
            q, k = attn.q_norm(q), attn.k_norm(k)
            q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, heads, T, hd]
            q, k = self.rope(q, k, it.cos, it.sin)
        elif kernel is not None:  # queries and keys turned in place
            kernel.rope(qkv, nh + nkv, it.cos_t, it.sin_t, it.pos_t)
            if it.runs:  # [1, heads, T, hd] views of `qkv` for the prefill
                q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in qkv.split((nh, nkv, nkv), dim=1))
        else:  # queries and keys turned together: [1, heads + kv_heads, T, hd]
            qk = qkv[:, : nh + nkv].transpose(0, 1).unsqueeze(0)
            qk = qk * it.cos_h + _rotate_half(qk) * it.sin_h
            q, k = qk[:, :nh], qk[:, nh:]
            v = qkv[:, nh + nkv:].transpose(0, 1).unsqueeze(0)
        return qkv, q, k, v

    def _decode_attention(self, it: _Iteration, L: _Layer, qkv: torch.Tensor, q: torch.Tensor | None,
                          k: torch.Tensor | None, v: torch.Tensor | None, keys: torch.Tensor,
                          values: torch.Tensor) -> torch.Tensor:
        """The decoding rows' attention ``[D, heads * hd]``, each attending to its own slot of the layer's
        cache ``keys`` / ``values``, its new key and value written there first."""
        n_dec, hd, nh = it.n_dec, self.head_dim, self.heads
        kernel = self.kernels
        if kernel is not None and not L.qk_norm:
            # reads `qkv` itself, writes the new keys and values; each row up to its own length, no mask
            o = kernel.decode_attention_packed(qkv, n_dec, nh, keys, values, it.dslots, it.lengths, self.scaling,
                                               it.attn_out)
        else:
            # queries grouped by KV head: [D, kv_heads, heads / kv_heads, hd]; the cache is read in place
            qd = q[0, :, :n_dec].transpose(0, 1).reshape(n_dec, self.kv_heads, nh // self.kv_heads, hd)
            k_new, v_new = k[0, :, :n_dec].transpose(0, 1), v[0, :, :n_dec].transpose(0, 1)  # [D, kv, hd]
            if kernel is not None:
                o = kernel.decode_attention(qd, k_new, v_new, keys, values, it.dslots, it.lengths, self.scaling,
                                            it.attn_out)
            else:
                keys[it.dslots, :, it.dpos] = k_new.to(keys.dtype)
                values[it.dslots, :, it.dpos] = v_new.to(values.dtype)
                o = self._batched_decode(qd, keys, values, it.dslots, it.plan)
        return o.reshape(n_dec, nh * hd)

    def _prompts_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
                           values: torch.Tensor, off: int, n: int, slots: list[int],
                           slot_t: torch.Tensor | None) -> torch.Tensor:
        """Attention of g whole prompts of ``n`` tokens each, packed from row ``off`` on, among themselves
        (causal, batched ``[g, heads, n, hd]``), their keys and values written into ``slots`` (``slot_t``
        on the device where g > 1). Returns ``[g * n, heads * hd]``."""
        hd, nh = self.head_dim, self.heads
        g = len(slots)
        qq = q[0, :, off:off + g * n].reshape(nh, g, n, hd).transpose(0, 1)
        kk = k[0, :, off:off + g * n].reshape(-1, g, n, hd).transpose(0, 1)
        vv = v[0, :, off:off + g * n].reshape(-1, g, n, hd).transpose(0, 1)
        if slot_t is None:
            keys[slots[0], :, :n] = kk[0]
            values[slots[0], :, :n] = vv[0]
        else:
            keys[slot_t, :, :n] = kk.to(keys.dtype)
            values[slot_t, :, :n] = vv.to(values.dtype)
        o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=self.scaling, enable_gqa=True)
        return o.transpose(1, 2).reshape(g * n, nh * hd)

    def _chunk_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
                         values: torch.Tensor, off: int, n: int, slot: int, start: int,
                         mask: torch.Tensor) -> torch.Tensor:
        """Attention of a chunk continuing a prompt (``n`` tokens packed from row ``off`` on, at positions
        ``start`` onwards) over its slot, its keys and values written there first, under ``mask`` (causal,
        offset by the tokens already in the cache). Returns ``[n, heads * hd]``."""
        end = start + n
        keys[slot, :, start:end] = k[0, :, off:off + n]
        values[slot, :, start:end] = v[0, :, off:off + n]
        o = F.scaled_dot_product_attention(q[:, :, off:off + n], keys[slot:slot + 1, :, :end].to(q.dtype),
                                           values[slot:slot + 1, :, :end].to(q.dtype), attn_mask=mask,
                                           scale=self.scaling, enable_gqa=True)
        return o[0].transpose(0, 1).reshape(n, self.heads * self.head_dim)

    def _mlp(self, li: int, L: _Layer, h: torch.Tensor) -> torch.Tensor:
        """``h`` plus layer ``li``'s MLP of its normalised ``h``: ``down(act(gate) * up)``."""
        gate_up = _linear(self._norm(self._norms[li][1], h), L.gate_up_w, L.gate_up_b)
        kernel = self.kernels
        if kernel is not None and L.act is F.silu and gate_up.dtype == torch.float32:
            act = kernel.silu_mul(gate_up, L.intermediate)
        else:
            gate, up = gate_up.split(L.intermediate, dim=-1)
            act = L.act(gate) * up
        return _plus_linear(h, act, L.down_w, L.down_b)

    def decode_fixed(self, cache: SlotKVCache, ids: torch.Tensor, pos: torch.Tensor, write: torch.Tensor,
                     span: int, width: int) -> torch.Tensor:
        """One decode step of slots ``0..span-1`` in fixed shapes (what :mod:`.graphs` captures): row ``r``
        feeds token ``ids[r]`` at position ``pos[r]``, writes its key and value into row ``write[r]`` of the
        cache (its own slot, or the spare row for padding) and attends to columns ``0..width-1`` of slot
        ``r`` under a mask hiding those past ``pos[r]``. Returns the last hidden states ``[span, hidden]``.
        Torch operations only, none reading a value back to the host."""
        dev = self.device
        hd, nh, nkv = self.head_dim, self.heads, self.kv_heads
        h = self.base.embed_tokens(ids)
        cos_t, sin_t = self.rope_tables(width)
        cos, sin = cos_t[pos].unsqueeze(1), sin_t[pos].unsqueeze(1)  # [span, 1, hd]: every head alike
        hidden_cols = torch.arange(width, device=dev).unsqueeze(0) > pos.unsqueeze(1)
        mask = torch.zeros((span, width), dtype=h.dtype, device=dev).masked_fill_(hidden_cols, float("-inf"))
        mask = mask[:, None, None, :]
        # the rows of the flattened [rows * kv_heads * capacity, hd] cache that the new keys and values go to
        heads = torch.arange(nkv, device=dev).unsqueeze(0)
        dest = ((write.unsqueeze(1) * nkv + heads) * cache.capacity + pos.unsqueeze(1)).reshape(-1)
        for li, (L, layer) in enumerate(zip(self.layers, self.base.layers)):
            residual = h
            qkv = _linear(self._norm(self._norms[li][0], h), L.qkv_w, L.qkv_b).view(span, nh + 2 * nkv, hd)
            if L.qk_norm:
                q, k, v = qkv.split((nh, nkv, nkv), dim=1)
                q, k = layer.self_attn.q_norm(q), layer.self_attn.k_norm(k)
                q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
            else:
                qk = qkv[:, : nh + nkv]
                qk = qk * cos + _rotate_half(qk) * sin
                q, k, v = qk[:, :nh], qk[:, nh:], qkv[:, nh + nkv:]
            keys, values = cache.keys[li], cache.values[li]
            keys.view(-1, hd).index_copy_(0, dest, k.reshape(-1, hd).to(keys.dtype))
            values.view(-1, hd).index_copy_(0, dest, v.reshape(-1, hd).to(values.dtype))
            qd = q.reshape(span, nkv, nh // nkv, hd)  # queries grouped by KV head, as in the eager path
            kk, vv = keys[:span, :, :width].to(qd.dtype), values[:span, :, :width].to(qd.dtype)
            scores = torch.matmul(qd, kk.transpose(-1, -2)).mul_(self.scaling).add_(mask)
            o = torch.matmul(scores.softmax(dim=-1), vv).reshape(span, nh * hd)
            h = _plus_linear(residual, o, L.o_w, L.o_b)
            gate_up = _linear(self._norm(self._norms[li][1], h), L.gate_up_w, L.gate_up_b)
            gate, up = gate_up.split(L.intermediate, dim=-1)
            h = _plus_linear(h, L.act(gate) * up, L.down_w, L.down_b)
        return h
