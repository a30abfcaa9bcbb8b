"""The runtime contract: the one document every role reads at start (``config.json``).

The operator renders it into ConfigMap ``<job>-config`` (:func:`rft_operator.builders.config`);
``rft run`` builds the same document for one machine. Every role (trainer, rollout, reward,
inference) parses it once with :func:`load` / :func:`parse` and then holds typed values: the job,
its validated spec (defaults applied), the resolved algorithm, where the other roles are
(endpoints), where things are in the pod (paths, already resolved: roles never join a spec path to a
mount), which env vars carry secrets (names only, never values) and where progress goes.

Servers listen on the port given here at ``$RFT_BIND_HOST`` (the pod's own address on a cluster;
``0.0.0.0`` when unset).

The job's data-plane credential is not in the config (it is a secret): every role reads it from
``$RFT_JOB_TOKEN`` (:data:`rft_api.layout.JOB_TOKEN_ENV`, filled from Secret ``<job>-token``) with
:func:`job_token`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal, Optional
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from . import layout
from .constants import API_VERSION
from .job import InvalidSpec, RFTJob, field_path
from .presets import ResolvedAlgorithm, resolve_algorithm
from .spec import EvaluatorEntry, RFTJobSpec

RUNTIME_CONFIG_KIND = "RFTRuntimeConfig"
BIND_HOST_ENV = "RFT_BIND_HOST"
JOB_TOKEN_ENV = layout.JOB_TOKEN_ENV

Url = Annotated[str, StringConstraints(min_length=1, max_length=2048)]


class ConfigError(ValueError):
    """The runtime config is malformed; the message names the field."""


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


def _http_url(v: str, where: str) -> str:
    parts = urlsplit(v)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{where} must be an http(s) URL, got {v!r}")
    return v


class JobRef(_Model):
    name: str
    """The RFTJob's name."""
    namespace: str = "default"
    """The RFTJob's namespace."""


class Endpoints(_Model):
    inference: list[Url] = Field(min_length=1)
    """Base URLs of the inference servers (each without ``/v1``)."""
    served_model_name: str
    """The model name inference serves the policy under (vLLM adapters: ``<name>-v<version>``)."""
    coordinator: Url
    """The trainer's coordinator, as rollout workers reach it."""
    reward: Optional[Url] = None
    """The reward role, when the job has one."""
    inference_replicas: Optional[Url] = None
    """Where the trainer finds every inference replica to publish each policy version to: a URL whose
    host name resolves (DNS of a headless Service) to one address per ready replica, each served on
    the URL's port. None: the ``inference`` URLs are the replicas."""

    @field_validator("inference")
    @classmethod
    def _inference_urls(cls, v: list[str]) -> list[str]:
        return [_http_url(u, "endpoints.inference[]") for u in v]

    @field_validator("coordinator", "reward", "inference_replicas")
    @classmethod
    def _urls(cls, v: Optional[str]) -> Optional[str]:
        return None if v is None else _http_url(v, "endpoint")


class Ports(_Model):
    inference: int = Field(8000, ge=0, le=65535)
    """Where the builtin inference server listens."""
    reward: int = Field(8200, ge=0, le=65535)
    """Where the reward server listens."""
    coordinator: int = Field(8100, ge=0, le=65535)
    """Where the trainer's coordinator listens (0: any free port, reported by the trainer)."""
    rendezvous: int = Field(29500, ge=1, le=65535)
    """The trainer's torch.distributed rendezvous port (a TCP store at global rank 0)."""


class EvaluatorFile(_Model):
    index: int = Field(ge=0)
    """Position of the evaluator in ``spec.evaluator.entries()``."""
    path: str
    """The mounted file."""
    function: str = "score"
    """The scoring function in it."""
    rollout: Optional[str] = None
    """A rollout function in it that replaces the default single-turn rollout."""


class SecretEnv(_Model):
    index: int = Field(ge=0)
    """Position of the evaluator in ``spec.evaluator.entries()``."""
    env: str
    """The env var holding its API key (the value comes from a Secret; never written here)."""


class DatasetPaths(_Model):
    train: Optional[str] = None
    """The training source's file or directory (absent for builtin datasets)."""
    eval: Optional[str] = None
    """The evaluation split's file."""
    mix: dict[str, str] = Field(default_factory=dict)
    """Each ``dataset.mix`` domain's own training file, by domain (builtin sources have none)."""


class Paths(_Model):
    checkpoints: str
    """The checkpoint volume (weights published to inference live under it too)."""
    model: str
    """The base model directory, or ``builtin:<name>`` (built offline into ``modelCache``)."""
    model_cache: Optional[str] = None
    """Writable directory for builtin models."""
    tokenizer: Optional[str] = None
    """The tokenizer directory when it is not the model's."""
    warm_start: Optional[str] = None
    """Weights to start from instead of the base weights."""
    chat_template: Optional[str] = None
    """A chat template file overriding the tokenizer's (``spec.model.chatTemplate``)."""
    output: Optional[str] = None
    """Metrics (``metrics.jsonl``, TensorBoard); default ``<checkpoints>/metrics``."""
    datasets: DatasetPaths = Field(default_factory=DatasetPaths)
    """Dataset files or directories (mounted ConfigMaps, volume paths, fetched or claim URIs)."""
    inputs: Optional[str] = None
    """Where the job's hf:// and s3:// models and datasets are fetched to (``rft fetch``)."""
    evaluator_files: list[EvaluatorFile] = Field(default_factory=list)
    """File evaluators, by evaluator index."""

    @property
    def metrics_dir(self) -> Path:
        return Path(self.output) if self.output else Path(self.checkpoints) / "metrics"


