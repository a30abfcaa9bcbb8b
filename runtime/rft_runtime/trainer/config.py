"""The resolved runtime config: what `rft trainer|rollout --config FILE` read.

The operator writes it into ConfigMap ``<job>-config`` (key ``config.json``); ``rft run`` builds
the same document with :func:`build_config`. Shape (documented in ``docs/trainer.md``)::

    {
      "job":       {"name": str, "namespace": str},
      "spec":      <RFTJobSpec, camelCase as in the manifest>,
      "algorithm": <ResolvedAlgorithm.to_dict()>,
      "endpoints": {"inference": [url, ...], "reward": url | null,
                    "coordinator": {"host": str, "port": int, "bind": str?},
                    "model": str?},            # served model name; default job.name
      "paths":     {"checkpoints": dir, "modelCache": dir,
                    "output": dir?,            # metrics.jsonl + tensorboard; default <checkpoints>/metrics
                    "datasets": {"train": file?, "eval": file?}?},  # mounted configMapKeyRef data
      "runtime":   {"threads": int?, "stallTimeoutSeconds": float?, "progress": "auto"|"file"|"configmap"}?
    }
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

from rft_api.job import InvalidSpec, validate_spec
from rft_api.presets import ResolvedAlgorithm, resolve_algorithm
from rft_api.spec import RFTJobSpec


class ConfigError(ValueError):
    """The runtime config is malformed; the message names the field."""


@dataclass
class RuntimeConfig:
    """The parsed config (see the module docstring)."""

    job_name: str
    namespace: str
    spec: RFTJobSpec
    algorithm: ResolvedAlgorithm
    inference_urls: list[str]
    reward_url: str | None
    coordinator_host: str
    coordinator_port: int
    coordinator_bind: str
    served_model: str
    checkpoints_dir: Path
    model_cache_dir: Path | None
    output_dir: Path
    dataset_files: dict[str, str] = field(default_factory=dict)
    threads: int | None = None
    stall_timeout_s: float = 1800.0
    progress: str = "auto"
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def coordinator_url(self) -> str:
        return f"http://{self.coordinator_host}:{self.coordinator_port}"


def _get(d: Mapping[str, Any], key: str, where: str, kind: type | tuple[type, ...], required: bool = True) -> Any:
    if key not in d or d[key] is None:
        if required:
            raise ConfigError(f"config: field '{where}{key}' is required")
        return None
    v = d[key]
    if isinstance(v, bool) and kind is not bool or not isinstance(v, kind):
        raise ConfigError(f"config: field '{where}{key}' must be {getattr(kind, '__name__', kind)}, "
                          f"got {type(v).__name__}")
    return v


def _algorithm(d: Mapping[str, Any] | None, spec: RFTJobSpec) -> ResolvedAlgorithm:
    resolved = resolve_algorithm(spec)
    if d is None:
        return resolved
    fields = set(ResolvedAlgorithm.__dataclass_fields__)
    unknown = sorted(set(d) - fields)
    if unknown:
        raise ConfigError(f"config: field 'algorithm' has unknown keys {unknown}")
    merged = {**resolved.to_dict(), **d}
    try:
        return ResolvedAlgorithm(**merged)
    except TypeError as e:
        raise ConfigError(f"config: field 'algorithm': {e}") from None


def _coordinator_from_url(url: str) -> dict[str, Any]:
    """``endpoints.coordinator`` as the operator writes it (``http://<job>-trainer.<ns>.svc:8100``):
    rollout workers use the URL; the trainer listens on that port at its own pod address
    (``$RFT_BIND_HOST``, which the operator sets to the pod IP), else on every address."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        raise ConfigError(f"config: field 'endpoints.coordinator' must be an http URL with a port, got {url!r}")
    return {"host": parts.hostname, "port": parts.port, "bind": os.environ.get("RFT_BIND_HOST") or "0.0.0.0"}


def parse_config(doc: Mapping[str, Any]) -> RuntimeConfig:
    """Validate a config document; raises :class:`ConfigError` naming the bad field."""
    if not isinstance(doc, Mapping):
        raise ConfigError("config: expected a JSON object")
    job = _get(doc, "job", "", dict)
    name = _get(job, "name", "job.", str)
    namespace = _get(job, "namespace", "job.", str, required=False) or "default"
    try:
        spec = validate_spec(_get(doc, "spec", "", dict))
    except InvalidSpec as e:
        raise ConfigError("config: " + "; ".join(e.problems)) from None
    algorithm = _algorithm(_get(doc, "algorithm", "", dict, required=False), spec)
    ep = _get(doc, "endpoints", "", dict)
    inference = _get(ep, "inference", "endpoints.", list)
    if not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in inference):
        raise ConfigError("config: field 'endpoints.inference' must be a list of http(s) URLs")
    reward = _get(ep, "reward", "endpoints.", str, required=False)
    coord = _get(ep, "coordinator", "endpoints.", (dict, str))
    if isinstance(coord, str):  # the operator's RFTRuntimeConfig: the coordinator Service's URL
        coord = _coordinator_from_url(coord)
    host = _get(coord, "host", "endpoints.coordinator.", str)
    port = _get(coord, "port", "endpoints.coordinator.", int)
    if not 0 <= port <= 65535:
        raise ConfigError(f"config: field 'endpoints.coordinator.port' must be a port number, got {port}")
    bind = _get(coord, "bind", "endpoints.coordinator.", str, required=False) or "0.0.0.0"
    served = (_get(ep, "model", "endpoints.", str, required=False)
              or _get(ep, "servedModelName", "endpoints.", str, required=False) or name)
    paths = _get(doc, "paths", "", dict)
    ckpt = Path(_get(paths, "checkpoints", "paths.", str))
    cache = _get(paths, "modelCache", "paths.", str, required=False)
    output = _get(paths, "output", "paths.", str, required=False)
    datasets = {k: v for k, v in (_get(paths, "datasets", "paths.", dict, required=False) or {}).items()
                if v is not None}
    rt = _get(doc, "runtime", "", dict, required=False) or {}
    threads = _get(rt, "threads", "runtime.", int, required=False)
    stall = _get(rt, "stallTimeoutSeconds", "runtime.", (int, float), required=False)
    progress = _get(rt, "progress", "runtime.", str, required=False) or "auto"
    if progress not in ("auto", "file", "configmap"):
        raise ConfigError(f"config: field 'runtime.progress' must be auto, file or configmap, got {progress!r}")
    return RuntimeConfig(
        job_name=name, namespace=namespace, spec=spec, algorithm=algorithm, inference_urls=list(inference),
        reward_url=reward, coordinator_host=host, coordinator_port=port, coordinator_bind=bind,
        served_model=served, checkpoints_dir=ckpt, model_cache_dir=Path(cache) if cache else None,
        output_dir=Path(output) if output else ckpt / "metrics", dataset_files=dict(datasets),
        threads=threads, stall_timeout_s=float(stall) if stall else 1800.0, progress=progress, raw=dict(doc),
    )


