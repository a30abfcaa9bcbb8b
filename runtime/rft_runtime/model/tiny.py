"""The tiny Qwen2-architecture model, built offline and deterministically from a seed.

:func:`make_tiny_model` writes a Hugging Face checkpoint directory (``config.json``,
``generation_config.json``, ``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``,
``chat_template.jinja``) that ``AutoModelForCausalLM`` / ``AutoTokenizer`` and vLLM load. Its config
mirrors the fields of the checkpoint vLLM accepted in ``contracts/vllm/tiny-qwen2`` (float32,
tied embeddings, ``eos_token_id`` 2, pad 0, no bos). The same seed and sizes give byte-identical
files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from .tokenizer import VOCAB_SIZE, build_tokenizer  # noqa: E402

if TYPE_CHECKING:  # torch and transformers are imported where a model is built: the sizes and cache
    from transformers import Qwen2Config  # keys stay cheap to compute (rft run checks its cache first)

__all__ = ["TinyModelConfig", "make_tiny_model", "seeded_torch", "BUILD_INFO_FILE"]

BUILD_INFO_FILE = "rft_build.json"
_FORMAT_VERSION = 1  # bump when the build changes in a way that must invalidate caches


@dataclass(frozen=True)
class TinyModelConfig:
    """Sizes of the tiny model. ``hidden`` must be divisible by ``heads``, ``heads`` by ``kv_heads``."""

    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 256
    max_position_embeddings: int = 512
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        for name in ("hidden", "layers", "heads", "kv_heads", "intermediate", "max_position_embeddings"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"tiny model: field {name!r} must be >= 1")
        if self.hidden % self.heads:
            raise ValueError(f"tiny model: field 'hidden' ({self.hidden}) must be divisible by 'heads' ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"tiny model: field 'heads' ({self.heads}) must be divisible by 'kv_heads' ({self.kv_heads})")
        if (self.hidden // self.heads) % 2:
            raise ValueError("tiny model: head size (hidden / heads) must be even for rotary embeddings")

    def to_qwen2(self) -> Qwen2Config:
        """The transformers config (fields as in the vLLM-accepted reference checkpoint)."""
        from transformers import Qwen2Config

        return Qwen2Config(
            vocab_size=VOCAB_SIZE,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            max_position_embeddings=self.max_position_embeddings,
            rope_parameters={"rope_theta": float(self.rope_theta), "rope_type": "default"},
            tie_word_embeddings=True,
            rms_norm_eps=1e-6,
            hidden_act="silu",
            initializer_range=0.02,
            use_sliding_window=False,
            bos_token_id=None,
            eos_token_id=2,
            pad_token_id=0,
            dtype="float32",
            architectures=["Qwen2ForCausalLM"],
        )

    def key(self, seed: int) -> str:
        """A short hash of (sizes, seed, build format) used for cache directory names."""
        blob = json.dumps({"cfg": asdict(self), "seed": seed, "v": _FORMAT_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


@contextlib.contextmanager
def seeded_torch(seed: int, threads: int | None = None) -> Iterator[None]:
    """Seed torch's CPU RNG (restored afterwards) and optionally pin the thread count."""
    import torch

    old_threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if threads is not None:
            torch.set_num_threads(threads)
        try:
            yield
        finally:
            if threads is not None:
                torch.set_num_threads(old_threads)


def save_checkpoint(model: Any, out_dir: Path, info: dict[str, Any]) -> Path:
    """Save the model, a freshly built tokenizer and :data:`BUILD_INFO_FILE` (deterministic bytes)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    build_tokenizer().save_pretrained(out_dir)
    (out_dir / BUILD_INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return out_dir


def make_tiny_model(
    out_dir: str | Path,
    seed: int = 0,
    *,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 256,
    max_position_embeddings: int = 512,
) -> Path:
    """Build the randomly initialised tiny model for ``seed`` into ``out_dir``; returns the path.

    Offline and deterministic: the same arguments give byte-identical files.
    """
    from transformers import GenerationConfig, Qwen2ForCausalLM

    cfg = TinyModelConfig(hidden, layers, heads, kv_heads, intermediate, max_position_embeddings)
    out = Path(out_dir)
    with seeded_torch(seed):
        model = Qwen2ForCausalLM(cfg.to_qwen2())
    model.generation_config = GenerationConfig(eos_token_id=2, pad_token_id=0, bos_token_id=None)
    model.eval()
    info = {"kind": "rft-tiny", "format": _FORMAT_VERSION, "seed": seed, "config": asdict(cfg),
            "warm_start": None}
    return save_checkpoint(model, out, info)
