"""Attention in float32 where the trainer computes in a lower precision on the CPU.

Under ``torch.autocast`` on the CPU, torch runs ``scaled_dot_product_attention`` in bfloat16, and its CPU
flash attention is slower in bfloat16 than in float32: on the development machine (AVX512-BF16) the
backward took 214 ms of a step in bfloat16 against 109 ms in float32, while the matrix products around it
are twice as fast in bfloat16. So where the trainer computes in bfloat16 or float16 on the CPU
(``model.dtype: bfloat16`` there), the model's attention is :func:`sdpa_float32`: its queries, keys and
values are cast to float32, the attention runs with autocast off, and its output is cast back to the
queries' dtype. Everything else computes as before. ``bench/trainer_vs_trl.py --bf16`` measured the
step 7-15 % shorter over five interleaved pairs of runs, and the step-1 gradient norm closer to the
float32 one (docs/trainer.md).

The function is registered with transformers under :data:`NAME`, both as an attention function and as a
mask function (the boolean mask that ``sdpa`` takes): an attention function registered alone would be
given no mask, and padding would be attended to.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)

NAME = "rft_sdpa_float32"
LOWER_PRECISION = (torch.bfloat16, torch.float16)


def sdpa_float32(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """transformers' ``sdpa`` attention computed in float32 with autocast off; the output in ``query``'s
    dtype."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    dtype = query.dtype
    with torch.autocast(query.device.type, enabled=False):
        if attention_mask is not None and attention_mask.is_floating_point():
            attention_mask = attention_mask.float()
        out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask,
                                              **kwargs)
    return out.to(dtype), weights


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, sdpa_float32)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def applies(device: torch.device, compute_dtype: torch.dtype | None) -> bool:
    """Whether the trainer's attention runs in float32: a lower-precision compute dtype on the CPU."""
    return device.type == "cpu" and compute_dtype in LOWER_PRECISION


def use_float32_attention(model: torch.nn.Module) -> bool:
    """Make ``model`` (a transformers model using ``sdpa``) attend with :func:`sdpa_float32`. Returns
    whether it did: a model with another attention implementation (eager, flash, a LoRA wrapper's
    base model not exposing it) is left as it is."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) not in ("sdpa", NAME):
        return False
    _register()
    model.set_attn_implementation(NAME)  # type: ignore[operator]  # a transformers PreTrainedModel's
    log.info("attention runs in float32 (the rest in the lower-precision compute dtype on the CPU)")
    return True
