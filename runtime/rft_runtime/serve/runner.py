"""One forward pass per engine iteration over a Hugging Face decoder, with a per-slot KV cache.

The iteration's tokens are packed into one row: first one token per decoding sequence, then the
prompt chunks being prefilled. Every linear layer, norm and MLP runs once over the packed tokens;
attention writes the new keys and values into :class:`~rft_runtime.serve.kv_cache.SlotKVCache` in
place and reads them back as views: one batched attention for all decoding sequences (their slots
are dense, so ``keys[:S]`` needs no copy; queries are grouped by KV head, so grouped-query attention
needs no expanded copy of the cache either); consecutive whole prompts of one length prefill in one
batched causal ``scaled_dot_product_attention``, and a chunk continuing a prompt attends to its slot
(causal, offset by the tokens already in the cache).

The model's own modules do the work (embedding, norms, projections, rotary embedding, MLP, head), so
the numbers are transformers' numbers; supported are decoders shaped like Llama / Qwen2 / Qwen3 /
Mistral with full attention.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .kv_cache import SlotKVCache


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


class SlotRunner:
    """Drives ``model`` (a ``*ForCausalLM``) over packed tokens and a slot cache."""

    def __init__(self, model: Any):
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
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None  # cos, sin for positions 0..n-1

    def _rope(self, h: torch.Tensor, pos_t: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's rotary cos/sin at ``pos_t``, looked up in a table computed once by the model's own
        rotary embedding (it depends on positions only, never on the weights)."""
        table = self._rope_table
        if table is None or table[0].shape[1] < length:
            n = max(length, 2 * table[0].shape[1] if table is not None else 256)
            positions = torch.arange(n, device=self.device).unsqueeze(0)
            table = self._rope_table = self.base.rotary_emb(h[:, :1].expand(1, n, h.shape[-1]), positions)
        return table[0][:, pos_t[0]], table[1][:, pos_t[0]]

    def make_cache(self, slots: int, max_len: int) -> SlotKVCache:
        """A cache sized for this model."""
        return SlotKVCache(layers=self.num_layers, kv_heads=self.kv_heads, head_dim=self.head_dim, slots=slots,
                           max_len=max_len, dtype=self.dtype, device=self.device)

    @torch.no_grad()
    def forward(self, cache: SlotKVCache, decode_slots: list[int], decode_tokens: list[int], decode_pos: list[int],
                chunks: list[Chunk], logit_rows: list[int]) -> torch.Tensor:
        """Run one iteration; return the logits ``[len(logit_rows), vocab]`` of the packed rows asked for.

        Packed row ``i < len(decode_slots)`` is decoding sequence ``i``; prefill chunk tokens follow in order.
        """
        dev = self.device
        n_dec = len(decode_slots)
        ids = list(decode_tokens)
        pos = list(decode_pos)
        for c in chunks:
            ids.extend(c.tokens)
            pos.extend(range(c.start, c.start + len(c.tokens)))
        total = len(ids)
        cache.ensure(max(pos) + 1)
        ids_t = torch.tensor(ids, dtype=torch.long, device=dev).unsqueeze(0)
        pos_t = torch.tensor(pos, dtype=torch.long, device=dev).unsqueeze(0)
        h = self.base.embed_tokens(ids_t)
        cos, sin = self._rope(h, pos_t, max(pos) + 1)

        if n_dec:
            dslots = torch.tensor(decode_slots, dtype=torch.long, device=dev)
            dpos = pos_t[0, :n_dec]
            dense = decode_slots == list(range(n_dec))
            span = max(decode_slots) + 1
            width = max(decode_pos) + 1
            if dense:
                row_pos = dpos
            else:
                row_pos = torch.zeros(span, dtype=torch.long, device=dev)
                row_pos[dslots] = dpos
            visible = torch.arange(width, device=dev).unsqueeze(0) <= row_pos.unsqueeze(1)
            # additive mask [S, 1, 1, width], shared by every layer and query head
            dmask = torch.zeros(visible.shape, dtype=h.dtype, device=dev).masked_fill_(~visible, float("-inf"))
            dmask = dmask[:, None, None, :]
        # prefill work: runs of consecutive whole-prompt chunks of one length (attention among their own
        # tokens, batched), and single chunks continuing a prompt (attention over their slot's cache)
        runs: list[tuple[int, int, list[int], torch.Tensor | None]] = []  # (offset, length, slots, mask)
        off = n_dec
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
        run_slots = [torch.tensor(r[2], dtype=torch.long, device=dev) if len(r[2]) > 1 else None for r in runs]
        starts = {c.slot: c.start for c in chunks}

        hd, nh = self.head_dim, self.heads
        group = nh // self.kv_heads
        for li, layer in enumerate(self.base.layers):
            attn = layer.self_attn
            residual = h
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(1, total, -1, hd)
            k = attn.k_proj(x).view(1, total, -1, hd)
            v = attn.v_proj(x).view(1, total, -1, hd)
            if getattr(attn, "q_norm", None) is not None:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [1, heads, T, hd]
            q, k = self.rope(q, k, cos, sin)
            keys, values = cache.keys[li], cache.values[li]
            outs = []
            if n_dec:
                keys[dslots, :, dpos] = k[0, :, :n_dec].transpose(0, 1)
                values[dslots, :, dpos] = v[0, :, :n_dec].transpose(0, 1)
                # queries grouped by KV head: [D, kv_heads, heads / kv_heads, hd]; the cache is read in place
                qd = q[0, :, :n_dec].transpose(0, 1).reshape(n_dec, self.kv_heads, group, hd)
                if not dense:
                    full = qd.new_zeros((span, self.kv_heads, group, hd))
                    full[dslots] = qd
                    qd = full
                scores = torch.matmul(qd, keys[:span, :, :width].transpose(-1, -2)).mul_(self.scaling).add_(dmask)
                o = torch.matmul(scores.softmax(dim=-1), values[:span, :, :width])
                if not dense:
                    o = o[dslots]
                outs.append(o.reshape(n_dec, nh, hd))  # [D, heads, hd]
            for (off, n, slots, m), slot_t in zip(runs, run_slots):
                if m is None:  # g whole prompts of n tokens: [g, heads, n, hd], attending among themselves
                    g = len(slots)
                    qq = q[0, :, off:off + g * n].reshape(nh, g, n, hd).transpose(0, 1)
                    kk = k[0, :, off:off + g * n].reshape(-1, g, n, hd).transpose(0, 1)
                    vv = v[0, :, off:off + g * n].reshape(-1, g, n, hd).transpose(0, 1)
                    if slot_t is None:
                        keys[slots[0], :, :n] = kk[0]
                        values[slots[0], :, :n] = vv[0]
                    else:
                        keys[slot_t, :, :n] = kk
                        values[slot_t, :, :n] = vv
                    o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=self.scaling,
                                                       enable_gqa=True)
                    outs.append(o.transpose(1, 2).reshape(g * n, nh, hd))
                    continue
                slot = slots[0]
                start = starts[slot]
                end = start + n
                keys[slot, :, start:end] = k[0, :, off:off + n]
                values[slot, :, start:end] = v[0, :, off:off + n]
                o = F.scaled_dot_product_attention(q[:, :, off:off + n], keys[slot:slot + 1, :, :end],
                                                   values[slot:slot + 1, :, :end], attn_mask=m,
                                                   scale=self.scaling, enable_gqa=True)
                outs.append(o[0].transpose(0, 1))  # [n, heads, hd]
            a = (torch.cat(outs) if len(outs) > 1 else outs[0]).reshape(1, total, nh * hd)
            h = residual + attn.o_proj(a)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        rows = torch.tensor(logit_rows, dtype=torch.long, device=dev)
        return self.head(self.base.norm(h[0].index_select(0, rows)))
