"""``builtin:`` model specs of an RFTJob's ``baseModel``, built on demand and cached.

- ``builtin:tiny``: the tiny model warm-started on ``arithmetic`` for
  :data:`DEFAULT_WARM_START_STEPS` steps (rewards at step 0 are neither all 0 nor all 1).
- ``builtin:tiny-vllm``: the same recipe with head size 32 (2 heads instead of 4), the smallest
  vLLM's CPU attention serves; for jobs whose inference engine is vLLM.
- ``builtin:tiny-random``: the randomly initialised tiny model.

A build lands in ``cache_dir/tiny-s<seed>-ws<steps>-<hash>`` where the hash covers the sizes, seed
and warm-start settings. Builders take an exclusive lock (``cache_dir/.<name>.lock``), so concurrent
resolvers (several local roles) build once and the others wait and reuse; the build is written to a
temporary directory and renamed into place, so no reader ever sees a half-written model.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .tiny import TinyModelConfig

__all__ = ["BUILTIN_MODELS", "DEFAULT_WARM_START_STEPS", "default_cache_dir", "resolve_builtin_model",
           "is_builtin_spec"]

DEFAULT_WARM_START_STEPS = 700
DEFAULT_WARM_START_DATASET = "arithmetic"
# Everything that shapes the warm start; part of the cache key, so a change here rebuilds.
WARM_START_RECIPE: dict[str, Any] = {"lr": 3e-3, "batch_size": 32, "num_tasks": 2000, "threads": 1,
                                     "dataset_options": {"max_operand": 20, "ops": "+-"}}
BUILTIN_MODELS = ("tiny", "tiny-random", "tiny-vllm")
# Sizes per builtin model (the defaults of TinyModelConfig unless named here).
_SIZES = {"tiny-vllm": {"heads": 2, "kv_heads": 2}}
_PREFIX = "builtin:"


def _prompt_format() -> str:
    """A fingerprint of the warm-start task's prompts: the cache key changes when their wording does
    (a model warm-started on other wording starts RL far from where it should)."""
    from ..data import load_builtin

    tasks = load_builtin(DEFAULT_WARM_START_DATASET, 3, seed=0, **WARM_START_RECIPE["dataset_options"])
    return json.dumps([t.to_dict() for t in tasks], sort_keys=True)


def is_builtin_spec(spec: str) -> bool:
    """True for ``builtin:<name>`` specs."""
    return isinstance(spec, str) and spec.startswith(_PREFIX)


PREBUILT_ENV = "RFT_PREBUILT_MODELS"


def default_cache_dir() -> Path:
    """``$RFT_MODEL_CACHE`` or ``~/.cache/rft-operator/models``."""
    env = os.environ.get("RFT_MODEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "rft-operator" / "models"


def resolve_builtin_model(
    spec_base: str,
    cache_dir: str | Path | None = None,
    *,
    seed: int = 0,
    warm_start_steps: int | None = None,
) -> Path:
    """The directory of the model named by ``spec_base`` (``builtin:tiny`` or ``builtin:tiny-random``).

    Builds it on first use (offline, deterministic) under ``cache_dir`` (default
    :func:`default_cache_dir`) and returns the cached directory afterwards. A copy already built
    in ``$RFT_PREBUILT_MODELS`` (read-only; the runtime image ships one) is used as is instead of
    building another. ``warm_start_steps``
    overrides the default for ``builtin:tiny``.
    """
    if not is_builtin_spec(spec_base):
        raise ValueError(f"baseModel {spec_base!r} is not a builtin spec (expected 'builtin:<name>')")
    name = spec_base[len(_PREFIX):]
    if name not in BUILTIN_MODELS:
        raise ValueError(f"unknown builtin model {spec_base!r}; known: "
                         + ", ".join(_PREFIX + n for n in BUILTIN_MODELS))
    steps = 0 if name == "tiny-random" else (DEFAULT_WARM_START_STEPS if warm_start_steps is None else warm_start_steps)
    if steps < 0:
        raise ValueError(f"builtin model: field 'warm_start_steps' must be >= 0, got {steps}")
    sizes = _SIZES.get(name, {})
    cfg = TinyModelConfig(**sizes)
    key_blob = json.dumps({"model": cfg.key(seed), "ws": steps, "ds": DEFAULT_WARM_START_DATASET,
                           "recipe": WARM_START_RECIPE if steps else None,
                           "prompts": _prompt_format() if steps else None}, sort_keys=True)
    key = hashlib.sha256(key_blob.encode()).hexdigest()[:12]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / f"tiny-s{seed}-ws{steps}-{key}"
    if (final / "model.safetensors").exists():
        return final
    prebuilt = os.environ.get(PREBUILT_ENV)  # read-only copies, e.g. built into the runtime image
    if prebuilt and (Path(prebuilt) / final.name / "model.safetensors").exists():
        return Path(prebuilt) / final.name
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (final / "model.safetensors").exists():
            return final  # built by another process while we waited
        from .tiny import make_tiny_model
        from .warm_start import warm_start  # torch: imported only when a model is built

        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
        try:
            make_tiny_model(tmp, seed, **sizes)
            if steps:
                warm_start(tmp, DEFAULT_WARM_START_DATASET, steps, seed, tmp, **WARM_START_RECIPE)
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; the model is for every role to read
            if final.exists():  # a leftover without weights (interrupted copy): replace it
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final
