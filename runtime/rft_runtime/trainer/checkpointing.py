"""Activation (gradient) checkpointing per decoder layer (``trainer.gradientCheckpointing``).

Each decoder layer keeps only its input during the forward; the backward runs the layer's forward again
to get the activations it needs (torch's non-reentrant ``torch.utils.checkpoint``, through transformers'
``activation_checkpointing_enable``, which checkpoints every ``GradientCheckpointingLayer``: Llama's,
Qwen2's and so the builtin tiny model's decoder layers). The loss and the gradients are those of the plain
forward up to float rounding (``tests/trainer/test_checkpointing.py``): the recomputation is the same
operations on the same inputs, and the layers have no dropout or RNG state that differs (torch saves and
restores the RNG state for a recomputation that draws random numbers). FSDP2's hooks stay outside the
recomputed ``forward``, so the recomputation gathers nothing again beyond what the backward gathers.

A checkpointed layer cannot extend a key/value cache in its training forward (transformers drops the
cache there), so a model that checkpoints runs every micro-batch's rows whole: the shared-prompt
forwards of :mod:`.prefix` are off for it (:func:`checkpointed`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ..model.loading import ModelLoadError

log = logging.getLogger(__name__)

FIELD = "trainer.gradientCheckpointing"


class CheckpointingUnsupported(ModelLoadError):
    """The model has no decoder layers transformers can checkpoint; the message names the field."""


def _pretrained(model: torch.nn.Module) -> Any:
    """The transformers model under a peft wrapper (or ``model`` itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def enable(model: torch.nn.Module) -> int:
    """Checkpoint every decoder layer of ``model`` (a transformers causal LM, LoRA-wrapped or not);
    returns how many layers checkpoint. Raises :class:`CheckpointingUnsupported` for a model that
    cannot."""
    base = _pretrained(model)
    turn_on = getattr(base, "activation_checkpointing_enable", None)
    if not getattr(base, "supports_gradient_checkpointing", False) or not callable(turn_on):
        raise CheckpointingUnsupported(f"{FIELD}: the model ({type(base).__name__}) does not support activation "
                                       "checkpointing; set it to false")
    turn_on(activation_checkpointing_kwargs={"use_reentrant": False})
    from transformers.modeling_layers import GradientCheckpointingLayer

    # isinstance, not the class name: FSDP2 renames a sharded layer's class (FSDPQwen2DecoderLayer)
    n = sum(1 for m in base.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing)
    if n == 0:
        raise CheckpointingUnsupported(f"{FIELD}: no decoder layer of {type(base).__name__} can be checkpointed; "
                                       "set it to false")
    log.info("activation checkpointing: %d decoder layers recompute their activations in the backward", n)
    return n


def checkpointed(model: torch.nn.Module) -> bool:
    """Whether ``model``'s decoder layers checkpoint (see the module: then no shared-prompt forwards)."""
    return bool(getattr(_pretrained(model), "is_activation_checkpointing", False))