class ProgressTarget(_Model):
    sink: Literal["configmap", "file"] = "configmap"
    """``configmap``: patch ConfigMap ``configMap`` (in the job's namespace); ``file``: write
    ``<output>/progress.json`` (one machine)."""
    config_map: Optional[str] = None
    """The progress ConfigMap (``<job>-progress``)."""


class TrainerSettings(_Model):
    threads: Optional[int] = Field(None, ge=1, le=1024)
    """torch intra-op threads (default: torch's)."""
    stall_timeout_seconds: float = Field(1800.0, gt=0)
    """The trainer fails when no episode arrives for this long."""
    weight_transfer: Optional[Literal["path", "http"]] = None
    """How a published policy version reaches inference. ``path`` (unset: the same, so that configs
    written before the field existed hash as before): the replicas read its directory on
    the volume they share with the trainer (``/update_weights_from_disk``; the operator's pods).
    ``http``: the trainer uploads it to each replica (``/update_weights_from_archive``; ``rft run`` on
    a Ray cluster, whose nodes share no filesystem). ``http`` needs the builtin engine."""
    master_address: str = Field("127.0.0.1", min_length=1, max_length=253)
    """Where every trainer process reaches global rank 0's rendezvous (in pods: the headless trainer
    Service, which selects only pod 0). The process group has ``spec.trainer.nodes ×
    processesPerNode`` ranks; a process's rank is ``node × processesPerNode + local rank``."""


class ResolvedEvaluator(_Model):
    """One evaluator as the scoring process runs it: the spec entry plus where its file and key are."""

    index: int
    entry: EvaluatorEntry
    file_path: Optional[str] = None
    api_key_env: Optional[str] = None


class RuntimeConfig(_Model):
    """The runtime contract (see the module docstring)."""

    api_version: str = API_VERSION
    kind: str = RUNTIME_CONFIG_KIND
    job: JobRef
    spec: RFTJobSpec
    algorithm: ResolvedAlgorithm
    endpoints: Endpoints
    ports: Ports = Field(default_factory=Ports)
    scoring: Literal["rollout", "reward"] = "rollout"
    """Where samples are scored: in the rollout workers, or by the reward role."""
    paths: Paths
    secret_env: list[SecretEnv] = Field(default_factory=list)
    progress: ProgressTarget = Field(default_factory=ProgressTarget)
    trainer: TrainerSettings = Field(default_factory=TrainerSettings)

    @field_validator("api_version", "kind")
    @classmethod
    def _fixed(cls, v: str, info: ValidationInfo) -> str:
        expected = {"api_version": API_VERSION, "kind": RUNTIME_CONFIG_KIND}[info.field_name or ""]
        if v != expected:
            raise ValueError(f"expected {expected}, got {v!r}")
        return v

    @model_validator(mode="after")
    def _transfer(self) -> "RuntimeConfig":
        if self.trainer.weight_transfer == "http" and self.spec.inference.engine != "builtin":
            raise ValueError(f"trainer.weightTransfer: http uploads weights to the builtin server; "
                             f"spec.inference.engine is {self.spec.inference.engine!r}")
        return self

    # ------------------------------------------------------------------ derived, typed views
    def evaluators(self) -> list[ResolvedEvaluator]:
        """The evaluators with their mounted file paths and API-key env vars."""
        files = {f.index: f for f in self.paths.evaluator_files}
        keys = {s.index: s.env for s in self.secret_env}
        out = []
        for i, e in enumerate(self.spec.evaluator.entries()):
            f = files.get(i)
            if e.file_ref() is not None and f is None:
                raise ConfigError(f"config: evaluator {i} is a file evaluator but paths.evaluatorFiles has no "
                                  "entry for it")
            out.append(ResolvedEvaluator(index=i, entry=e, file_path=f.path if f else None,
                                         api_key_env=keys.get(i)))
        return out

    def rollout_function(self) -> Optional[str]:
        """``module:function`` or ``/path/file.py:function`` of the evaluator's rollout, if it has one."""
        files = {f.index: f for f in self.paths.evaluator_files}
        for i, e in enumerate(self.spec.evaluator.entries()):
            if e.bundle is not None and e.bundle.rollout:
                return e.bundle.rollout
            if e.file is not None and e.file.rollout:
                f = files.get(i)
                if f is None:
                    raise ConfigError(f"config: evaluator {i} names a rollout function but paths.evaluatorFiles "
                                      "has no entry for it")
                return f"{f.path}:{e.file.rollout}"
        return None

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True, indent=2)