def load_config(path: str | Path) -> RuntimeConfig:
    """Read and validate a config file (JSON)."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config: {p} does not exist") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"config: {p} is not JSON: {e}") from None
    return parse_config(doc)


def build_config(
    job_name: str,
    spec: RFTJobSpec,
    *,
    namespace: str = "default",
    inference: list[str],
    reward: str | None,
    coordinator_host: str,
    coordinator_port: int,
    coordinator_bind: str = "0.0.0.0",
    checkpoints: str | Path,
    model_cache: str | Path | None,
    output: str | Path | None = None,
    served_model: str | None = None,
    threads: int | None = None,
    progress: str = "auto",
) -> dict[str, Any]:
    """The config document for a job (what the operator's config ConfigMap holds)."""
    doc: dict[str, Any] = {
        "job": {"name": job_name, "namespace": namespace},
        "spec": spec.model_dump(by_alias=True, exclude_none=True, mode="json"),
        "algorithm": resolve_algorithm(spec).to_dict(),
        "endpoints": {"inference": list(inference), "reward": reward,
                      "coordinator": {"host": coordinator_host, "port": coordinator_port, "bind": coordinator_bind},
                      "model": served_model or job_name},
        "paths": {"checkpoints": str(checkpoints), "modelCache": str(model_cache) if model_cache else None},
        "runtime": {"progress": progress},
    }
    if output is not None:
        doc["paths"]["output"] = str(output)
    if threads is not None:
        doc["runtime"]["threads"] = threads
    return doc
