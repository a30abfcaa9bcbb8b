"""A vLLM worker extension (``--worker-extension-cls rft_vllm_worker.RFTWorkerExtension``) that the gate calls
through ``/collective_rpc`` to load a policy version. It runs inside vLLM's workers, so it imports nothing of
this project: the inference pod's init container copies this file alone onto vLLM's ``PYTHONPATH``
(:func:`rft_runtime.gate.extension.install`).

``rft_reload_weights(weights_path)`` is vLLM's in-place ``reload_weights`` plus one repair: a layer whose
weight is tied to another's (an LM head tied to the embeddings) is not in the checkpoint, so the reload never
re-processes it, and a platform that repacks weights for its kernels (vLLM's CPU build packs linear weights for
oneDNN) would keep computing with the old ones. Every such layer is processed again from its current weight.
"""

from __future__ import annotations

from typing import Any


class RFTWorkerExtension:
    """Mixed into vLLM's worker class by ``--worker-extension-cls``."""

    def rft_reload_weights(self, weights_path: str) -> int:
        """Reload the weights at ``weights_path`` in place; returns how many tied layers were re-processed."""
        worker: Any = self
        worker.reload_weights(weights_path=weights_path)
        return refresh_tied_layers(worker.model_runner.get_model())


def refresh_tied_layers(model: Any) -> int:
    """Run ``process_weights_after_loading`` again on every layer whose weight shares its storage with an
    earlier layer's (weight tying); returns how many."""
    seen: set[int] = set()
    refreshed = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        method = getattr(module, "quant_method", None)
        if weight is None or method is None or getattr(weight, "is_meta", False) or weight.numel() == 0:
            continue
        ptr = weight.untyped_storage().data_ptr()
        if ptr in seen:
            method.process_weights_after_loading(module)
            refreshed += 1
        seen.add(ptr)
    return refreshed
