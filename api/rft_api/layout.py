"""Where things are inside a role's pod, and how the spec's relative paths resolve there.

One place for path resolution: the operator's builders mount volumes at these paths and write the
resolved paths into the runtime config (:mod:`rft_api.runtime`); the roles use those paths as they
are and never join a spec path to a mount themselves. ``rft run`` resolves the same spec fields with
the same functions (a relative path joins the volume's ``mountPath``, which on one machine is a local
directory).
"""
from __future__ import annotations

import hashlib
import posixpath
from dataclasses import dataclass
from typing import Literal, Optional

from .spec import DataSource, RFTJobSpec
from .storage import ClaimUri, is_uri, parse_uri

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

# Models and datasets named by hf:// or s3:// URIs are fetched once, before any role starts, into
# ``<checkpoints>/inputs/<key>/`` (``rft run``: into its cache), where every role reads them; a
# ``pvc://CLAIM/PATH`` is read in place, the claim mounted read-only at ``<CLAIMS_DIR>/<CLAIM>``.
INPUTS_SUBDIR = "inputs"
CLAIMS_DIR = "/mnt/claims"
FETCH_MANIFEST = ".rft-fetch.json"
"""Written last into a fetched input's directory: the URI, the revision it resolved to and every file
with its size and etag (a directory without it is an unfinished fetch)."""


@dataclass(frozen=True)
class Input:
    """One model or dataset the job fetches before its roles start."""

    field: str
    """The spec field that names it (``spec.model.base``, ``spec.dataset.train.uri``)."""
    uri: str
    kind: Literal["model", "dataset"]
    dest: str
    """Where it is fetched to (:func:`fetched_dir`)."""


def inputs_dir(checkpoints: str = CHECKPOINT_DIR) -> str:
    """Where fetched models and datasets live under the checkpoint root."""
    return f"{checkpoints.rstrip('/')}/{INPUTS_SUBDIR}"


def fetched_dir(uri: str, inputs: str) -> str:
    """The directory a fetched URI is written to: one per URI (a dataset repository's every split and
    config are fetched together), so a job that names a URI twice (its train and test splits) fetches
    it once."""
    key = hashlib.sha256(uri.encode()).hexdigest()[:16]
    return posixpath.join(inputs, key)


def claim_path(uri: ClaimUri, claims: str = CLAIMS_DIR) -> str:
    """Where a ``pvc://`` URI is read: its claim's mount joined with its path."""
    return posixpath.join(claims, uri.claim, uri.path) if uri.path else posixpath.join(claims, uri.claim)


def _fetched(uri: str) -> bool:
    return is_uri(uri) and not uri.startswith("pvc://")


def inputs(spec: RFTJobSpec, inputs_root: str) -> list[Input]:
    """Every hf:// or s3:// model and dataset of the job, in spec order (one entry per distinct
    destination)."""
    out: dict[str, Input] = {}
    if _fetched(spec.model.base):
        dest = fetched_dir(spec.model.base, inputs_root)
        out[dest] = Input("spec.model.base", spec.model.base, "model", dest)
    for where, _, src, _ in spec.dataset.sources():
        if src.uri is not None and _fetched(src.uri):
            dest = fetched_dir(src.uri, inputs_root)
            out.setdefault(dest, Input(f"{where}.uri", src.uri, "dataset", dest))
    return list(out.values())


def claims(spec: RFTJobSpec) -> list[str]:
    """The claims that ``pvc://`` URIs of the job name (each mounted read-only at ``CLAIMS_DIR``)."""
    uris = [spec.model.base, *(src.uri for _, _, src, _ in spec.dataset.sources() if src.uri)]
    found = [u.claim for u in (parse_uri(x) for x in uris if x.startswith("pvc://")) if isinstance(u, ClaimUri)]
    return list(dict.fromkeys(found))

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

# Storage credentials (``spec.storage``): the pods that fetch inputs or push the output get them in
# these env vars, each from the secretKeyRef the spec names; ``rft run`` reads them from its own
# environment (falling back to AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and HF_TOKEN).
S3_ACCESS_KEY_ENV = "RFT_S3_ACCESS_KEY_ID"
S3_SECRET_KEY_ENV = "RFT_S3_SECRET_ACCESS_KEY"
HF_TOKEN_ENV = "RFT_HF_TOKEN"
JOB_TOKEN_SECRET_KEY = "token"


def is_builtin_model(base: str) -> bool:
    """``builtin:<name>``: a model the runtime builds offline (no volume)."""
    return base.startswith(BUILTIN_PREFIX)


def model_path(spec: RFTJobSpec, inputs_root: str = inputs_dir(), claims_root: str = CLAIMS_DIR) -> str:
    """``spec.model.base`` resolved: ``builtin:<name>`` stays symbolic, an absolute path is kept, a
    relative one joins ``spec.model.volume.mountPath``, an hf:// or s3:// URI is its fetched directory
    under ``inputs_root``, a pvc:// URI its path under ``claims_root``."""
    base = spec.model.base
    if is_builtin_model(base) or base.startswith("/"):
        return base
    if is_uri(base):
        uri = parse_uri(base)
        return claim_path(uri, claims_root) if isinstance(uri, ClaimUri) else fetched_dir(base, inputs_root)
    if spec.model.volume is None:  # refused by the ModelSpec rule; kept for callers with unchecked input
        raise ValueError(f"spec.model.base: {base!r} is relative but spec.model.volume is not set")
    return posixpath.join(spec.model.volume.mount_path, base)


def exported_model_path(spec: RFTJobSpec, model_cache: str = MODEL_CACHE_DIR, inputs_root: str = inputs_dir()) -> str:
    """Where an engine that needs a model directory finds the model (a builtin one is exported into
    ``model_cache`` by an init container)."""
    if is_builtin_model(spec.model.base):
        return posixpath.join(model_cache, spec.model.base[len(BUILTIN_PREFIX):])
    return model_path(spec, inputs_root)


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


def dataset_path(split: str, src: Optional[DataSource], dataset_dir: str = DATASET_DIR,
                 inputs_root: str = inputs_dir(), claims_root: str = CLAIMS_DIR) -> Optional[str]:
    """Where a dataset source is read: a file, or a directory holding its split's files (``None`` for
    builtin datasets and absent sources). ``split`` names its mount under ``dataset_dir``."""
    if src is None or src.builtin is not None:
        return None
    if src.config_map_key_ref is not None:
        return posixpath.join(dataset_dir, split, src.config_map_key_ref.key)
    if src.uri is not None:
        uri = parse_uri(src.uri)
        if isinstance(uri, ClaimUri):
            return claim_path(uri, claims_root)
        return fetched_dir(src.uri, inputs_root)
    assert src.path is not None  # exactly one source: the DataSource rule
    if src.path.startswith("/") or src.volume is None:
        return src.path
    return posixpath.join(src.volume.mount_path, src.path)


def evaluator_file_path(index: int, key: str, evaluator_dir: str = EVALUATOR_DIR) -> str:
    """Where evaluator ``index``'s ConfigMap file is mounted: ``<dir>/<index>/<key>``."""
    return posixpath.join(evaluator_dir, str(index), key)


def api_key_env_name(index: int) -> str:
    """The env var that carries evaluator ``index``'s API key (its value comes from a Secret)."""
    from .constants import RESERVED_ENV_PREFIX

    return f"{RESERVED_ENV_PREFIX}{index}_API_KEY"
