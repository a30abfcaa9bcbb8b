"""The trainer's memory plan: per-rank bytes of a job's model and trainer shape, and whether they fit.

:func:`plan` is a pure function of a model's shape (:class:`ModelShape`, read from its ``config.json``
by :func:`shape_from_config`) and the trainer's shape (:class:`TrainerShape`); ``rft plan JOB.yaml``
prints it. It counts what the trainer holds, as it holds it (``docs/how-to/memory.md``):

* **parameters**: every parameter in the stored dtype (``model.dtype``: ``auto`` and ``float32`` store
  float32, ``bfloat16``/``float16`` two bytes), divided by the world size N where FSDP2 shards them
  (N > 1; one rank keeps a plain module). With ``auto`` the float32 parameters *are* the master
  weights: there is no separate copy. With ``bfloat16`` there are no float32 master weights at all
  (AdamW's state is then bfloat16 too, as torch keeps it in the parameter's dtype).
* **gathered**: the compute-dtype copies the forward and backward use: at N = 1 with bfloat16 compute
  over float32 parameters (``auto`` on a GPU) autocast's bfloat16 copy of every weight; at N > 1 FSDP2's
  unsharded root (embeddings, final norm, output layer) and two decoder layers (the one running and the
  one prefetched).
* **gradients**: the trainable parameters' gradients in the stored dtype, sharded like the parameters.
* **optimizer**: AdamW's two moments of every trainable parameter, in the stored dtype, sharded.
* **activations**: per micro-batch of ``b`` rows of ``s = maxPromptTokens + maxTokens`` tokens, what
  autograd keeps per decoder layer and token, ``e`` bytes each (the compute dtype):
  ``e·(4h + 2q + 2kv + 4i)`` (the two norms' inputs and outputs, queries, keys and values, the
  attention's output, the MLP's gate, up, activation and product; h hidden, q = heads·head_dim,
  kv = kv_heads·head_dim, i intermediate size; attention keeps no s×s matrix, as the fused kernels do
  not). With gradient checkpointing only each layer's input is kept (``h`` values in the residual
  stream's dtype, float32 under ``auto``) plus one layer's full activations while it is recomputed.
  The output layer's logits are kept for the ``r = maxTokens`` response positions only (the trainer's
  ``logits_to_keep``) in the compute dtype and three float32 copies (the float32 logits, the
  log-softmax and its gradient): ``b·r·V·(e + 12)``.

With ``trainer.cpuOffload`` on a GPU the parameters, gradients and AdamW state (sharded as above) are
held in the host's memory, not the device's (FSDP2's CPU offload, every world size): the device keeps the
gathered root and two layers, the activations and the logits. On a CPU trainer offload moves nothing.

A device *fits* when the total is at most :data:`USABLE_FRACTION` of its memory (the rest: the CUDA
context, the allocator's fragmentation, communication buffers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

USABLE_FRACTION = 0.9
"""The share of a device's memory a plan may fill."""

GIB = 2**30

_STORED_BYTES = {"auto": 4, "float32": 4, "bfloat16": 2, "float16": 2}


