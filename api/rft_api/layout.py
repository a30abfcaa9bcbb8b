"""Where things are inside a role's pod, and how the spec's relative paths resolve there.

One place for path resolution: the operator's builders mount volumes at these paths and write the
resolved paths into the runtime config (:mod:`rft_api.runtime`); the roles use those paths as they
are and never join a spec path to a mount themselves. ``rft run`` resolves the same spec fields with
the same functions (a relative path joins the volume's ``mountPath``, which on one machine is a local
directory).
"""
from __future__ import annotations

import posixpath
from typing import Optional

from .spec import DataSource, RFTJobSpec

CONFIG_DIR = "/etc/rft"
CONFIG_KEY = "config.json"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_KEY}"
CHAT_TEMPLATE_KEY = "chat_template.jinja"
EVALUATOR_DIR = f"{CONFIG_DIR}/evaluator"
DATASET_DIR = f"{CONFIG_DIR}/datasets"
CHECKPOINT_DIR = "/checkpoints"
CACHE_DIR = "/var/cache/rft"
MODEL_CACHE_DIR = f"{CACHE_DIR}/models"
TMP_DIR = "/tmp"

BUILTIN_PREFIX = "builtin:"

# Where the trainer publishes each policy version (``v<N>/``) under the checkpoint root, with
# ``current.json`` naming the version inference must serve; a builtin replica that starts loads it.
WEIGHTS_SUBDIR = "weights"
CURRENT_WEIGHTS_FILE = "current.json"
"""``{"policy_version": N, "path": "v<N>"}`` in the published weights directory, written (atomically)
once every discovered inference replica serves version N and before rollouts are granted it."""


def published_weights_dir(checkpoints: str = CHECKPOINT_DIR) -> str:
    """The directory of published policy versions under the checkpoint root ``checkpoints``."""
    return f"{checkpoints.rstrip('/')}/{WEIGHTS_SUBDIR}"

# The job's data-plane credential: every container of a job's pods gets it in this env var, from key
# ``token`` of Secret ``<job>-token`` (secretKeyRef; the operator creates the Secret once per job). The
# servers require it as ``Authorization: Bearer <token>``; the clients send it.
JOB_TOKEN_ENV = "RFT_JOB_TOKEN"
JOB_TOKEN_SECRET_KEY = "token"


def is_builtin_model(base: str) -> bool:
    """``builtin:<name>``: a model the runtime builds offline (no volume)."""
    return base.startswith(BUILTIN_PREFIX)


def model_path(spec: RFTJobSpec) -> str:
    """``spec.model.base`` resolved: ``builtin:<name>`` stays symbolic, an absolute path is kept, a
    relative one joins ``spec.model.volume.mountPath``."""
    base = spec.model.base
    if is_builtin_model(base) or base.startswith("/"):
        return base
    if spec.model.volume is None:  # refused by the ModelSpec rule; kept for callers with unchecked input
        raise ValueError(f"spec.model.base: {base!r} is relative but spec.model.volume is not set")
    return posixpath.join(spec.model.volume.mount_path, base)


def exported_model_path(spec: RFTJobSpec, model_cache: str = MODEL_CACHE_DIR) -> str:
    """Where an engine that needs a model directory finds the model (a builtin one is exported into
    ``model_cache`` by an init container)."""
    if is_builtin_model(spec.model.base):
        return posixpath.join(model_cache, spec.model.base[len(BUILTIN_PREFIX):])
    return model_path(spec)


def tokenizer_path(spec: RFTJobSpec) -> Optional[str]:
    """``spec.model.tokenizer`` resolved like the model (relative joins the model volume's mount)."""
    tok = spec.model.tokenizer
    if tok is None or tok.startswith("/") or spec.model.volume is None:
        return tok
    return posixpath.join(spec.model.volume.mount_path, tok)


def warm_start_path(spec: RFTJobSpec) -> Optional[str]:
    """``spec.model.warmStartFrom`` resolved like the model."""
    ws = spec.model.warm_start_from
    if ws is None or ws.startswith("/") or spec.model.volume is None:
        return ws
    return posixpath.join(spec.model.volume.mount_path, ws)


def dataset_path(split: str, src: Optional[DataSource], dataset_dir: str = DATASET_DIR) -> Optional[str]:
    """Where a dataset split is read (``None`` for builtin datasets and absent splits)."""
    if src is None or src.builtin is not None:
        return None
    if src.config_map_key_ref is not None:
        return posixpath.join(dataset_dir, split, src.config_map_key_ref.key)
    assert src.path is not None  # exactly one source: the DataSource rule
    if src.path.startswith("/") or src.volume is None:
        return src.path
    return posixpath.join(src.volume.mount_path, src.path)


def evaluator_file_path(index: int, key: str, evaluator_dir: str = EVALUATOR_DIR) -> str:
    """Where evaluator ``index``'s ConfigMap file is mounted: ``<dir>/<index>/<key>``."""
    return posixpath.join(evaluator_dir, str(index), key)


def api_key_env_name(index: int) -> str:
    """The env var that carries evaluator ``index``'s API key (its value comes from a Secret)."""
    return f"RFT_EVALUATOR_{index}_API_KEY"
