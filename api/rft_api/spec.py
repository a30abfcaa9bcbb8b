"""The RFTJob spec: pydantic v2 models, the one source of truth for the CRD and the runtime config.

Field docstrings become the CRD's descriptions. Strings and lists are bounded (the API server needs
bounds to cost CEL rules). Cross-field rules are declared with `@rules` next to the model they
concern and are enforced both as CEL in the CRD and in Python.
"""
from __future__ import annotations

import ipaddress
import json
import re
from fractions import Fraction
from typing import Annotated, Literal, Optional

from pydantic import ConfigDict, Field, StringConstraints, field_validator, model_validator
from pydantic.alias_generators import to_camel

from .constants import (
    BUILTIN_MODELS,
    GROUP_RELATIVE_ALGORITHMS,
    MAX_EVALUATOR_CONFIG_BYTES,
    REMOTE_EVALUATORS,
    RESERVED_ENV_NAMES,
    RESERVED_ENV_PREFIX,
    RESERVED_LABEL_PREFIXES,
    RESERVED_MOUNT_PATHS,
    REWARD_LIMIT,
    VLLM_LORA_RANKS,
    AdvantageEstimatorName,
    AlgorithmName,
    BuiltinDatasetName,
    BuiltinEvaluatorName,
    EngineName,
    KLEstimatorName,
    LossAggregationName,
    PolicyLossName,
)
from .rules import Rule, RuleChecked, rules
from .storage import is_uri, uri_problem

VLLM_MAX_LORA_RANK = VLLM_LORA_RANKS[-1]
DEFAULT_REQUESTS = {"cpu": "250m", "memory": "512Mi"}