class PlanError(ValueError):
    """A model or trainer shape the plan cannot be made for; the message names the field."""


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's sizes (Llama / Qwen2 style: grouped key/value heads, gated MLP)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    head_dim: int = 0
    """0: ``hidden // heads``."""
    qkv_bias: bool = False
    """Biases on the query, key and value projections (Qwen2)."""
    o_bias: bool = False
    mlp_bias: bool = False

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        return self.heads * self.dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.dim

    def layer_parameters(self) -> int:
        """One decoder layer: attention projections, gated MLP, two RMSNorm weights."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        attn = h * q + 2 * h * kv + q * h + (q + 2 * kv if self.qkv_bias else 0) + (h if self.o_bias else 0)
        mlp = 3 * h * i + (2 * i + h if self.mlp_bias else 0)
        return attn + mlp + 2 * h

    def root_parameters(self) -> int:
        """Outside the decoder layers: embeddings, the final norm, an untied output layer."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2) + self.hidden

    def parameters(self) -> int:
        return self.root_parameters() + self.layers * self.layer_parameters()

    def lora_parameters(self, rank: int, targets: list[str]) -> int:
        """A LoRA adapter of ``rank`` on the named projections of every layer: ``rank·(in + out)`` each."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                  "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
        unknown = [t for t in targets if t not in shapes]
        if unknown:
            raise PlanError(f"spec.model.lora.targetModules: the plan knows {sorted(shapes)}, not {unknown}")
        return self.layers * sum(rank * sum(shapes[t]) for t in targets)


def _int(config: dict[str, Any], key: str, default: int | None = None) -> int:
    v = config.get(key, default)
    if v is None:
        raise PlanError(f"config.json: no {key!r}")
    return int(v)


def shape_from_config(config: dict[str, Any]) -> ModelShape:
    """The :class:`ModelShape` of a Hugging Face ``config.json`` (a dict)."""
    heads = _int(config, "num_attention_heads")
    model_type = str(config.get("model_type", ""))
    return ModelShape(
        hidden=_int(config, "hidden_size"), layers=_int(config, "num_hidden_layers"), heads=heads,
        kv_heads=_int(config, "num_key_value_heads", heads), intermediate=_int(config, "intermediate_size"),
        vocab=_int(config, "vocab_size"), tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        head_dim=int(config.get("head_dim") or 0),
        qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
        o_bias=model_type != "qwen2" and bool(config.get("attention_bias", False)),
        mlp_bias=bool(config.get("mlp_bias", False)),
    )


def builtin_config(name: str) -> dict[str, Any]:
    """The ``config.json`` fields of a ``builtin:`` model, from its sizes (nothing is built)."""
    from ..model.builtin import _SIZES, BUILTIN_MODELS
    from ..model.tiny import TinyModelConfig
    from ..model.tokenizer import VOCAB_SIZE

    if name not in BUILTIN_MODELS:
        raise PlanError(f"spec.model.base: builtin:{name} is not one of {', '.join(BUILTIN_MODELS)}")
    c = TinyModelConfig(**_SIZES.get(name, {}))
    return {"model_type": "qwen2", "hidden_size": c.hidden, "num_hidden_layers": c.layers,
            "num_attention_heads": c.heads, "num_key_value_heads": c.kv_heads, "intermediate_size": c.intermediate,
            "vocab_size": VOCAB_SIZE, "tie_word_embeddings": True}


def read_config(path: str | Path) -> dict[str, Any]:
    """A ``config.json`` (``path`` is the file or its model directory)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        return dict(json.loads(p.read_text()))
    except FileNotFoundError:
        raise PlanError(f"{p}: no such file (for a model that is not on this machine, pass --config "
                        "PATH to its config.json)") from None


@dataclass(frozen=True)
class TrainerShape:
    """What of an RFTJob's spec the plan reads (see :func:`trainer_shape`)."""

    world_size: int
    micro_batch: int
    prompt_tokens: int
    response_tokens: int
    dtype: str = "auto"
    gpu: bool = True
    lora_rank: int | None = None
    lora_targets: tuple[str, ...] = ()
    gradient_checkpointing: bool = False
    cpu_offload: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in _STORED_BYTES:
            raise PlanError(f"spec.model.dtype: {self.dtype!r} is not one of {sorted(_STORED_BYTES)}")
        if self.world_size < 1 or self.micro_batch < 1:
            raise PlanError("trainer world size and spec.trainer.microBatchSize must be >= 1")

    @property
    def stored_bytes(self) -> int:
        return _STORED_BYTES[self.dtype]

    @property
    def compute_bytes(self) -> int:
        """bfloat16 compute over float32 parameters for ``auto`` on a GPU, else the stored dtype."""
        return 2 if self.dtype == "auto" and self.gpu else self.stored_bytes


def trainer_shape(spec: Any, gpu: bool | None = None) -> TrainerShape:
    """The :class:`TrainerShape` of an ``RFTJobSpec`` (``gpu``: None reads the trainer's GPU resources)."""
    from rft_api.spec import gpu_count

    t, lora = spec.trainer, spec.model.lora
    return TrainerShape(
        world_size=t.world_size(), micro_batch=t.micro_batch_size, prompt_tokens=spec.rollout.max_prompt_tokens,
        response_tokens=spec.rollout.max_tokens * spec.rollout.max_turns, dtype=spec.model.dtype,
        gpu=gpu_count(t.resources) > 0 if gpu is None else gpu,
        lora_rank=None if lora is None else lora.rank, lora_targets=tuple(lora.target_modules) if lora else (),
        gradient_checkpointing=bool(t.gradient_checkpointing), cpu_offload=bool(t.cpu_offload),
    )


@dataclass(frozen=True)
class MemoryPlan:
    """Per-rank bytes by part (:data:`PARTS`), which of them the host holds (``trainer.cpuOffload``), and
    whether the device holds the rest."""

    parameters_total: int
    trainable: int
    parts: dict[str, int]
    device_memory: int | None
    on_host: tuple[str, ...] = ()

    @property
    def device_bytes(self) -> int:
        return sum(v for k, v in self.parts.items() if k not in self.on_host)

    @property
    def host_bytes(self) -> int:
        """What the host holds for the device (offloaded parts); 0 without offload."""
        return sum(v for k, v in self.parts.items() if k in self.on_host)

    @property
    def fits(self) -> bool | None:
        """None where the device's memory is not known."""
        if self.device_memory is None:
            return None
        return self.device_bytes <= USABLE_FRACTION * self.device_memory


