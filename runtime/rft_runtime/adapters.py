"""Policy versions served as LoRA adapters (vLLM with ``inference.weightSync: lora``).

An engine that hot-loads adapters serves the base model under the job's served name and each
published policy version as its own adapter named ``<served>-v<version>``. The trainer loads the
adapter of version ``v`` before it grants any work at ``v`` (``/v1/load_lora_adapter``) and unloads
adapters older than the ones it keeps; a rollout granted at version ``v`` requests model
``<served>-v<v>``, and the engine echoes that name in every response, so each sample names the exact
weights that produced it.

This module is the one place that naming lives; the trainer (:mod:`.trainer.reload`) and the rollout
client (:class:`.rollout.InferenceClient`) both use it.
"""

from __future__ import annotations

import re

SEPARATOR = "-v"


def serves_adapters(engine: str, weight_sync: str) -> bool:
    """Whether inference serves each policy version as a named adapter. The builtin server loads
    adapters in place (``/update_weights_from_disk``) and keeps one model name."""
    return engine != "builtin" and weight_sync == "lora"


def adapter_name(served_model: str, version: int) -> str:
    """The adapter (model) name of policy ``version``."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"policy version must be an integer >= 0, got {version!r}")
    return f"{served_model}{SEPARATOR}{version}"


def adapter_version(served_model: str, name: object) -> int | None:
    """The policy version named by adapter ``name``; None when ``name`` is not one of this model's
    adapters (the base model, another job's adapter, not a string)."""
    if not isinstance(name, str):
        return None
    m = re.fullmatch(re.escape(served_model + SEPARATOR) + r"(0|[1-9][0-9]*)", name)
    return int(m.group(1)) if m else None