# A Kubernetes object name (a DNS-1123 subdomain: what Secrets, ConfigMaps and claims are named).
Name = Annotated[str, StringConstraints(min_length=1, max_length=253,
                                        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")]
KeyName = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")]
# An image reference as the container runtime parses it (the grammar of distribution's reference package):
# [registry[:port]/]path[:tag][@digest], the path's components lower case.
IMAGE_REFERENCE_PATTERN = (
    r"^(?:(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*"
    r"(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
Image = Annotated[str, StringConstraints(min_length=1, max_length=512, pattern=IMAGE_REFERENCE_PATTERN)]
PathStr = Annotated[str, StringConstraints(min_length=1, max_length=1024)]
Arg = Annotated[str, StringConstraints(max_length=4096)]
EnvName = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")]
Quantity = Annotated[str, StringConstraints(max_length=64, pattern=r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P|E|Ei)?$")]
PositiveQuantity = Annotated[str, StringConstraints(
    max_length=64, pattern=r"^([0-9]*[1-9][0-9]*(\.[0-9]+)?|[0-9]+\.[0-9]*[1-9][0-9]*)(k|Ki|Mi|Gi|Ti|Pi|M|G|T|P|E|Ei)?$")]
Entrypoint = Annotated[str, StringConstraints(max_length=512, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")]



class ApiModel(RuleChecked):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=True,
    )


# ---------------------------------------------------------------- shared small types
class SecretKeySelector(ApiModel):
    name: Name
    """Name of a Secret in the job's namespace."""
    key: KeyName
    """Key within the Secret."""


class ConfigMapKeySelector(ApiModel):
    name: Name
    """Name of a ConfigMap in the job's namespace."""
    key: KeyName
    """Key within the ConfigMap."""


class EnvVarSource(ApiModel):
    secret_key_ref: SecretKeySelector
    """The value comes from a Secret key; the value never appears in status, logs or the runtime config."""


@rules(Rule(
    cel=f"!(self.name in {list(RESERVED_ENV_NAMES)!r}) && !self.name.startsWith('{RESERVED_ENV_PREFIX}')",
    message=f"env: the operator sets {', '.join(RESERVED_ENV_NAMES)} and {RESERVED_ENV_PREFIX}* itself (the job "
            "token, the engine's API key, credentials, endpoints, caches); a job cannot replace them",
    field=".name",
    check=lambda e: e.name not in RESERVED_ENV_NAMES and not e.name.startswith(RESERVED_ENV_PREFIX),
), Rule(
    cel="!(has(self.value) && has(self.valueFrom))",
    message="env: set value or valueFrom, not both",
    field=".valueFrom",
    check=lambda e: e.value is None or e.value_from is None,
))
class EnvVar(ApiModel):
    name: EnvName
    """Environment variable name."""
    value: Optional[Arg] = None
    """A literal value (not for secrets: use valueFrom.secretKeyRef)."""
    value_from: Optional[EnvVarSource] = None
    """A reference to a Secret key."""


GPU_RESOURCE = "nvidia.com/gpu"
ResourceList = Annotated[dict[str, int | Quantity], Field(max_length=16)]


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P|E|Ei)?$")
_SUFFIX = {None: Fraction(1), "m": Fraction(1, 1000), "k": Fraction(10**3), "M": Fraction(10**6),
           "G": Fraction(10**9), "T": Fraction(10**12), "P": Fraction(10**15), "E": Fraction(10**18),
           "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
           "Pi": Fraction(2**50), "Ei": Fraction(2**60)}


def quantity_value(q: int | str) -> Fraction:
    """The exact value of a resource quantity (``500m``, ``2Gi``, ``4``) in the forms the API accepts."""
    m = _QUANTITY.match(str(q))
    if m is None:
        raise ValueError(f"not a quantity: {q!r}")
    return Fraction(m.group(1)) * _SUFFIX[m.group(2)]


def _limits_below_requests(r: "Resources") -> list[str]:
    lim, req = r.limits or {}, r.requests or {}
    return [k for k in req if k in lim and quantity_value(lim[k]) < quantity_value(req[k])]


# CEL compares the resources most specs name (a rule over every key of the map is beyond the API server's
# cost budget); the Python twin, which the operator and ``rft run`` apply, compares every key.
_COMPARED = ("cpu", "memory", "ephemeral-storage", GPU_RESOURCE)
_LIMITS_CEL = "!has(self.limits) || !has(self.requests) || (" + " && ".join(
    f"(!('{k}' in self.requests && '{k}' in self.limits) || "
    f"!quantity(string(self.limits['{k}'])).isLessThan(quantity(string(self.requests['{k}']))))" for k in _COMPARED) + ")"


@rules(Rule(
    cel=_LIMITS_CEL,
    message="resources.limits must not be below resources.requests for the same resource (Kubernetes refuses the pod)",
    field=".limits",
    check=lambda r: not _limits_below_requests(r),
    explain=lambda r: f"below the request: {', '.join(_limits_below_requests(r))}",
))
class Resources(ApiModel):
    requests: Optional[ResourceList] = None
    """Minimum resources (cpu, memory, nvidia.com/gpu, ...)."""
    limits: Optional[ResourceList] = None
    """Maximum resources."""


def _mount_clash(path: str) -> bool:
    p = path.rstrip("/") or "/"
    return p == "/" or ".." in path.split("/") or any(
        p == r or p.startswith(r + "/") or r.startswith(p + "/") for r in RESERVED_MOUNT_PATHS)


_MOUNT_CEL = ("self.mountPath.startsWith('/') && self.mountPath != '/' && !self.mountPath.contains('/../') && "
              "!self.mountPath.endsWith('/..') && " + str(list(RESERVED_MOUNT_PATHS)) +
              ".all(r, self.mountPath != r && !self.mountPath.startsWith(r + '/') && !r.startsWith(self.mountPath + "
              "(self.mountPath.endsWith('/') ? '' : '/')))")


@rules(Rule(
    cel=_MOUNT_CEL,
    message=f"volume.mountPath must be an absolute path that is not /, has no '..', and is not on, in or over one of "
            f"the operator's own mounts ({', '.join(RESERVED_MOUNT_PATHS)})",
    field=".mountPath",
    check=lambda v: v.mount_path.startswith("/") and not _mount_clash(v.mount_path),
))
class VolumeRef(ApiModel):
    claim_name: Name
    """An existing PersistentVolumeClaim that holds the data; mounted read-only."""
    mount_path: PathStr = "/data"
    """Where the claim is mounted in every pod that needs it."""
    sub_path: Optional[PathStr] = None
    """Sub-directory of the claim to mount."""


# ---------------------------------------------------------------- pod overrides (placement and sizing)
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
# A label or annotation key: an optional DNS-subdomain prefix and '/', then a name of at most 63 characters.
_QUALIFIED_KEY = re.compile(rf"^({_DNS_LABEL}(\.{_DNS_LABEL})*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?$")
LabelValue = Annotated[str, StringConstraints(max_length=63, pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")]
TolerationKey = Annotated[str, StringConstraints(
    min_length=1, max_length=317, pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")]
MAX_PASS_THROUGH_KEYS = 16


class PassThrough(ApiModel):
    """An object of the Kubernetes pod API, passed through as written (the API server checks it when it creates the pod)."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"maxProperties": MAX_PASS_THROUGH_KEYS})

    @model_validator(mode="after")
    def _bounded(self) -> "PassThrough":
        if len(self.model_extra or {}) > MAX_PASS_THROUGH_KEYS:
            raise ValueError(f"at most {MAX_PASS_THROUGH_KEYS} keys")
        return self


def _bad_keys(keys, max_prefix: int = 253) -> list[str]:
    return [k for k in keys if not _QUALIFIED_KEY.match(k) or len(k.rpartition("/")[0]) > max_prefix]


def _reserved_keys(keys) -> list[str]:
    return [k for k in keys or () if k.startswith(RESERVED_LABEL_PREFIXES)]


def _reserved_rule(field: str) -> Rule:
    return Rule(
        cel=f"!has(self.{field}) || !self.{field}.exists(k, "
            + " || ".join(f"k.startsWith('{p}')" for p in RESERVED_LABEL_PREFIXES) + ")",
        message=f"pod.{field}: keys under {', '.join(RESERVED_LABEL_PREFIXES)} belong to the operator (its selectors, "
                "roles, hashes and Kueue's keys)",
        field=f".{field}",
        check=lambda o: not _reserved_keys(getattr(o, field)),
        explain=lambda o: f"reserved: {', '.join(_reserved_keys(getattr(o, field)))}",
    )


@rules(Rule(
    cel="self.operator != 'Exists' || !has(self.value) || self.value == ''",
    message="toleration.value must be empty with operator Exists",
    field=".value",
    check=lambda t: t.operator != "Exists" or not t.value,
), Rule(
    cel="has(self.key) || self.operator == 'Exists'",
    message="a toleration without key must have operator Exists (it then tolerates every taint)",
    field=".operator",
    check=lambda t: t.key is not None or t.operator == "Exists",
), Rule(
    cel="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
    message="toleration.tolerationSeconds needs effect NoExecute",
    field=".tolerationSeconds",
    check=lambda t: t.toleration_seconds is None or t.effect == "NoExecute",
))
class Toleration(ApiModel):
    """A Kubernetes toleration (the pod API's, typed)."""

    key: Optional[TolerationKey] = None
    """The taint key tolerated (`nvidia.com/gpu`); unset with operator Exists: every taint."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """Equal: the taint's value must be `value`; Exists: any value."""
    value: Optional[LabelValue] = None
    """The taint value (operator Equal)."""
    effect: Optional[Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"]] = None
    """The taint effect tolerated; empty or unset: every effect."""
    toleration_seconds: Optional[int] = Field(None, ge=0, le=31_536_000)
    """With effect NoExecute: how long the pod stays on a node after the taint appears (unset: forever)."""


class Affinity(ApiModel):
    """The pod API's affinity, each part passed through as written (the API server checks it when it
    creates the pod). The operator's own terms are added, never replaced: on a ReadWriteOnce checkpoint
    claim, the pods that mount it get a required pod affinity that puts them on one node."""

    node_affinity: Optional[PassThrough] = None
    """A Kubernetes NodeAffinity (requiredDuringSchedulingIgnoredDuringExecution, preferredDuringSchedulingIgnoredDuringExecution)."""
    pod_affinity: Optional[PassThrough] = None
    """A Kubernetes PodAffinity."""
    pod_anti_affinity: Optional[PassThrough] = None
    """A Kubernetes PodAntiAffinity."""


@rules(_reserved_rule("labels"), _reserved_rule("annotations"))
class PodOverrides(ApiModel):
    """Where a role's pods run and what the cluster needs to run them, merged over what the operator
    builds: maps are merged (the operator's keys are refused), lists appended, scalars set. What the
    operator owns (the command, the security context, the config and checkpoint volumes, the job token,
    the ServiceAccount) is not a field here."""

    node_selector: Optional[dict[str, LabelValue]] = Field(None, max_length=32)
    """Node labels the pods require (`nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3`); a Kueue admission's flavor labels are added to them."""
    tolerations: Optional[list[Toleration]] = Field(None, max_length=32)
    """Taints the pods tolerate (GPU nodes are often tainted `nvidia.com/gpu`), after those of a Kueue admission."""
    affinity: Optional[Affinity] = None
    """Node affinity, pod affinity and anti-affinity (passed through; the operator's co-location term is added)."""
    topology_spread_constraints: Optional[list[PassThrough]] = Field(None, max_length=8)
    """Kubernetes TopologySpreadConstraints, passed through (their labelSelector may use the role's labels: app.kubernetes.io/instance = the job's name, rft.dev/role = the role)."""
    priority_class_name: Optional[Name] = None
    """A PriorityClass of the pods (preemption order on a full cluster)."""
    runtime_class_name: Optional[Name] = None
    """A RuntimeClass for the pods (a sandboxed runtime such as gVisor or Kata for the reward role, or the `nvidia` runtime)."""
    image_pull_secrets: Optional[list[Name]] = Field(None, max_length=16)
    """Secrets (of type kubernetes.io/dockerconfigjson, in the job's namespace) to pull the role's images with."""
    labels: Optional[dict[str, LabelValue]] = Field(None, max_length=32)
    """Extra labels of the pods; keys under app.kubernetes.io/, rft.dev/, kueue.x-k8s.io/ and batch.kubernetes.io/ are the operator's."""
    annotations: Optional[dict[str, Annotated[str, StringConstraints(max_length=4096)]]] = Field(None, max_length=32)
    """Extra annotations of the pods; keys under the same prefixes as labels are the operator's."""
    shm_size_limit: Optional[PositiveQuantity] = None
    """Size limit of a memory-backed /dev/shm (counted in the container's memory): set on the one the role already mounts (the trainer with several processes, vLLM), else added."""
    termination_grace_period_seconds: Optional[int] = Field(None, ge=0, le=86_400)
    """Seconds a pod has to stop after SIGTERM (default 30)."""

    @field_validator("node_selector", "labels", "annotations")
    @classmethod
    def _keys(cls, value: Optional[dict[str, str]]) -> Optional[dict[str, str]]:
        bad = _bad_keys(value or {})
        if bad:
            raise ValueError(f"not a label key ([prefix/]name: a DNS subdomain, then at most 63 letters, digits, "
                             f"'-', '_' or '.'): {', '.join(bad)}")
        return value


class WorkerPodOverrides(PodOverrides):
    """Pod overrides of a role whose sizing has no other place in the spec (rollout, reward)."""

    resources: Optional[Resources] = None
    """Resources of the role's container (what it leaves out, spec.defaultResources)."""
    env: list[EnvVar] = Field(default_factory=list, max_length=64)
    """Extra environment of the role's container."""


class RewardSpec(ApiModel):
    """The reward role (a Deployment behind the `<job>-reward` Service), which exists only when scoring
    leaves the rollout pods: evaluator.remote, a code_sandbox or an llm_judge evaluator. Its own section,
    not a part of `evaluator`: `evaluator` says how a sample is scored wherever that happens (the same
    evaluators run in the rollout pods when there is no reward role), while this sizes and places the pods
    that score when there is one."""

    replicas: int = Field(1, ge=1, le=64)
    """Reward pods behind the Service (requests are spread over the ready ones)."""
    pod: Optional[WorkerPodOverrides] = None
    """Placement, resources and extras of the reward pods."""


# ---------------------------------------------------------------- model
class LoraSpec(ApiModel):
    rank: int = Field(16, ge=1, le=1024)
    """LoRA rank (r)."""
    alpha: float = Field(32.0, gt=0, le=4096)
    """LoRA alpha (scaling = alpha / rank)."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """LoRA dropout."""
    target_modules: list[Annotated[str, StringConstraints(min_length=1, max_length=128)]] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], max_length=32)
    """Module names to adapt."""


@rules(Rule(
    cel="self.base.startsWith('builtin:') || self.base.startsWith('/') || self.base.matches('^(hf|s3|pvc)://') "
        "|| has(self.volume)",
    message="model.base must be 'builtin:<name>', an absolute path, a path relative to model.volume, or a storage "
            "URI (hf://ORG/NAME[@REVISION], s3://BUCKET/PREFIX, pvc://CLAIM/PATH)",
    field=".base",
    check=lambda m: m.base.startswith("builtin:") or m.base.startswith("/") or "://" in m.base
    or m.volume is not None,
), Rule(
    cel="!self.base.startsWith('builtin:') || self.base in ['" + "', '".join(BUILTIN_MODELS) + "']",
    message="unknown builtin model: the builtin models are " + ", ".join(BUILTIN_MODELS),
    field=".base",
    check=lambda m: not m.base.startswith("builtin:") or m.base in BUILTIN_MODELS,
), Rule(
    cel="!self.base.contains('://') || self.base.matches('^(hf|s3|pvc)://')",
    message="model.base takes the storage URIs hf://ORG/NAME[@REVISION], s3://BUCKET/PREFIX and pvc://CLAIM/PATH",
    field=".base",
    check=lambda m: "://" not in m.base or uri_problem(m.base, repo_type="model") is None,
    explain=lambda m: uri_problem(m.base, repo_type="model") or "",
), Rule(
    cel="!self.base.matches('^(hf|s3|pvc)://') || !has(self.volume)",
    message="model.volume cannot be combined with a storage URI in model.base (a pvc:// URI names its claim)",
    field=".volume",
    check=lambda m: not is_uri(m.base) or m.volume is None,
))
class ModelSpec(ApiModel):
    base: PathStr
    """The base model: `builtin:tiny` (built offline by the runtime; `builtin:tiny-vllm` is the same with a head size vLLM serves); a storage URI: `hf://ORG/NAME[@REVISION]` (a Hugging Face repository, from `storage.huggingFace.endpoint`), `s3://BUCKET/PREFIX` (the model directory under that prefix, from `storage.s3`) or `pvc://CLAIM/PATH` (read in place); or a Hugging Face model directory (an absolute path, or a path on `volume`). hf:// and s3:// models are fetched once into the checkpoint volume before any role starts (condition ModelReady)."""
    volume: Optional[VolumeRef] = None
    """The volume holding the model directory (relative paths in `base` resolve against its mount path)."""
    tokenizer: Optional[PathStr] = None
    """Tokenizer directory when it differs from the model directory."""
    chat_template: Optional[Annotated[str, StringConstraints(max_length=32768)]] = None
    """A Jinja chat template that overrides the tokenizer's."""
    warm_start_from: Optional[PathStr] = None
    """Start from these weights (a model directory, or one of our checkpoints) instead of the base weights; relative paths resolve against model.volume. Not with lora."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Training and inference dtype. auto: inference is bfloat16 on GPU, float32 on CPU; the trainer keeps float32 (master) weights and computes in bfloat16 on GPU, float32 on CPU; computing in bfloat16 or float16 on the CPU, its attention stays float32 (faster there)."""
    lora: Optional[LoraSpec] = None
    """Train a LoRA adapter instead of all weights; inference then loads adapters only."""


# ---------------------------------------------------------------- dataset
ColumnName = Annotated[str, StringConstraints(min_length=1, max_length=256)]


@rules(Rule(
    cel="!has(self.prompt) || !has(self.messages)",
    message="fields.prompt and fields.messages cannot both be set (a task is a prompt string or chat messages)",
    field="",
    check=lambda f: f.prompt is None or f.messages is None,
))
class FieldMapping(ApiModel):
    prompt: Optional[ColumnName] = None
    """The column holding the prompt string (a task's `prompt`)."""
    messages: Optional[ColumnName] = None
    """The column holding the chat messages (a list of `{role, content}`)."""
    ground_truth: Optional[ColumnName] = None
    """The column holding the reference answer the evaluator compares with (GSM8K's `answer`, whose final number follows `####`, works with the math evaluator as it is)."""
    task_id: Optional[ColumnName] = None
    """The column holding a unique task id (default: the file name and row)."""
    domain: Optional[ColumnName] = None
    """The column holding the task's domain tag (for `dataset.mix`)."""


@rules(Rule(
    cel="[has(self.builtin), has(self.configMapKeyRef), has(self.path), has(self.uri)].filter(x, x).size() == 1",
    message="exactly one of builtin, configMapKeyRef, path or uri must be set",
    field="",
    check=lambda d: sum(x is not None for x in (d.builtin, d.config_map_key_ref, d.path, d.uri)) == 1,
), Rule(
    cel="!has(self.uri) || self.uri.matches('^(hf|s3|pvc)://')",
    message="uri takes hf://datasets/ORG/NAME[@REVISION], s3://BUCKET/KEY-OR-PREFIX and pvc://CLAIM/PATH",
    field=".uri",
    check=lambda d: d.uri is None or uri_problem(d.uri, repo_type="dataset") is None,
    explain=lambda d: uri_problem(d.uri or "", repo_type="dataset") or "",
), Rule(
    cel="!has(self.builtin) || (!has(self.fields) && !has(self.format))",
    message="fields and format apply to files (configMapKeyRef, path, uri), not to builtin datasets",
    field=".fields",
    check=lambda d: d.builtin is None or (d.fields is None and d.format is None),
), Rule(
    cel="!has(self.volume) || has(self.path)",
    message="volume holds `path`: set path with it (a pvc:// uri names its own claim)",
    field=".volume",
    check=lambda d: d.volume is None or d.path is not None,
))
class DataSource(ApiModel):
    builtin: Optional[BuiltinDatasetName] = None
    """A dataset generated offline by the runtime."""
    config_map_key_ref: Optional[ConfigMapKeySelector] = None
    """A file in a ConfigMap key (small datasets only: ConfigMaps are limited to 1 MiB)."""
    path: Optional[PathStr] = None
    """A file (or a directory holding the split's files) on `volume`, or an absolute path."""
    volume: Optional[VolumeRef] = None
    """The volume that holds `path`."""
    uri: Optional[PathStr] = None
    """A storage URI: `hf://datasets/ORG/NAME[@REVISION]` (the files of `split` and `config` in that dataset repository), `s3://BUCKET/KEY` (a file) or `s3://BUCKET/PREFIX/` (the split's files under it), `pvc://CLAIM/PATH` (a file or directory, read in place). hf:// and s3:// data is fetched once into the checkpoint volume before any role starts (condition DatasetReady), every row validated then."""
    split: Optional[Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][-_.A-Za-z0-9]*$")]] = None
    """The split to read (default `train`) when the source is a directory or a dataset repository: its files are named by the split (`train.jsonl`, `data/train-00000-of-00002.parquet`, `<config>/test-*.parquet`, as on the Hugging Face hub)."""
    config: Optional[Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][-_.A-Za-z0-9]*$")]] = None
    """The dataset configuration (a subdirectory of the repository, such as GSM8K's `main`)."""
    format: Optional[Literal["jsonl", "json", "parquet", "csv"]] = None
    """The file format; by default from each file's extension (.jsonl/.ndjson, .json, .parquet, .csv)."""
    fields: Optional[FieldMapping] = None
    """Which columns hold the prompt (or messages), the ground truth, the task id and the domain, when they are not named `prompt`/`messages`, `ground_truth`, `task_id`/`id` and `domain`. Other columns are kept as the task's metadata."""
    size: Optional[int] = Field(None, ge=1, le=10_000_000)
    """Number of tasks to generate (builtin) or to keep (files); all when unset."""
    seed: int = Field(0, ge=0, le=2**31 - 1)
    """Seed for generation and shuffling."""


DomainName = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9]([-_.A-Za-z0-9]*[A-Za-z0-9])?$")]


@rules(Rule(
    cel="!has(self.min) || !has(self.max) || self.min < self.max",
    message="rewardClip.min must be below rewardClip.max",
    field="",
    check=lambda c: c.min is None or c.max is None or c.min < c.max,
))
class RewardClip(ApiModel):
    min: Optional[float] = Field(None, ge=-1e6, le=1e6)
    """Rewards below are raised to it."""
    max: Optional[float] = Field(None, ge=-1e6, le=1e6)
    """Rewards above are lowered to it."""


class DomainMix(ApiModel):
    domain: DomainName
    """A domain tag of the training tasks (a task's `domain` field; the builtin datasets tag theirs `math`)."""
    weight: float = Field(gt=0, le=1000)
    """Its share of every step's prompts (weights are normalised to probabilities)."""
    reward_clip: Optional[RewardClip] = None
    """Clip this domain's rewards to [min, max] before the advantages (first of clip, scale, normalisation; logged rewards stay as scored)."""
    reward_scale: float = Field(1.0, gt=0, le=1000)
    """Multiply this domain's rewards (after clipping) before the advantages."""
    reward_normalization: Literal["none", "batch", "running"] = "none"
    """Standardise this domain's rewards (after clip and scale): none; batch (this step's mean and std of the domain); running (the domain's mean and std over every step so far, kept in the checkpoint)."""
    train: Optional[DataSource] = None
    """This domain's own training tasks, every one tagged with this domain (a row tagged with another domain is refused). Without it, the domain's tasks are those of `dataset.train` tagged with it."""


@rules(Rule(
    cel="!has(self.mix) || self.mix.all(x, self.mix.exists_one(y, y.domain == x.domain))",
    message="each domain may appear in dataset.mix once",
    field=".mix",
    check=lambda d: d.mix is None or len({m.domain for m in d.mix}) == len(d.mix),
), Rule(
    cel="has(self.train) || (has(self.mix) && self.mix.all(x, has(x.train)))",
    message="dataset.train is required unless every dataset.mix entry has its own train source",
    field=".train",
    check=lambda d: d.train is not None or (d.mix is not None and all(m.train is not None for m in d.mix)),
))
class DatasetSpec(ApiModel):
    train: Optional[DataSource] = None
    """Tasks to train on (each row's `domain` tags it for `mix`). Required unless every `mix` entry has its own `train` source."""
    eval: Optional[DataSource] = None
    """Held-out tasks for periodic evaluation."""
    shuffle: bool = True
    """Shuffle the training tasks every epoch (deterministically, from the seed)."""
    mix: Optional[list[DomainMix]] = Field(None, min_length=1, max_length=64)
    """Mix the training tasks by domain: each step's prompts are split across these domains in proportion to their weights (the same counts every step, largest remainder first), each domain drawn from its own seeded, resumable order. Every training task's domain must be listed."""

    def train_sources(self) -> list[tuple[str, str, DataSource, Optional[str]]]:
        """``(field, mount, source, domain)`` of every training source: ``dataset.train`` (domain None:
        its rows carry their own), then each ``mix`` entry's own; ``mount`` names its directory under
        the dataset mount (``train``, ``mix-<i>``)."""
        out = [("spec.dataset.train", "train", self.train, None)] if self.train is not None else []
        return out + [(f"spec.dataset.mix[{i}].train", f"mix-{i}", m.train, m.domain)
                      for i, m in enumerate(self.mix or []) if m.train is not None]

    def sources(self) -> list[tuple[str, str, DataSource, Optional[str]]]:
        """Every source, training ones first, then ``dataset.eval`` (mount ``eval``)."""
        ev = [("spec.dataset.eval", "eval", self.eval, None)] if self.eval is not None else []
        return self.train_sources() + ev

    def order_seed(self) -> int:
        """The seed of the training order: ``dataset.train``'s, else the first ``mix`` source's."""
        return self.train_sources()[0][2].seed


# ---------------------------------------------------------------- evaluator
class BundleSpec(ApiModel):
    image: Image
    """Image with the evaluator bundle installed; the rollout pods run it with our processor injected."""
    entrypoint: Entrypoint
    """`module:function` that scores a sample: `score(sample, item) -> float | None`."""
    rollout: Optional[Entrypoint] = None
    """Optional `module:function` that rolls out one task (multi-turn environments and agents)."""


class FileEvaluatorSpec(ApiModel):
    config_map_key_ref: ConfigMapKeySelector
    """A ConfigMap key holding a Python file; it runs in the runtime image."""
    function: Annotated[str, StringConstraints(max_length=128, pattern=r"^[A-Za-z_]\w*$")] = "score"
    """The scoring function in that file."""
    rollout: Optional[Annotated[str, StringConstraints(max_length=128, pattern=r"^[A-Za-z_]\w*$")]] = None
    """Optional rollout function in that file."""


@rules(Rule(
    cel="has(self.configMapKeyRef) != has(self.entrypoint)",
    message="evalProtocol needs exactly one of configMapKeyRef (a Python file) or entrypoint (an importable module)",
    field="",
    check=lambda e: (e.config_map_key_ref is None) != (e.entrypoint is None),
))
class EvalProtocolEvaluatorSpec(ApiModel):
    """An Eval Protocol evaluator, run unchanged as the reward: an `@evaluation_test` (pointwise or groupwise) or a `@reward_function` (pointwise or batch)."""

    config_map_key_ref: Optional[ConfigMapKeySelector] = None
    """A ConfigMap key holding the Python file that defines it; it runs in the runtime image, which has eval-protocol."""
    entrypoint: Optional[Annotated[str, StringConstraints(max_length=512, pattern=r"^[A-Za-z_][\w.]*$")]] = None
    """A module that defines it, importable where scoring runs (the bundle image when the job has one and scores in the rollout pods, else the runtime image)."""
    test: Optional[Annotated[str, StringConstraints(max_length=128, pattern=r"^[A-Za-z_]\w*$")]] = None
    """The decorated function's name; defaults to the only `@evaluation_test` or `@reward_function` the file or module defines."""


class EvaluatorConfig(ApiModel):
    """Settings of one evaluator. The fields below are the ones rules check; any other key is kept
    and passed to the evaluator as is (string_check: operation, reference; regex: flags, fullMatch;
    llm_judge: model, promptTemplate, scoreRegex, maxTokens; code_sandbox: timeoutSeconds, memoryMB)."""

    model_config = ConfigDict(extra="allow")

    endpoint: Optional[Annotated[str, StringConstraints(min_length=1, max_length=2048)]] = None
    """llm_judge: base URL of an OpenAI-compatible server."""
    pattern: Optional[Annotated[str, StringConstraints(min_length=1, max_length=4096)]] = None
    """regex: the pattern a completion must match."""
    prompt_template: Optional[Annotated[str, StringConstraints(min_length=1, max_length=65536)]] = None
    """llm_judge: the judge's prompt (with a custom one, scoreMax or the evaluator's rewardRange bounds the score)."""
    score_max: Optional[float] = Field(None, ge=-REWARD_LIMIT, le=REWARD_LIMIT)
    """llm_judge: the highest score; set, scores in [scoreMin, scoreMax] map to rewards in [0, 1]."""

    @model_validator(mode="after")
    def _size(self) -> "EvaluatorConfig":
        n = len(json.dumps(self.model_dump(by_alias=True, exclude_none=True), default=str))
        if n > MAX_EVALUATOR_CONFIG_BYTES:
            raise ValueError(f"{n} bytes of JSON, more than {MAX_EVALUATOR_CONFIG_BYTES} (the job's config travels in "
                             "a ConfigMap of at most 1 MiB): put large data in a file of the evaluator's image or on a "
                             "volume")
        return self


_JUDGE_ENDPOINT = Rule(
    cel="!has(self.builtin) || self.builtin != 'llm_judge' || (has(self.config) && has(self.config.endpoint))",
    message="an llm_judge evaluator needs config.endpoint (an OpenAI-compatible base URL)",
    field=".config",
    check=lambda e: e.builtin != "llm_judge" or (e.config is not None and e.config.endpoint is not None),
)
_JUDGE_BOUNDED = Rule(
    cel="!has(self.builtin) || self.builtin != 'llm_judge' || !has(self.config) || !has(self.config.promptTemplate) "
        "|| has(self.config.scoreMax) || has(self.rewardRange)",
    message="an llm_judge evaluator with a custom config.promptTemplate needs config.scoreMax (scores map to [0, 1]) "
            "or rewardRange (the raw score is the reward): a judge's unbounded number is no reward",
    field=".config",
    check=lambda e: (e.builtin != "llm_judge" or e.config is None or e.config.prompt_template is None
                     or e.config.score_max is not None or e.reward_range is not None),
)
_REGEX_PATTERN = Rule(
    cel="!has(self.builtin) || self.builtin != 'regex' || (has(self.config) && has(self.config.pattern))",
    message="a regex evaluator needs config.pattern",
    field=".config",
    check=lambda e: e.builtin != "regex" or (e.config is not None and e.config.pattern is not None),
)


@rules(Rule(
    cel="self.min < self.max",
    message="rewardRange.min must be below rewardRange.max",
    field="",
    check=lambda r: r.min < r.max,
))
class RewardRange(ApiModel):
    """The rewards an evaluator may return (inclusive)."""

    min: float = Field(ge=-REWARD_LIMIT, le=REWARD_LIMIT)
    """The lowest reward."""
    max: float = Field(ge=-REWARD_LIMIT, le=REWARD_LIMIT)
    """The highest reward."""


@rules(Rule(
    cel="[has(self.builtin), has(self.bundle), has(self.file), has(self.evalProtocol)].filter(x, x).size() == 1",
    message="exactly one of builtin, bundle, file or evalProtocol must be set",
    field="",
    check=lambda e: sum(x is not None for x in (e.builtin, e.bundle, e.file, e.eval_protocol)) == 1,
), _JUDGE_ENDPOINT, _JUDGE_BOUNDED, _REGEX_PATTERN)
class EvaluatorEntry(ApiModel):
    name: Optional[Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-_a-z0-9]*[a-z0-9])?$")]] = None
    """Name used in per-evaluator metrics; defaults to the builtin kind or the function name."""
    builtin: Optional[BuiltinEvaluatorName] = None
    """A builtin evaluator."""
    bundle: Optional[BundleSpec] = None
    """The user's evaluator bundle in an image."""
    file: Optional[FileEvaluatorSpec] = None
    """The user's evaluator as a Python file from a ConfigMap."""
    eval_protocol: Optional[EvalProtocolEvaluatorSpec] = None
    """An Eval Protocol `@evaluation_test` or `@reward_function`, run unchanged: each sample becomes an `EvaluationRow` and `evaluation_result.score` is the reward (docs/eval-protocol.md)."""
    config: Optional[EvaluatorConfig] = None
    """Evaluator settings (e.g. string_check: operation, reference; regex: pattern; llm_judge: endpoint, model, promptTemplate; code_sandbox: timeoutSeconds, memoryMB)."""
    api_key_secret_ref: Optional[SecretKeySelector] = None
    """Secret holding an API key (llm_judge); given to the reward pods as an environment variable."""
    weight: float = Field(1.0, ge=0, le=1000)
    """Weight in the combined reward (weighted mean over evaluators that apply)."""
    domains: Optional[list[DomainName]] = Field(None, min_length=1, max_length=64)
    """Only tasks of these domains are scored by this evaluator; for the others it does not apply (left out of the weighted mean). All domains when unset."""
    timeout_seconds: Optional[float] = Field(None, gt=0, le=3600)
    """Per-sample timeout for this evaluator; defaults to evaluator.timeoutSeconds."""
    reward_range: Optional[RewardRange] = None
    """The rewards this evaluator may return. A reward outside it is refused: the sample gets a runtime_error from this evaluator (onError applies) and the reward_out_of_range metric counts it. Defaults to [-1e6, 1e6]."""

    def file_ref(self) -> Optional[ConfigMapKeySelector]:
        """The ConfigMap key holding this evaluator's Python file (file and evalProtocol evaluators)."""
        if self.file is not None:
            return self.file.config_map_key_ref
        if self.eval_protocol is not None:
            return self.eval_protocol.config_map_key_ref
        return None


@rules(Rule(
    cel="has(self.evaluators) != ([has(self.builtin), has(self.bundle), has(self.file), has(self.evalProtocol)].exists(x, x))",
    message="set either one evaluator (builtin, bundle, file or evalProtocol) or a list in evaluators, not both",
    field="",
    check=lambda e: (e.evaluators is not None) != any(x is not None for x in (e.builtin, e.bundle, e.file, e.eval_protocol)),
), Rule(
    cel="has(self.evaluators) || [has(self.builtin), has(self.bundle), has(self.file), has(self.evalProtocol)].filter(x, x).size() == 1",
    message="exactly one of builtin, bundle, file or evalProtocol must be set",
    field="",
    check=lambda e: e.evaluators is not None or sum(x is not None for x in (e.builtin, e.bundle, e.file, e.eval_protocol)) == 1,
), Rule(
    cel="!has(self.evaluators) || self.evaluators.filter(x, has(x.bundle)).size() <= 1",
    message="at most one evaluator may be a bundle image (the rollout pods run that image)",
    field=".evaluators",
    check=lambda e: e.evaluators is None or sum(x.bundle is not None for x in e.evaluators) <= 1,
), _JUDGE_ENDPOINT, _JUDGE_BOUNDED, _REGEX_PATTERN)
class EvaluatorSpec(EvaluatorEntry):
    evaluators: Optional[list[EvaluatorEntry]] = Field(None, min_length=1, max_length=16)
    """Several evaluators combined by weight (instead of the single one above)."""
    timeout_seconds: float = Field(30.0, gt=0, le=3600)
    """Per-sample timeout: a sample that takes longer scores 0 with a timeout error flag."""
    on_error: Literal["zero", "exclude"] = "zero"
    """What an evaluator error or timeout counts as: reward 0, or excluded from the group baseline."""
    remote: bool = False
    """Score in the reward Deployment (isolation, size) instead of in the rollout pods."""

    def entries(self) -> list[EvaluatorEntry]:
        """The evaluators as a list, whichever form the spec used."""
        if self.evaluators is not None:
            return list(self.evaluators)
        return [EvaluatorEntry.model_validate(self.model_dump(
            by_alias=True, exclude_none=True, exclude={"evaluators", "on_error", "remote"}))]

    def bundle_image(self) -> str | None:
        for e in self.entries():
            if e.bundle is not None:
                return e.bundle.image
        return None

    def secret_refs(self) -> list[SecretKeySelector]:
        return [e.api_key_secret_ref for e in self.entries() if e.api_key_secret_ref is not None]


# ---------------------------------------------------------------- rollout
@rules(Rule(
    cel="self.topP == 1.0",
    message="rollout.topP must be 1.0: the trainer computes log-probs of the full distribution, so nucleus "
            "sampling would bias every importance ratio (use temperature to shape sampling)",
    field=".topP",
    check=lambda r: r.top_p == 1.0,
), Rule(
    cel="self.topK == -1",
    message="rollout.topK must be -1: the trainer computes log-probs of the full distribution, so top-k "
            "sampling would bias every importance ratio (use temperature to shape sampling)",
    field=".topK",
    check=lambda r: r.top_k == -1,
), Rule(
    cel="self.tokens != 'recompute' || self.temperature == 1.0",
    message="rollout.tokens recompute needs rollout.temperature 1.0: the log-probs are rebuilt from a prefill, "
            "and engines return prompt log-probs before temperature",
    field=".tokens",
    check=lambda r: r.tokens != "recompute" or r.temperature == 1.0,
))
class RolloutSpec(ApiModel):
    samples_per_prompt: int = Field(8, ge=1, le=256)
    """Completions sampled per prompt (the group size n)."""
    prompts_per_step: int = Field(16, ge=1, le=4096)
    """Prompts (groups) per training step."""
    temperature: float = Field(1.0, gt=0, le=4)
    """Sampling temperature; logprobs are recorded after temperature (processed logprobs)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling threshold; must be 1.0 (off): the trainer's log-probs are of the full distribution."""
    top_k: int = Field(-1, ge=-1, le=100000)
    """Top-k sampling; must be -1 (off): the trainer's log-probs are of the full distribution."""
    max_tokens: int = Field(256, ge=1, le=131072)
    """Maximum completion tokens per turn."""
    max_prompt_tokens: int = Field(1024, ge=1, le=131072)
    """A task whose rendered prompt is longer is not sampled: its episodes carry a prompt_too_long error."""
    tokens: Literal["exact", "recompute"] = "exact"
    """Where the training tokens come from. exact: samples are drawn with token-id prompts and the engine's own completion ids and log-probs are kept. recompute: samples are drawn as a plain chat client would (/v1/chat/completions, text only), then the reply is re-tokenised and its log-probs taken from one prefill at the same policy version (costs one prefill per sample; re-tokenisation can differ from the sampled ids; needs temperature 1.0). See docs/rollout-tokens.md."""
    max_turns: int = Field(1, ge=1, le=256)
    """Maximum assistant turns per conversation (multi-turn bundles); the episode ends there with termination reason max_turns."""
    replicas: int = Field(1, ge=1, le=256)
    """Rollout pods (at least one: the job needs them; ``suspend`` stops every pod)."""
    concurrency: int = Field(32, ge=1, le=4096)
    """Samples in flight per rollout pod (a request for a prompt's n samples counts n; a pod leases concurrency / samplesPerPrompt tasks at a time)."""
    max_staleness: int = Field(0, ge=0, le=64)
    """0: on-policy. S > 0: episodes from policies at most S versions old are accepted (bounded-staleness async)."""
    lease_timeout_seconds: int = Field(300, ge=5, le=86400)
    """A leased task whose episodes do not arrive in time is re-issued."""
    request_timeout_seconds: float = Field(120.0, gt=0, le=86400)
    """Deadline for one inference request, retries included."""
    pod: Optional[WorkerPodOverrides] = None
    """Placement, resources and extras of the rollout pods (docs/how-to/placement.md)."""

    def policy_versions_served(self) -> int:
        """How many policy versions inference keeps at once: the current one and the ``maxStaleness``
        before it, at least two so that requests in flight across a publication still finish. An
        engine serving adapters keeps that many loaded (and the trainer that many on disk)."""
        return max(2, self.max_staleness + 1)


# ---------------------------------------------------------------- inference
# Engine options the operator (and rft run) set on the engine's command line from other fields, or that
# would break what the other roles rely on (the port the Service targets, the job token every request
# carries); extraArgs may not set them.
RESERVED_ENGINE_ARGS = ("--model", "--host", "--port", "--served-model-name", "--dtype", "--max-model-len",
                        "--weights-dir", "--tokenizer", "--chat-template", "--logprobs-mode", "--enable-lora",
                        "--max-lora-rank", "--max-loras", "--max-cpu-loras", "--api-key", "--worker-extension-cls")
_RESERVED_CEL = "[" + ", ".join(f"'{a}'" for a in RESERVED_ENGINE_ARGS) + "]"


def reserved_engine_args(args: list[str]) -> list[str]:
    """The options of ``args`` that :data:`RESERVED_ENGINE_ARGS` holds (``--port 9000`` and ``--port=9000``)."""
    return [a for a in args if a.split("=", 1)[0] in RESERVED_ENGINE_ARGS]


# The builtin engine's (``rft serve``'s) options extraArgs may pass: None for a flag, else the pattern its
# value must match (``--name value`` or ``--name=value``) and how messages show it. tests/serve/test_engine_units.py
# checks them against rft serve's own parser; its other options are RESERVED_ENGINE_ARGS or
# ``--policy-version`` (the version of the weights it starts with, which the operator's publications set).
BUILTIN_ENGINE_OPTIONS: dict[str, tuple[str, str] | None] = {
    "--max-batch-size": ("[1-9][0-9]*", "N"), "--threads": ("[1-9][0-9]*", "N"),
    "--device": ("auto|cpu|cuda(:[0-9]+)?", "auto|cpu|cuda[:N]"),
    "--engine-process": None, "--no-engine-process": None, "--enforce-eager": None,
    "--engine-pacing": ("auto|never", "auto|never"),
    "--kv-cache-dtype": ("auto|float32|float16|bfloat16", "auto|float32|float16|bfloat16"),
    "--health-timeout": ("[0-9]*[.]?[0-9]+", "SECONDS"), "--trust-request-chat-template": None,
    "--log-level": ("(?i:debug|info|warning|error|critical)", "debug|info|warning|error|critical"),
}
_BUILTIN_NAMES_CEL = "[" + ", ".join(f"'{a}'" for a in BUILTIN_ENGINE_OPTIONS) + "]"
_BUILTIN_VALUED_CEL = "[" + ", ".join(f"'{a}'" for a, v in BUILTIN_ENGINE_OPTIONS.items() if v) + "]"


def builtin_engine_args_problem(args: list[str]) -> str | None:
    """What is wrong with ``args`` as the builtin engine's extra options (an unknown option, a flag given a
    value, a value missing, not matching its option's pattern, or following no option), or None."""
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if not name.startswith("-"):
            return f"{arg!r} follows no option that takes a value"
        if name not in BUILTIN_ENGINE_OPTIONS:
            return f"{name} is not an option of the builtin engine"
        takes = BUILTIN_ENGINE_OPTIONS[name]
        if takes is None:
            if eq:
                return f"{name} takes no value"
        else:
            if not eq:
                i += 1
                if i == len(args) or args[i].startswith("--"):
                    return f"{name} needs a value ({takes[1]})"
                value = args[i]
            if not re.fullmatch(takes[0], value):
                return f"{name} {value!r}: expected {takes[1]}"
        i += 1
    return None


def gpu_count(resources: Optional[Resources]) -> int:
    """The GPUs of a pod: its ``nvidia.com/gpu`` limit, else its request, else 0."""
    if resources is None:
        return 0
    for rl in (resources.limits, resources.requests):
        if rl and GPU_RESOURCE in rl:
            return int(str(rl[GPU_RESOURCE]))
    return 0


# CEL twin of gpu_count(): GPU quantities are whole numbers (int or a digit string).
_GPU_CEL = ("(has(self.resources) && has(self.resources.limits) && '{g}' in self.resources.limits)"
            " ? int(string(self.resources.limits['{g}']))"
            " : (has(self.resources) && has(self.resources.requests) && '{g}' in self.resources.requests)"
            " ? int(string(self.resources.requests['{g}'])) : 0").format(g=GPU_RESOURCE)


VLLM_TYPED_ARGS = ("--tensor-parallel-size", "-tp", "--gpu-memory-utilization", "--max-num-seqs",
                   "--enable-prefix-caching", "--no-enable-prefix-caching")
"""vLLM options that ``inference.vllm`` sets (typed), so ``inference.extraArgs`` may not."""
_VLLM_TYPED_CEL = "[" + ", ".join(f"'{a}'" for a in VLLM_TYPED_ARGS) + "]"


class VLLMSpec(ApiModel):
    tensor_parallel_size: Optional[int] = Field(None, ge=1, le=64)
    """vLLM's --tensor-parallel-size: the GPUs one replica shards the model over. With GPUs in inference.resources it must equal their count (default: that count, else 1)."""
    gpu_memory_utilization: Optional[float] = Field(None, gt=0, le=1)
    """vLLM's --gpu-memory-utilization: the share of each GPU's memory vLLM may take (weights, activations, KV cache); default vLLM's (0.9)."""
    max_num_seqs: Optional[int] = Field(None, ge=1, le=65536)
    """vLLM's --max-num-seqs: sequences decoded together in one iteration; default vLLM's."""
    enable_prefix_caching: Optional[bool] = None
    """vLLM's prefix cache (--[no-]enable-prefix-caching): the n samples of a prompt share its KV blocks; default vLLM's (on). The cache is reset at every weight update."""


@rules(Rule(
    cel=f"!has(self.extraArgs) || !self.extraArgs.exists(a, a in {_RESERVED_CEL} "
        f"|| {_RESERVED_CEL}.exists(f, a.startsWith(f + '=')))",
    message="inference.extraArgs may not set " + ", ".join(RESERVED_ENGINE_ARGS) + ": the operator sets them "
            "from spec.model, spec.inference (maxModelLen, port, weightSync) and the job's name and token",
    field=".extraArgs",
    check=lambda i: not reserved_engine_args(i.extra_args),
), Rule(
    cel=f"!has(self.extraArgs) || self.engine != 'builtin' || self.extraArgs.all(a, !a.startsWith('-') "
        f"|| a in {_BUILTIN_NAMES_CEL} || {_BUILTIN_VALUED_CEL}.exists(f, a.startsWith(f + '=')))",
    message="inference.extraArgs: the builtin engine takes " + ", ".join(
        a if v is None else f"{a} {v[1]}" for a, v in BUILTIN_ENGINE_OPTIONS.items()),
    field=".extraArgs",
    check=lambda i: i.engine != "builtin" or builtin_engine_args_problem(i.extra_args) is None,
    explain=lambda i: str(builtin_engine_args_problem(i.extra_args)),
), Rule(
    cel="!has(self.vllm) || self.engine == 'vllm'",
    message="inference.vllm sets vLLM's options: it needs engine vllm",
    field=".vllm",
    check=lambda i: i.vllm is None or i.engine == "vllm",
), Rule(
    cel=f"!has(self.extraArgs) || self.engine != 'vllm' || !self.extraArgs.exists(a, a in {_VLLM_TYPED_CEL} "
        f"|| {_VLLM_TYPED_CEL}.exists(f, a.startsWith(f + '=')))",
    message="inference.extraArgs may not set " + ", ".join(VLLM_TYPED_ARGS) + ": use inference.vllm "
            "(tensorParallelSize, gpuMemoryUtilization, maxNumSeqs, enablePrefixCaching)",
    field=".extraArgs",
    check=lambda i: i.engine != "vllm" or not any(a.split("=", 1)[0] in VLLM_TYPED_ARGS for a in i.extra_args),
), Rule(
    cel=f"!has(self.vllm) || !has(self.vllm.tensorParallelSize) || ({_GPU_CEL}) == 0 "
        f"|| self.vllm.tensorParallelSize == ({_GPU_CEL})",
    message="inference.vllm.tensorParallelSize must equal the GPUs in inference.resources (one replica's "
            "shards, one per GPU)",
    field=".vllm.tensorParallelSize",
    check=lambda i: i.vllm is None or i.vllm.tensor_parallel_size is None or gpu_count(i.resources) == 0
    or i.vllm.tensor_parallel_size == gpu_count(i.resources),
), Rule(
    cel=f"!has(self.vllm) || !has(self.vllm.tensorParallelSize) || self.vllm.tensorParallelSize == 1 "
        f"|| ({_GPU_CEL}) > 0",
    message="inference.vllm.tensorParallelSize above 1 needs GPUs in inference.resources (nvidia.com/gpu)",
    field=".vllm.tensorParallelSize",
    check=lambda i: i.vllm is None or (i.vllm.tensor_parallel_size or 1) == 1 or gpu_count(i.resources) > 0,
))
class InferenceSpec(ApiModel):
    engine: EngineName = "builtin"
    """builtin (our torch server) or vllm."""
    image: Optional[Image] = None
    """Engine image. Unset: the runtime image for builtin, and the operator's configured vLLM image (chart value `images.vllm`) for vllm."""
    replicas: int = Field(1, ge=1, le=256)
    """Inference pods (at least one; ``suspend`` stops every pod). Each policy version is published to
    every ready replica before rollouts are granted it; a replica that starts loads the current one."""
    resources: Optional[Resources] = None
    """Resources of each inference pod."""
    extra_args: list[Arg] = Field(default_factory=list, max_length=64)
    """Extra command-line arguments for the engine (e.g. the builtin engine's --kv-cache-dtype float16); not the options set from other fields (--model, --host, --port, --served-model-name, --dtype, --max-model-len, --weights-dir, --tokenizer, --chat-template, --logprobs-mode, --enable-lora, --max-lora-rank, --max-loras, --max-cpu-loras, --worker-extension-cls) nor --api-key. The builtin engine's are checked: only --max-batch-size, --threads, --device, --[no-]engine-process, --enforce-eager, --engine-pacing, --kv-cache-dtype, --health-timeout, --trust-request-chat-template and --log-level, with valid values (docs/inference-server.md); vLLM's are passed as given."""
    env: list[EnvVar] = Field(default_factory=list, max_length=64)
    """Extra environment for the engine."""
    weight_sync: Literal["disk", "lora", "none"] = "disk"
    """How new weights reach inference: disk (full weights every step, from the shared volume: the builtin server's update_weights_from_disk; vLLM reloads them in place behind the gate, no restart), lora (each policy version a LoRA adapter loaded at runtime; needs model.lora; the way for vllm with LoRA), none (frozen policy, for evaluation)."""
    max_model_len: Optional[int] = Field(None, ge=64, le=1048576)
    """Context length served (prompt plus completion); default the model's own maximum (max_position_embeddings). A value above the model's maximum is refused by the engine at start."""
    port: int = Field(8000, ge=1024, le=65535)
    """Container port."""
    pod: Optional[PodOverrides] = None
    """Placement and extras of the inference pods (their resources and env are the fields above; docs/how-to/placement.md)."""
    vllm: Optional[VLLMSpec] = None
    """vLLM's server options as typed fields (engine vllm only; docs/how-to/gpus-and-vllm.md)."""


# ---------------------------------------------------------------- trainer
@rules(Rule(
    cel="self.low > 0.0 && self.low < 1.0",
    message="trainer.clip.low must be in (0, 1)",
    field=".low",
    check=lambda c: 0 < c.low < 1,
), Rule(
    cel="self.high > 0.0",
    message="trainer.clip.high must be positive",
    field=".high",
    check=lambda c: c.high > 0,
), Rule(
    cel="!has(self.dualClipC) || self.dualClipC > 1.0",
    message="trainer.clip.dualClipC must be greater than 1",
    field=".dualClipC",
    check=lambda c: c.dual_clip_c is None or c.dual_clip_c > 1,
))
class ClipSpec(ApiModel):
    low: float = 0.2
    """Lower clip range: ratios below 1 - low are clipped."""
    high: float = 0.2
    """Upper clip range: ratios above 1 + high are clipped (clip-higher when high > low)."""
    dual_clip_c: Optional[float] = None
    """Dual-clip constant c (> 1) bounding the loss for negative advantages."""


class KLSpec(ApiModel):
    coef: float = Field(0.0, ge=0, le=100)
    """KL coefficient against the frozen reference model; 0 disables the reference model."""
    estimator: KLEstimatorName = "k3"
    """KL estimator (Schulman): k1, k2 or k3."""
    placement: Literal["loss", "reward"] = "loss"
    """Add the KL term to the loss, or subtract it from the reward."""


class ImportanceSamplingSpec(ApiModel):
    level: Literal["token", "sequence"] = "token"
    """Truncated importance sampling between trainer and inference logprobs, per token or per sequence."""
    mode: Literal["truncate", "mask"] = "truncate"
    """Truncate weights at the cap, or mask tokens/sequences above it."""
    cap: float = Field(2.0, gt=1, le=1000)
    """Cap on the importance weight."""


class DynamicSamplingSpec(ApiModel):
    enabled: bool = True
    """Drop groups whose rewards are all equal and sample more to refill the batch (DAPO)."""
    max_rounds: int = Field(3, ge=0, le=100)
    """Extra generation rounds at most, per step."""


class OverlongSpec(ApiModel):
    buffer_tokens: int = Field(..., ge=1, le=131072)
    """Completions longer than maxTokens - bufferTokens are penalised linearly (DAPO overlong shaping)."""
    penalty_factor: float = Field(1.0, ge=0, le=100)
    """Penalty at maxTokens."""


class SchedulerSpec(ApiModel):
    kind: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule after warmup."""
    warmup_steps: int = Field(0, ge=0, le=1_000_000)
    """Linear warmup steps."""




def _processes_fit(t: "TrainerSpec") -> bool:
    gpus = gpu_count(t.resources)
    return t.processes_per_node is None or gpus == 0 or t.processes_per_node <= gpus


@rules(Rule(
    cel="self.learningRate > 0.0",
    message="trainer.learningRate must be positive",
    field=".learningRate",
    check=lambda t: t.learning_rate > 0,
), Rule(
    cel=f"!has(self.processesPerNode) || ({_GPU_CEL}) == 0 || self.processesPerNode <= ({_GPU_CEL})",
    message="trainer.processesPerNode must not exceed the pod's GPUs (trainer.resources nvidia.com/gpu)",
    field=".processesPerNode",
    check=_processes_fit,
))
class TrainerSpec(ApiModel):
    algorithm: AlgorithmName = "grpo"
    """Algorithm preset: advantage estimator, policy loss, aggregation and defaults."""
    advantage_estimator: Optional[AdvantageEstimatorName] = None
    """Override the preset's advantage estimator."""
    policy_loss: Optional[PolicyLossName] = None
    """Override the preset's policy loss."""
    loss_aggregation: Optional[LossAggregationName] = None
    """Override the preset's loss aggregation."""
    learning_rate: float = Field(1.0e-6, le=1.0)
    """Optimizer learning rate (AdamW)."""
    weight_decay: float = Field(0.0, ge=0, le=1)
    """AdamW weight decay."""
    grad_clip: float = Field(1.0, gt=0, le=1e6)
    """Gradient-norm clipping."""
    max_non_finite_steps: int = Field(3, ge=1, le=1000)
    """A step whose gradient norm is not finite (NaN or infinite) makes no update and is counted; after this many such steps in a row the job fails, its checkpoints as they were (nothing non-finite is published or checkpointed)."""
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    """Learning-rate schedule."""
    kl: KLSpec = Field(default_factory=KLSpec)
    """KL regularisation to the reference model."""
    clip: Optional[ClipSpec] = None
    """Ratio clipping; defaults come from the algorithm preset."""
    importance_sampling: Optional[ImportanceSamplingSpec] = None
    """Train/inference mismatch correction from the inference logprobs; off when unset."""
    dynamic_sampling: Optional[DynamicSamplingSpec] = None
    """Dynamic sampling; the preset decides when unset (on for dapo)."""
    overlong: Optional[OverlongSpec] = None
    """Overlong reward shaping."""
    advantage_whitening: Literal["token", "sequence"] = "token"
    """REINFORCE++-baseline's batch whitening: token (verl and OpenRLHF: each response token weighs once, so long responses weigh more) or sequence (each sample weighs once)."""
    old_logprobs: Literal["recompute", "inference"] = "recompute"
    """Old-policy logprobs: recomputed by the trainer before the update, or the inference engine's. With one epoch per step, no importanceSampling, no KL in the reward and no dropout, the recomputed ones are taken from the update's own forward: the same numbers without a pass of their own."""
    epochs_per_step: int = Field(1, ge=1, le=64)
    """Passes over each step's batch."""
    micro_batch_size: int = Field(8, ge=1, le=4096)
    """Sequences per forward/backward; gradients accumulate to the whole batch."""
    sequence_packing: Optional[bool] = None
    """Unset: false. Run each micro-batch's rows packed into one sequence without padding: position ids restart at every row and no token attends across rows (transformers' packed-sequence mask; flash attention's variable-length kernel where the model uses it). Log-probs and the loss are the padded computation's up to float rounding. It saves the padding's compute; with the dense sdpa attention (the CPU's) attention runs masked over the whole packed micro-batch, so it pays where rows of a micro-batch differ much in length (docs/how-to/memory.md). Micro-batches then run every row whole (no shared-prompt forwards on the CPU)."""
    gradient_checkpointing: Optional[bool] = None
    """Unset: false. Activation checkpointing per decoder layer: each layer keeps only its input in the forward and recomputes its activations in the backward (about a third more compute for a fraction of the activation memory; `rft plan` shows both). The loss and gradients are those without it up to float rounding. Micro-batches then run every row whole (no shared-prompt forwards on the CPU). The trainer fails at start (ModelLoadFailed, naming this field) with a model whose layers cannot be checkpointed."""
    cpu_offload: Optional[bool] = None
    """Unset: false. Keep the policy's sharded parameters, gradients and AdamW state in host memory (FSDP2's CPUOffloadPolicy, as verl's and OpenRLHF's offload switches): each decoder layer's parameters are copied to the device for its forward and backward and freed after, gradients go back to the host, and the optimizer steps on the CPU. The device then holds about two layers' gathered parameters, the activations and the logits (`rft plan` shows both sides); a step takes longer by the copies and a CPU optimizer step. The policy is sharded with FSDP2 even at one process; the reference model (kl.coef > 0) is offloaded the same way. On GPUs the process group gets a gloo backend beside NCCL for the host-side gradient norm. Numbers equal those without it up to float rounding."""
    compile: Optional[Literal["auto", "always", "never"]] = None
    """Unset: auto (so that jobs written before the field existed keep their config hash, and their pods, across an operator upgrade). Compile the policy's and the reference's decoder layers with torch.compile (dynamic shapes: micro-batches of any size reuse one graph; the first step pays the compilation, about 10 s on a GPU). auto: on GPUs, where it fuses most of a step's small kernels (a 365M model's step on an H200: 0.30 s instead of 0.49 s), not on the CPU (tens of seconds of compilation for a few percent), and not where the image lacks the compilers it needs (a C compiler and Python's headers on a GPU; the trainer's log says so); a layer that fails to compile runs eager. always: on any device, and the trainer fails at start, naming this field, where it cannot. never: eager mode."""
    max_steps: int = Field(100, ge=1, le=10_000_000)
    """Training steps (optimizer updates of the policy version)."""
    seed: int = Field(0, ge=0, le=2**31 - 1)
    """Seed for data order, sampling seeds and initialisation."""
    nodes: int = Field(1, ge=1, le=1024)
    """Trainer pods (one Indexed Job); with processesPerNode they form one torch.distributed process group."""
    processes_per_node: Optional[int] = Field(None, ge=1, le=64)
    """Trainer processes per pod (one per GPU on GPU pods). Default: the pod's nvidia.com/gpu count from resources, else 1. nodes x processesPerNode processes train one FSDP-sharded policy (NCCL on GPUs, gloo on CPU); may not exceed the pod's GPUs on a GPU trainer."""
    resources: Optional[Resources] = None
    """Resources of each trainer pod."""
    image: Optional[Image] = None
    """Trainer image; defaults to the runtime image."""
    env: list[EnvVar] = Field(default_factory=list, max_length=64)
    """Extra environment for the trainer."""
    pod: Optional[PodOverrides] = None
    """Placement and extras of the trainer pods (their resources and env are the fields above), also those of the Job that fetches hf:// and s3:// inputs (docs/how-to/placement.md)."""

    def processes(self) -> int:
        """Trainer processes per pod: ``processesPerNode``, else the pod's GPUs, else 1."""
        return self.processes_per_node or gpu_count(self.resources) or 1

    def world_size(self) -> int:
        """Processes in the trainer's process group: ``nodes × processes()``."""
        return self.nodes * self.processes()


# ---------------------------------------------------------------- checkpoint, evaluation
class CheckpointSpec(ApiModel):
    every_steps: int = Field(10, ge=1, le=1_000_000)
    """A complete checkpoint (model, optimizer, scheduler, RNG, data cursor) every K steps, and at the end."""
    keep_last: int = Field(3, ge=1, le=1000)
    """Checkpoints kept; older ones are deleted after a newer one is complete."""
    existing_claim: Optional[Name] = None
    """Use this PersistentVolumeClaim instead of creating one."""
    size: PositiveQuantity = "10Gi"
    """Size of the checkpoint claim the operator creates."""
    storage_class_name: Optional[Name] = None
    """Storage class of the created claim."""
    access_mode: Literal["Auto", "ReadWriteOnce", "ReadWriteMany"] = "Auto"
    """How the checkpoint claim is shared by the pods that mount it (the trainer's and every inference replica's). ReadWriteOnce: one node mounts it, so those pods are scheduled onto one node together. ReadWriteMany: any node (the storage class must support it). Auto: ReadWriteMany when trainer.nodes > 1, else ReadWriteOnce. With existingClaim, declare the claim's mode (Auto is read as ReadWriteOnce)."""
    merge_final_adapter: bool = False
    """With model.lora: also write the adapter merged into model.base as a full model (status.finalModel.mergedPath)."""
    retain_on_delete: bool = False
    """Keep the checkpoint claim (and the trained model on it) when the RFTJob is deleted; a new RFTJob of the same name adopts it and resumes from its latest checkpoint."""


@rules(Rule(
    cel="has(self.scoreAtLeast) || has(self.patience)",
    message="evaluation.stopWhen needs scoreAtLeast, patience or both",
    field=".scoreAtLeast",
    check=lambda w: w.score_at_least is not None or w.patience is not None,
))
class StopWhen(ApiModel):
    score_at_least: Optional[float] = None
    """Stop once an evaluation scores at least this (a target on the held-out set)."""
    patience: Optional[int] = Field(None, ge=1, le=10_000)
    """Stop after this many evaluations in a row that do not beat the best score by more than minDelta (a plateau)."""
    min_delta: float = Field(0.0, ge=0, le=1_000_000)
    """How much an evaluation must beat the best score by to count as an improvement (patience)."""


class EvaluationSpec(ApiModel):
    every_steps: int = Field(0, ge=0, le=1_000_000)
    """Evaluate on dataset.eval every N steps and after the last step; 0 disables evaluation."""
    max_tasks: int = Field(64, ge=1, le=100000)
    """Evaluation tasks per round (the first ones of dataset.eval, the same every round)."""
    samples_per_prompt: int = Field(1, ge=1, le=64)
    """Samples per evaluation task (k of eval_pass_at_k)."""
    temperature: float = Field(1.0, ge=0, le=4)
    """Sampling temperature for evaluation; 0 decodes greedily."""
    at_start: bool = True
    """Measure the baseline before the first training step (step 0 in the metrics, status.evaluation.baseline)."""
    pass_reward: float = 1.0
    """A task passes (eval_pass_at_k) when one of its samples scores at least this."""
    keep_best: bool = True
    """Keep the checkpoint of the best evaluation (status.evaluation.bestCheckpoint) beyond checkpoint.keepLast; a checkpoint is written at every evaluation that beats the best."""
    stop_when: Optional[StopWhen] = None
    """Stop training early on a target score or a plateau; status.message and status.evaluation.stopReason say which."""


# ---------------------------------------------------------------- network
Cidr = Annotated[str, StringConstraints(min_length=3, max_length=64, pattern=r"^[0-9a-fA-F:.]+/[0-9]{1,3}$")]


class EgressPort(ApiModel):
    port: int = Field(ge=1, le=65535)
    """Destination port."""
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"
    """Transport protocol."""


def _is_network(v: str) -> bool:
    try:
        ipaddress.ip_network(v, strict=True)
    except ValueError:
        return False
    return True


@rules(Rule(
    cel="isCIDR(self.cidr) && cidr(self.cidr) == cidr(self.cidr).masked()",
    message="network.rolloutEgress[].cidr must be a network in CIDR notation with its host bits zero "
            "(e.g. 203.0.113.0/24, or 203.0.113.10/32 for one address)",
    field=".cidr",
    check=lambda r: _is_network(r.cidr),
))
class EgressRule(ApiModel):
    cidr: Cidr
    """Destination network in CIDR notation, its host bits zero (e.g. 203.0.113.10/32 for one address)."""
    ports: list[EgressPort] = Field(min_length=1, max_length=16)
    """Destination ports (at least one: an allow-list names its ports)."""


@rules(Rule(
    cel="self.policies || size(self.rolloutEgress) == 0",
    message="network.rolloutEgress needs network.policies: without the job's NetworkPolicies nothing limits egress "
            "(drop rolloutEgress, or enable policies)",
    field=".rolloutEgress",
    check=lambda n: n.policies or not n.rollout_egress,
))
class NetworkSpec(ApiModel):
    policies: bool = True
    """Create the job's NetworkPolicies: inference, reward and coordinator accept connections only from the job's own pods, and rollout pods reach only the job's services, DNS and rolloutEgress. Set false only where the cluster's network plugin does not enforce NetworkPolicies (there they would isolate nothing); the job token still guards every data-plane route."""
    rollout_egress: list[EgressRule] = Field(default_factory=list, max_length=64)
    """Destinations rollout pods may reach besides the job's services and DNS (an external LLM judge or tool API scored in the rollout pods, say). Everything else is refused."""


# ---------------------------------------------------------------- the job
def _group_ok(s: "RFTJobSpec") -> bool:
    return s.trainer.algorithm not in GROUP_RELATIVE_ALGORITHMS or s.rollout.samples_per_prompt >= 2


# ---------------------------------------------------------------- experiment tracking
TrackingUrl = Annotated[str, StringConstraints(min_length=8, max_length=2048, pattern=r"^https?://[^\s/?#]+[^\s]*$")]


class MlflowTracking(ApiModel):
    uri: TrackingUrl
    """Base URL of an MLflow tracking server (http or https). Credentials are read as MLflow's own client reads them, from the trainer's environment: set MLFLOW_TRACKING_TOKEN (bearer) or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD in trainer.env by secretKeyRef."""
    experiment: Optional[Annotated[str, StringConstraints(min_length=1, max_length=256)]] = None
    """Experiment name, created when missing; default: <namespace>/<job name>."""


class WandbTracking(ApiModel):
    project: Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[^/\\#?%:]+$")]
    """W&B project name."""
    entity: Optional[Annotated[str, StringConstraints(min_length=1, max_length=128)]] = None
    """W&B entity (team or user) the run belongs to when it is synced."""
    mode: Literal["offline"] = "offline"
    """offline: the run is written on the checkpoint volume (tracking/wandb/), one run across trainer restarts; upload it with `wandb sync`. (Online logging is not offered yet.)"""


class SamplesSpec(ApiModel):
    every_steps: int = Field(1, ge=0, le=1_000_000)
    """Write a few sampled completions every N training steps (and the first and last steps); 0 writes none."""
    per_step: int = Field(4, ge=1, le=64)
    """Prompts written per step, each with its sampled completions, rewards and the evaluator's reason."""
    max_chars: int = Field(2000, ge=100, le=100_000)
    """Texts longer than this are cut in the middle (a marker says how much); secrets the trainer holds are masked."""


class TrackingSpec(ApiModel):
    samples: SamplesSpec = Field(default_factory=SamplesSpec)
    """Sampled completions where people look: samples/step-NNNNNN.jsonl on the checkpoint volume, TensorBoard text, an MLflow artifact, a W&B table, and `kubectl rft samples JOB`."""
    wandb: Optional[WandbTracking] = None
    """Also write the run as a Weights & Biases offline run: the spec as its config and every step's metrics (the reward curve included). Failures are counted (tracking_errors) and warned once; training goes on."""
    mlflow: Optional[MlflowTracking] = None
    """Also log the run to MLflow: one run per job (kept across trainer restarts) with the spec as parameters and every step's metrics (the reward curve included). A tracker that cannot be reached never stops training: its failures are counted (tracking_errors) and warned once. TensorBoard event files and metrics.jsonl are always written on the checkpoint volume."""


def _has_reward_role(s: "RFTJobSpec") -> bool:
    return s.evaluator.remote or any(e.builtin in REMOTE_EVALUATORS for e in s.evaluator.entries())


_REMOTE_CEL = str(list(REMOTE_EVALUATORS))
_REWARD_ROLE_CEL = (f"!has(self.reward) || self.evaluator.remote || (has(self.evaluator.builtin) && "
                    f"self.evaluator.builtin in {_REMOTE_CEL}) || (has(self.evaluator.evaluators) && "
                    f"self.evaluator.evaluators.exists(e, has(e.builtin) && e.builtin in {_REMOTE_CEL}))")


# ---------------------------------------------------------------- storage and output
Endpoint = Annotated[str, StringConstraints(min_length=8, max_length=2048, pattern=r"^https?://[^\s/?#@]+(/[^\s?#]*)?$")]


@rules(Rule(
    cel="has(self.accessKeyIdSecretRef) == has(self.secretAccessKeySecretRef)",
    message="storage.s3: set both accessKeyIdSecretRef and secretAccessKeySecretRef, or neither (anonymous access)",
    field=".accessKeyIdSecretRef",
    check=lambda s: (s.access_key_id_secret_ref is None) == (s.secret_access_key_secret_ref is None),
))
class S3Storage(ApiModel):
    endpoint: Optional[Endpoint] = None
    """The S3-compatible endpoint (`https://s3.eu-west-1.amazonaws.com`, a MinIO or SeaweedFS URL); AWS's regional endpoint when unset."""
    region: Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z0-9-]+$")] = "us-east-1"
    """The region requests are signed for."""
    path_style: bool = True
    """Address buckets as `<endpoint>/<bucket>` (what most S3-compatible stores need) instead of `<bucket>.<endpoint>`."""
    access_key_id_secret_ref: Optional[SecretKeySelector] = None
    """The access key id, from a Secret (never written into the spec, the status, logs or errors)."""
    secret_access_key_secret_ref: Optional[SecretKeySelector] = None
    """The secret access key, from a Secret."""


class HuggingFaceStorage(ApiModel):
    endpoint: Optional[Endpoint] = None
    """The hub's address (`HF_ENDPOINT`): a mirror or a self-hosted hub; https://huggingface.co when unset."""
    token_secret_ref: Optional[SecretKeySelector] = None
    """A Hugging Face access token, from a Secret (private or gated repositories, and pushing `output`)."""


class StorageSpec(ApiModel):
    s3: Optional[S3Storage] = None
    """Where `s3://` URIs are read and written, and with which credentials."""
    hugging_face: Optional[HuggingFaceStorage] = None
    """Where `hf://` URIs are read and written, and with which token."""


@rules(Rule(
    cel="self.uri.matches('^(hf|s3)://')",
    message="output.uri must be s3://BUCKET/PREFIX or hf://ORG/NAME[@BRANCH]",
    field=".uri",
    check=lambda o: uri_problem(o.uri, allowed=("hf", "s3"), repo_type="model") is None,
    explain=lambda o: uri_problem(o.uri, allowed=("hf", "s3"), repo_type="model") or "",
))
class OutputSpec(ApiModel):
    uri: PathStr
    """Where the trained model goes: `s3://BUCKET/PREFIX` (the final model's files under `PREFIX/final/`) or `hf://ORG/NAME[@BRANCH]` (a model repository, created when missing; the branch too). Pushed when training ends, with retries; an interrupted push resumes, skipping the files already there. The model stays on the checkpoint volume whatever happens to the push; status.output says where it went."""
    private: bool = True
    """A repository the push creates on the hub is private."""


@rules(Rule(
    cel="!(self.trainer.algorithm in ['" + "', '".join(GROUP_RELATIVE_ALGORITHMS) + "']) || self.rollout.samplesPerPrompt >= 2",
    message="rollout.samplesPerPrompt must be at least 2 for group-relative algorithms",
    field=".rollout.samplesPerPrompt",
    check=_group_ok,
), Rule(
    cel="!has(self.trainer.overlong) || self.trainer.overlong.bufferTokens < self.rollout.maxTokens",
    message="trainer.overlong.bufferTokens must be shorter than rollout.maxTokens",
    field=".trainer.overlong.bufferTokens",
    check=lambda s: s.trainer.overlong is None or s.trainer.overlong.buffer_tokens < s.rollout.max_tokens,
), Rule(
    cel="!has(self.evaluation) || self.evaluation.everySteps == 0 || has(self.dataset.eval)",
    message="evaluation.everySteps > 0 needs dataset.eval",
    field=".evaluation.everySteps",
    check=lambda s: s.evaluation is None or s.evaluation.every_steps == 0 or s.dataset.eval is not None,
), Rule(
    cel="!has(self.evaluation) || !has(self.evaluation.stopWhen) || self.evaluation.everySteps > 0",
    message="evaluation.stopWhen needs evaluation.everySteps > 0 (it acts on evaluations)",
    field=".evaluation.stopWhen",
    check=lambda s: s.evaluation is None or s.evaluation.stop_when is None or s.evaluation.every_steps > 0,
), Rule(
    cel="!has(self.model.lora) || self.inference.weightSync != 'disk' || self.inference.engine == 'builtin'",
    message="with model.lora on vllm, inference.weightSync must be lora (or none)",
    field=".inference.weightSync",
    check=lambda s: s.model.lora is None or s.inference.weight_sync != "disk" or s.inference.engine == "builtin",
), Rule(
    cel="self.inference.engine != 'vllm' || !has(self.model.lora) || self.model.lora.rank <= "
        + str(VLLM_MAX_LORA_RANK),
    message=f"model.lora.rank must be at most {VLLM_MAX_LORA_RANK} with engine vllm (its largest LoRA rank)",
    field=".model.lora.rank",
    check=lambda s: s.inference.engine != "vllm" or s.model.lora is None or s.model.lora.rank <= VLLM_MAX_LORA_RANK,
), Rule(
    cel="!has(self.trainer.importanceSampling) || self.trainer.oldLogprobs == 'recompute'",
    message="trainer.importanceSampling corrects the trainer/inference mismatch of recomputed log-probs; with "
            "trainer.oldLogprobs: inference there is no mismatch to correct (drop importanceSampling, or use "
            "oldLogprobs: recompute)",
    field=".trainer.importanceSampling",
    check=lambda s: s.trainer.importance_sampling is None or s.trainer.old_logprobs == "recompute",
), Rule(
    cel="!has(self.model.lora) || !has(self.model.warmStartFrom)",
    message="model.warmStartFrom cannot be combined with model.lora: inference applies the adapters to "
            "model.base, not to the warm start (save the warm start as a model directory and name it in "
            "model.base)",
    field=".model.warmStartFrom",
    check=lambda s: s.model.lora is None or s.model.warm_start_from is None,
), Rule(
    cel="has(self.model.lora) || self.inference.weightSync != 'lora'",
    message="inference.weightSync lora needs model.lora",
    field=".inference.weightSync",
    check=lambda s: s.model.lora is not None or s.inference.weight_sync != "lora",
), Rule(
    cel="!self.checkpoint.mergeFinalAdapter || has(self.model.lora)",
    message="checkpoint.mergeFinalAdapter needs model.lora (without LoRA the final model is already a full model)",
    field=".checkpoint.mergeFinalAdapter",
    check=lambda s: not s.checkpoint.merge_final_adapter or s.model.lora is not None,
), Rule(
    cel=_REWARD_ROLE_CEL,
    message="spec.reward configures the reward role, which a job has only with evaluator.remote, a code_sandbox or "
            "an llm_judge evaluator (without them scoring happens in the rollout pods: see rollout.pod)",
    field=".reward",
    check=lambda s: s.reward is None or _has_reward_role(s),
), Rule(
    cel="self.trainer.nodes <= 1 || self.checkpoint.accessMode != 'ReadWriteOnce'",
    message="checkpoint.accessMode ReadWriteOnce cannot serve trainer.nodes > 1 (a ReadWriteOnce volume is "
            "mounted by one node): use ReadWriteMany (or Auto)",
    field=".checkpoint.accessMode",
    check=lambda s: s.trainer.nodes <= 1 or s.checkpoint.access_mode != "ReadWriteOnce",
), Rule(
    cel="!has(self.checkpoint.existingClaim) || self.trainer.nodes <= 1 || self.checkpoint.accessMode == 'ReadWriteMany'",
    message="trainer.nodes > 1 needs a ReadWriteMany checkpoint claim: with checkpoint.existingClaim, declare it "
            "with checkpoint.accessMode: ReadWriteMany (a ReadWriteOnce claim cannot be shared by several nodes)",
    field=".checkpoint.existingClaim",
    check=lambda s: s.checkpoint.existing_claim is None or s.trainer.nodes <= 1
    or s.checkpoint.access_mode == "ReadWriteMany",
))
class RFTJobSpec(ApiModel):
    model: ModelSpec
    """The policy to fine-tune."""
    dataset: DatasetSpec
    """Training (and evaluation) tasks."""
    evaluator: EvaluatorSpec
    """How samples are scored (the reward), and optionally how a task is rolled out."""
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    """Sampling."""
    inference: InferenceSpec = Field(default_factory=InferenceSpec)
    """The inference engine."""
    reward: Optional[RewardSpec] = None
    """Replicas and pods of the reward role (only for a job that has one: evaluator.remote, a code_sandbox or an llm_judge evaluator)."""
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)
    """The learner."""
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    """Checkpoints and their storage."""
    evaluation: Optional[EvaluationSpec] = None
    """Periodic evaluation on held-out tasks."""
    network: NetworkSpec = Field(default_factory=NetworkSpec)
    """The job's network isolation (NetworkPolicies)."""
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    """Experiment trackers the trainer also logs to."""
    storage: Optional[StorageSpec] = None
    """Object storage and model hub settings (endpoints, credentials) for the job's `s3://` and `hf://` URIs."""
    output: Optional[OutputSpec] = None
    """Push the trained model (and optionally every checkpoint) to object storage or a model hub."""
    suspend: bool = False
    """Suspend: role workloads are removed, the checkpoint volume stays; false resumes from the latest checkpoint."""
    active_deadline_seconds: Optional[int] = Field(None, ge=1, le=31_536_000)
    """The job fails with reason DeadlineExceeded after this many seconds of running since it started or was last resumed (as a Kubernetes Job's deadline: the clock restarts on resume, and suspended time never counts)."""
    restart_limit: int = Field(3, ge=0, le=1000)
    """Trainer restarts allowed (each resumes from the latest checkpoint) before the job fails."""
    runtime_image: Optional[Image] = None
    """Image for the roles that do not name their own. Unset: the operator's configured runtime image (chart value `images.runtime`)."""
    default_resources: Resources = Field(default_factory=lambda: Resources(requests=dict(DEFAULT_REQUESTS)))
    """Completes the resources of every container of the job's pods: each request here that a container names neither as a request nor as a limit (Kubernetes takes a missing request from its limit), and each limit here it does not name. Init containers have no resources of their own; inference and trainer keep theirs, rollout and reward pods theirs from rollout.pod and reward.pod. Every pod then has requests, so a namespace with a ResourceQuota admits it."""
    service_account_name: Optional[Name] = None
    """Extra ServiceAccount for rollout and reward pods (they get none with API access by default)."""