PARTS = ("parameters", "gathered", "gradients", "optimizer", "activations", "logits")

OFFLOADED = ("parameters", "gradients", "optimizer")
"""The parts ``trainer.cpuOffload`` keeps on the host."""


def activation_bytes(m: ModelShape, t: TrainerShape) -> int:
    """Activations of the decoder layers for one micro-batch (see the module docstring)."""
    tokens = t.micro_batch * (t.prompt_tokens + t.response_tokens)
    e = t.compute_bytes
    per_layer_token = e * (4 * m.hidden + 2 * m.q_dim + 2 * m.kv_dim + 4 * m.intermediate)
    if not t.gradient_checkpointing:
        return m.layers * tokens * per_layer_token
    return m.layers * tokens * m.hidden * t.stored_bytes + tokens * per_layer_token


def plan(m: ModelShape, t: TrainerShape, device_memory: int | None = None) -> MemoryPlan:
    """The per-rank memory of training ``m`` with ``t`` (bytes; see the module docstring)."""
    n, p = t.world_size, m.parameters()
    trainable = p if t.lora_rank is None else m.lora_parameters(t.lora_rank, list(t.lora_targets))
    stored = p + (trainable if t.lora_rank is not None else 0)
    offload = t.cpu_offload and t.gpu
    if n > 1 or offload:  # FSDP2 (offloaded: at every world size): the root and two layers unsharded
        gathered = (m.root_parameters() + 2 * m.layer_parameters()) * t.compute_bytes
    else:
        gathered = p * 2 if t.compute_bytes < t.stored_bytes else 0
    parts = {
        "parameters": -(-stored * t.stored_bytes // n),
        "gathered": gathered,
        "gradients": -(-trainable * t.stored_bytes // n),
        "optimizer": -(-2 * trainable * t.stored_bytes // n),
        "activations": activation_bytes(m, t),
        "logits": t.micro_batch * t.response_tokens * m.vocab * (t.compute_bytes + 12),
    }
    return MemoryPlan(p, trainable, parts, device_memory, OFFLOADED if offload else ())


def gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def render(mp: MemoryPlan, m: ModelShape, t: TrainerShape) -> str:
    """The plan as text: the shapes, a table of parts, the totals and the verdict."""
    lines = [
        f"model: {mp.parameters_total:,} parameters ({m.layers} layers, hidden {m.hidden}, heads {m.heads}/"
        f"{m.kv_heads} kv, intermediate {m.intermediate}, vocab {m.vocab}, "
        f"{'tied' if m.tied_embeddings else 'untied'} embeddings); trainable {mp.trainable:,}"
        + (f" (LoRA rank {t.lora_rank} on {', '.join(t.lora_targets)})" if t.lora_rank else " (full)"),
        f"trainer: world size {t.world_size}, {'GPU' if t.gpu else 'CPU'}, model.dtype {t.dtype} (stored "
        f"{t.stored_bytes} B, compute {t.compute_bytes} B), micro-batch {t.micro_batch} x "
        f"{t.prompt_tokens}+{t.response_tokens} tokens, gradient checkpointing "
        f"{'on' if t.gradient_checkpointing else 'off'}, CPU offload "
        + ("on" if mp.on_host else "on (moves nothing on a CPU trainer)" if t.cpu_offload else "off"),
        "",
        f"{'per rank':<14}{'bytes':>18}{'':>14}",
    ]
    for k in PARTS:
        lines.append(f"{k:<14}{mp.parts[k]:>18,}{gib(mp.parts[k]):>14}" + ("  (host)" if k in mp.on_host else ""))
    lines.append(f"{'device total':<14}{mp.device_bytes:>18,}{gib(mp.device_bytes):>14}")
    if mp.on_host:
        lines.append(f"{'host total':<14}{mp.host_bytes:>18,}{gib(mp.host_bytes):>14}  (per rank, offloaded)")
    if mp.device_memory is None:
        lines.append("fits: unknown (pass --device-memory, e.g. 80GiB)")
    else:
        verdict = "yes" if mp.fits else "NO"
        lines.append(f"fits: {verdict} ({gib(mp.device_bytes)} of {gib(mp.device_memory)} per device, "
                     f"{USABLE_FRACTION:.0%} of it usable)")
    return "\n".join(lines) + "\n"


def _quantity_bytes(q: str, field: str) -> int:
    from rft_api.spec import quantity_value

    try:
        return int(quantity_value(q.removesuffix("B")))
    except ValueError:
        raise PlanError(f"{field}: {q!r} is not a quantity (80GiB, 80Gi, 141G)") from None


def model_config(spec: Any, config_path: str | None = None) -> dict[str, Any]:
    """The job's model's ``config.json``: ``config_path`` when given, a ``builtin:`` model's sizes, or the
    file in the model's directory on this machine (a ``pvc://`` claim under ``$RFT_CLAIMS_DIR``, a fetched
    ``hf://`` or ``s3://`` model in ``rft run``'s inputs cache)."""
    import os

    from rft_api import layout

    if config_path:
        return read_config(config_path)
    base = spec.model.base
    if layout.is_builtin_model(base):
        return builtin_config(base.removeprefix(layout.BUILTIN_PREFIX))
    claims = os.environ.get("RFT_CLAIMS_DIR", layout.CLAIMS_DIR)
    try:
        return read_config(layout.model_path(spec, claims_root=claims))
    except PlanError as e:
        raise PlanError(f"spec.model.base {base}: {e}") from None


def run_plan(spec: Any, config_path: str | None, device_memory: str | None, device: str | None) -> int:
    """``rft plan``: print the plan of ``spec``; 0 when it fits or the device memory is unknown, 1 when it
    does not fit, 2 when no plan can be made."""
    import sys

    from rft_api.spec import gpu_count

    try:
        m = shape_from_config(model_config(spec, config_path))
        t = trainer_shape(spec, None if device is None else device == "gpu")
        memory = _quantity_bytes(device_memory, "--device-memory") if device_memory else None
        limits = (spec.trainer.resources.limits or {}) if spec.trainer.resources else {}
        if memory is None and not t.gpu and "memory" in limits and not gpu_count(spec.trainer.resources):
            memory = _quantity_bytes(str(limits["memory"]), "spec.trainer.resources.limits.memory")
            memory //= spec.trainer.processes()
        mp = plan(m, t, memory)
    except PlanError as e:
        print(f"rft plan: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(render(mp, m, t))
    return 1 if mp.fits is False else 0


REFERENCE_MODELS: dict[str, dict[str, Any]] = {
    "Qwen2.5-0.5B": {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                     "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
                     "tie_word_embeddings": True},
    "Llama-2-7B": {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                   "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 32000,
                   "tie_word_embeddings": False},
    "Llama-2-70B": {"model_type": "llama", "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
                    "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 32000,
                    "tie_word_embeddings": False},
}
"""The published ``config.json`` sizes of the models of the documentation's table."""

DOC_SHAPE = {"micro_batch": 8, "prompt_tokens": 512, "response_tokens": 512, "dtype": "auto", "gpu": True}
"""The trainer shape of the documentation's table (besides nodes and the switches)."""


def doc_table(device_memory: int = 80 * 10**9, gpus_per_node: int = 8) -> str:
    """The Markdown table of ``docs/how-to/memory.md``: full fine-tuning of :data:`REFERENCE_MODELS` on nodes of
    ``gpus_per_node`` devices of ``device_memory`` bytes (80 GB), per rank, in GiB."""
    rows = [("Qwen2.5-0.5B", 1, False), ("Llama-2-7B", 1, False), ("Llama-2-70B", 1, False),
            ("Llama-2-70B", 2, False), ("Llama-2-70B", 4, False), ("Llama-2-70B", 1, True)]
    out = ["| model | parameters | nodes × GPUs | gradient checkpointing | CPU offload | params + gathered | grads "
           "| AdamW | activations + logits | device total | host (offloaded) | fits 80 GB |",
           "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, nodes, offload in rows:
        m = shape_from_config(REFERENCE_MODELS[name])
        for ckpt in (False, True):
            t = TrainerShape(world_size=nodes * gpus_per_node, gradient_checkpointing=ckpt, cpu_offload=offload,
                             **DOC_SHAPE)  # type: ignore[arg-type]
            mp = plan(m, t, device_memory)
            g = {k: v / GIB for k, v in mp.parts.items()}
            out.append(f"| {name} | {mp.parameters_total / 1e9:.2f} B | {nodes} × {gpus_per_node} | "
                       f"{'on' if ckpt else 'off'} | {'on' if offload else 'off'} | "
                       f"{g['parameters'] + g['gathered']:.1f} | {g['gradients']:.1f} | {g['optimizer']:.1f} | "
                       f"{g['activations'] + g['logits']:.1f} | {mp.device_bytes / GIB:.1f} | "
                       f"{mp.host_bytes / GIB:.1f} | {'yes' if mp.fits else 'no'} |")
    return "\n".join(out) + "\n"
