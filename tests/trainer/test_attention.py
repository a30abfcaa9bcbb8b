"""Attention in float32 where the trainer computes in bfloat16 on the CPU (rft_runtime.trainer.attention)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from rft_runtime.trainer import attention, distributed
from rft_runtime.trainer.distributed import DistContext


def _padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 200, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[0, :4] = 0  # left padding, as the trainer's batches have
    mask[2, :7] = 0
    return ids, mask


def test_sdpa_float32_is_sdpa_on_float32_inputs():
    """The function computes transformers' sdpa attention on the inputs cast to float32, with autocast off
    (bit for bit), and returns the queries' dtype."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    g = torch.Generator().manual_seed(1)
    module = torch.nn.Module()
    module.is_causal, module.num_key_value_groups = True, 2
    q = torch.randn(2, 4, 9, 16, generator=g).bfloat16()
    k, v = (torch.randn(2, 2, 9, 16, generator=g).bfloat16() for _ in range(2))
    mask = torch.ones(2, 1, 9, 9, dtype=torch.bool).tril()
    mask[1, :, :, :3] = False
    mask[1, :, :3, :3] = torch.eye(3, dtype=torch.bool)  # padded rows attend to themselves only
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = attention.sdpa_float32(module, q, k, v, mask, scaling=0.25)
    want, _ = sdpa_attention_forward(module, q.float(), k.float(), v.float(), mask, scaling=0.25)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, want.bfloat16())
    # under autocast, plain sdpa computes in bfloat16: a different result
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
    assert not torch.equal(low.bfloat16(), out)


def test_bfloat16_on_the_cpu_attends_in_float32_and_honours_padding(tiny_model_dir):
    """``shard`` with a bfloat16 compute dtype on the CPU switches the model to the float32 attention; its
    logits under autocast stay within bfloat16's rounding of the float32 model's, padded rows included
    (an attention function registered without its mask function would attend to the padding), and its
    gradients flow to every parameter."""
    ids, mask = _padded_batch()
    ref = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    want = ref(input_ids=ids, attention_mask=mask).logits
    model = distributed.shard(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                              DistContext(), torch.bfloat16)
    assert model.config._attn_implementation == attention.NAME
    out = model(input_ids=ids, attention_mask=mask).logits
    assert out.dtype == torch.bfloat16
    live = mask.bool()
    err = (out.float() - want)[live].abs().max().item()
    scale = want[live].abs().max().item()
    assert err < 0.05 * scale, (err, scale)
    # the padded rows' real tokens: the same as the row run alone, without padding
    alone = model(input_ids=ids[2:, 7:], attention_mask=mask[2:, 7:]).logits
    torch.testing.assert_close(out[2:, 7:].float(), alone.float(), rtol=0, atol=0.05 * scale)
    out.float()[live].logsumexp(-1).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


def test_float32_compute_keeps_sdpa(tiny_model_dir):
    """Without a lower-precision compute dtype (float32 on the CPU) the model keeps transformers' own sdpa."""
    model = distributed.shard(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                              DistContext(), None)
    assert model.config._attn_implementation == "sdpa"


def test_applies_only_to_lower_precision_on_the_cpu():
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert attention.applies(cpu, torch.bfloat16) and attention.applies(cpu, torch.float16)
    assert not attention.applies(cpu, torch.float32) and not attention.applies(cpu, None)
    assert not attention.applies(gpu, torch.bfloat16)


def test_other_attention_implementations_are_left_alone(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation="eager")
    assert not attention.use_float32_attention(model)
    assert model.config._attn_implementation == "eager"
