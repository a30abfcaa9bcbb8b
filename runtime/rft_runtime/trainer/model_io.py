"""Loading the policy (optionally with a LoRA adapter) and the frozen reference model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """The dtype parameters are stored (and optimised) in: ``auto`` is float32 on every device (on a
    GPU, :func:`compute_dtype` makes the forward/backward bfloat16 over these float32 master weights)."""
    if name == "auto":
        return torch.float32
    return DTYPES[name]


def compute_dtype(name: str, device: torch.device) -> torch.dtype | None:
    """The dtype of the forward/backward when it differs from the stored one: bfloat16 for ``auto``
    on a GPU, else None (compute in the stored dtype; never bfloat16 on the CPU by default)."""
    return torch.bfloat16 if name == "auto" and device.type == "cuda" else None


def load_base(model_dir: Path, dtype: torch.dtype, warm_start_from: str | None = None) -> torch.nn.Module:
    """The causal LM from ``model_dir``; weights from ``warm_start_from`` when given (a model
    directory, or one of our checkpoints holding ``weights.safetensors``)."""
    from transformers import AutoModelForCausalLM

    src = Path(warm_start_from) if warm_start_from else model_dir
    if warm_start_from and not (src / "config.json").exists():
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        from safetensors.torch import load_file

        from .state import WEIGHTS_FILE

        weights = src / WEIGHTS_FILE
        if not weights.exists():
            raise FileNotFoundError(f"spec.model.warmStartFrom: {src} has neither config.json nor {WEIGHTS_FILE}")
        missing, unexpected = model.load_state_dict(load_file(str(weights)), strict=False)
        if unexpected:
            raise ValueError(f"spec.model.warmStartFrom: {weights} has unexpected parameters {unexpected[:5]}")
        return model
    return AutoModelForCausalLM.from_pretrained(src, dtype=dtype)


def wrap_lora(model: torch.nn.Module, lora: Any) -> torch.nn.Module:
    """Wrap ``model`` with a fresh LoRA adapter (peft) per ``spec.model.lora``; only the adapter
    trains. Initialisation uses torch's RNG (seed it first for reproducibility)."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                     target_modules=list(lora.target_modules), bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, cfg)


def load_policy(model_spec: Any, model_dir: Path, seed: int, warm_start: str | None = None) -> torch.nn.Module:
    """The trainable policy: base (or warm-start, ``paths.warmStart``) weights, LoRA-wrapped when configured."""
    from ..model.loading import ModelLoadError

    dtype = torch_dtype(model_spec.dtype)
    try:
        model = load_base(model_dir, dtype, warm_start)
    except ValueError as e:  # what transformers raises for a model it cannot build (not for I/O)
        raise ModelLoadError(f"spec.model.base: {model_dir} cannot be loaded: {e}") from e
    if model_spec.lora is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            try:
                model = wrap_lora(model, model_spec.lora)
            except ValueError as e:  # peft: target modules not in the model
                raise ModelLoadError(f"spec.model.lora.targetModules: {e}") from e
    model.config.use_cache = False  # type: ignore[union-attr]
    return model


def load_sharded_policy(model_spec: Any, model_dir: Path, seed: int, warm_start: str | None, dist: Any,
                        compute: torch.dtype | None, compile_layers: bool = False) -> torch.nn.Module:
    """The policy of :func:`load_policy`, on this rank's device and sharded over the process group
    (:func:`~.distributed.shard`). Over two ranks or more, and without LoRA, it is built on the meta
    device and each rank reads only its own shards from the safetensors files (:mod:`.sharded_load`);
    one rank, a LoRA adapter (initialised from the seed on the whole model) or a model this loader
    cannot read (no safetensors) load whole first."""
    from .distributed import shard

    if model_spec.lora is None:
        model = _load_sharded(model_dir, torch_dtype(model_spec.dtype), warm_start, dist, compute, compile_layers)
        if model is not None:
            return model
    return shard(load_policy(model_spec, model_dir, seed, warm_start), dist, compute, compile_layers)


def _load_sharded(model_dir: Path, dtype: torch.dtype, warm_start: str | None, dist: Any, compute: torch.dtype | None,
                  compile_layers: bool, frozen: bool = False) -> torch.nn.Module | None:
    """:func:`.sharded_load.load_sharded` with transformers' refusals as :class:`ModelLoadError`."""
    from ..model.loading import ModelLoadError
    from .sharded_load import load_sharded

    try:
        return load_sharded(model_dir, dtype, warm_start, dist, compute, compile_layers, frozen=frozen)
    except ValueError as e:  # what transformers raises for a model it cannot build (not for I/O)
        raise ModelLoadError(f"spec.model.base: {model_dir} cannot be loaded: {e}") from e


class Reference:
    """Log-probabilities under the frozen reference policy (the starting weights).

    With LoRA the reference is the base model with the adapter disabled (no second copy);
    otherwise a separate frozen model is loaded, on this rank's device and sharded like the policy
    (``dist``: a :class:`~.distributed.DistContext`; None keeps it unsharded on the CPU), its decoder
    layers compiled like the policy's with ``compile_layers``. Over two ranks or more it is built on
    the meta device and each rank reads only its shards (:mod:`.sharded_load`), as for the policy.
    """

    def __init__(self, policy: torch.nn.Module, model_spec: Any, model_dir: Path, warm_start: str | None = None,
                 dist: Any = None, compile_layers: bool = False) -> None:
        self._policy = policy
        self._model: torch.nn.Module | None = None
        if not hasattr(policy, "disable_adapter") and dist is not None:
            self._model = _load_sharded(model_dir, torch_dtype(model_spec.dtype), warm_start, dist,
                                        compute_dtype(model_spec.dtype, dist.device), compile_layers, frozen=True)
        if not hasattr(policy, "disable_adapter") and self._model is None:
            self._model = load_base(model_dir, torch_dtype(model_spec.dtype), warm_start)
            self._model.config.use_cache = False  # type: ignore[union-attr]
            self._model.eval()
            for p in self._model.parameters():
                p.requires_grad_(False)
            if dist is not None:
                from .distributed import shard

                self._model = shard(self._model, dist, compute_dtype(model_spec.dtype, dist.device), compile_layers)

    def logprobs(self, batch: Any, temperature: float, micro_batch_size: int, shard: Any = None) -> torch.Tensor:
        """[B, L-1] reference log-probs (``shard``: see :func:`~.learner.sequence_logprobs`)."""
        from .learner import sequence_logprobs

        if self._model is not None:
            return sequence_logprobs(self._model, batch, temperature, micro_batch_size, shard)
        with self._policy.disable_adapter():  # type: ignore[operator]
            return sequence_logprobs(self._policy, batch, temperature, micro_batch_size, shard)