def parse(doc: Any) -> RuntimeConfig:
    """Validate a config document (a dict or JSON text); raises :class:`ConfigError` naming each field."""
    try:
        if isinstance(doc, (str, bytes)):
            return RuntimeConfig.model_validate_json(doc)
        return RuntimeConfig.model_validate(doc)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            msg = err["msg"].removeprefix("Value error, ")
            problems.append(f"{field_path(tuple(err['loc']))}: {msg}" if err["loc"] else msg)
        raise ConfigError("config: " + "; ".join(problems)) from None


def load(path: str | Path) -> RuntimeConfig:
    """Read and validate a config file."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config: {p} does not exist") from None
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"config: {p} is not JSON: {e}") from None
    return parse(text)


def build(job: RFTJob, *, endpoints: Endpoints, ports: Ports, paths: Paths, scoring: str,
          progress: ProgressTarget, trainer: TrainerSettings | None = None) -> RuntimeConfig:
    """The config of ``job`` (the spec's defaults applied, the algorithm resolved, secrets by env name)."""
    spec = job.spec
    secret_env = [SecretEnv(index=i, env=layout.api_key_env_name(i))
                  for i, e in enumerate(spec.evaluator.entries()) if e.api_key_secret_ref is not None]
    try:
        return RuntimeConfig(job=JobRef(name=job.name, namespace=job.namespace), spec=spec,
                             algorithm=resolve_algorithm(spec), endpoints=endpoints, ports=ports,
                             scoring=scoring,
                             paths=paths, secret_env=secret_env, progress=progress,
                             trainer=trainer or TrainerSettings())
    except ValidationError as e:
        raise InvalidSpec([f"{field_path(tuple(x['loc']))}: {x['msg']}" for x in e.errors()]) from None


def evaluator_files(spec: RFTJobSpec, evaluator_dir: str = layout.EVALUATOR_DIR) -> list[EvaluatorFile]:
    """File evaluators mounted at ``<dir>/<index>/<key>``."""
    out = []
    for i, e in enumerate(spec.evaluator.entries()):
        ref = e.file_ref()
        if ref is not None:
            out.append(EvaluatorFile(index=i, path=layout.evaluator_file_path(i, ref.key, evaluator_dir),
                                     function=e.file.function if e.file is not None else "score",
                                     rollout=e.file.rollout if e.file is not None else None))
    return out


def dataset_paths(spec: RFTJobSpec, dataset_dir: str = layout.DATASET_DIR, inputs_root: Optional[str] = None,
                  claims_root: str = layout.CLAIMS_DIR) -> DatasetPaths:
    """Where every dataset source of the job is read (:func:`rft_api.layout.dataset_path`; fetched
    ones under ``inputs_root``, default ``<checkpoint root>/inputs``)."""
    ds = spec.dataset
    roots = {"inputs_root": inputs_root or layout.inputs_dir(), "claims_root": claims_root}
    mix = {domain: path for _, mount, src, domain in ds.train_sources()
           if domain is not None and (path := layout.dataset_path(mount, src, dataset_dir, **roots)) is not None}
    return DatasetPaths(train=layout.dataset_path("train", ds.train, dataset_dir, **roots),
                        eval=layout.dataset_path("eval", ds.eval, dataset_dir, **roots), mix=mix)


def spec_paths(spec: RFTJobSpec, *, checkpoints: str, model_cache: Optional[str], output: Optional[str] = None,
               dataset_dir: str = layout.DATASET_DIR, evaluator_dir: str = layout.EVALUATOR_DIR,
               chat_template: Optional[str] = None, inputs_root: Optional[str] = None,
               claims_root: str = layout.CLAIMS_DIR) -> Paths:
    """The :class:`Paths` of a job, every spec path resolved by :mod:`rft_api.layout` (fetched inputs
    under ``inputs_root``, default ``<checkpoints>/inputs``; ``pvc://`` claims under ``claims_root``)."""
    inputs = inputs_root or layout.inputs_dir(checkpoints)
    return Paths(
        checkpoints=checkpoints, model=layout.model_path(spec, inputs, claims_root), model_cache=model_cache,
        tokenizer=layout.tokenizer_path(spec), warm_start=layout.warm_start_path(spec),
        chat_template=chat_template, output=output, inputs=inputs if layout.inputs(spec, inputs) else None,
        datasets=dataset_paths(spec, dataset_dir, inputs, claims_root),
        evaluator_files=evaluator_files(spec, evaluator_dir),
    )


def job_token(environ: Optional[dict[str, str]] = None) -> Optional[str]:
    """The job's data-plane token from ``$RFT_JOB_TOKEN`` (None when unset or blank)."""
    value = (os.environ if environ is None else environ).get(JOB_TOKEN_ENV, "").strip()
    return value or None


def coordinator_port(url: str) -> int:
    """The port of a coordinator URL."""
    port = urlsplit(url).port
    if port is None:
        raise ConfigError(f"config: endpoints.coordinator {url!r} has no port")
    return port
