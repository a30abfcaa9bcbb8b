"""The inference role: a Deployment serving the policy (builtin or vLLM) and its Service.

Every engine serves the policy under the job's name (``--served-model-name <job>``), on
``spec.inference.port``, with ``/health`` as readiness probe, and mounts the checkpoint claim
read-only at ``/checkpoints`` to load the weights the trainer publishes there. Two Services: the
ClusterIP one rollouts send requests to, and the headless ``<job>-inference-pods`` that resolves to
every ready replica (the trainer publishes each version to each of them). A builtin replica that
starts loads the current policy version (``--weights-dir``) before it answers ``/health``.

- builtin: ``rft serve`` in the runtime image with the spec's ``model.dtype`` and
  ``inference.maxModelLen`` (weight reload: ``/update_weights_from_disk``).
- vllm: ``python -m vllm.entrypoints.openai.api_server`` with ``--logprobs-mode processed_logprobs``
  (logprobs after temperature, as the trainer computes them). weightSync=lora adds ``--enable-lora``
  (rank rounded up to one vLLM accepts; as many adapters as policy versions are served at once) and
  runtime adapter loading (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``): the trainer loads each policy
  version as adapter ``<job>-v<version>`` (see ``rft_runtime.adapters``). weightSync=disk is refused
  by validation for vLLM. The job token reaches vLLM as ``VLLM_API_KEY`` (its ``--api-key``, read
  from the environment so the token is on no command line): every ``/v1`` route requires it.

vLLM needs a model directory: for a ``builtin:`` model an init container running the
runtime image exports it (``rft model export``) into the pod's cache. Its root filesystem stays
writable (it writes caches outside ``$HOME``); the runtime image's is read-only.
"""
from __future__ import annotations

from typing import Any

from rft_api.constants import VLLM_LORA_RANKS
from rft_api.job import RFTJob
from rft_api.layout import (
    CHAT_TEMPLATE_KEY,
    CHECKPOINT_DIR,
    CONFIG_DIR,
    exported_model_path,
    model_path,
    published_weights_dir,
    tokenizer_path,
)

from .. import names
from .common import (
    BIND_HOST,
    BuildContext,
    base_env,
    checkpoint_mount,
    checkpoint_volume,
    claim_volumes,
    config_mount,
    config_volume,
    container_security_context,
    deployment,
    env_var,
    http_probe,
    input_volumes,
    pod_spec,
    resources,
    scratch_mounts,
    scratch_volumes,
    service,
    token_env,
    user_env,
    with_pod_overrides,
)

Obj = dict[str, Any]
ROLE = "inference"
STARTUP_PERIOD_S = 5
STARTUP_FAILURES = 120  # up to 10 minutes to load a model
VLLM_API_KEY_ENV = "VLLM_API_KEY"  # what vLLM reads when --api-key is not given


def image(job: RFTJob, ctx: BuildContext) -> str:
    inf = job.spec.inference
    if inf.image:
        return inf.image
    return {"builtin": ctx.runtime_image_of(job), "vllm": ctx.vllm_image}[inf.engine]


def command(job: RFTJob) -> list[str]:
    """The engine's command line."""
    spec, inf = job.spec, job.spec.inference
    port = str(inf.port)
    lora = spec.model.lora if inf.weight_sync == "lora" else None
    tok = tokenizer_path(spec)
    template = f"{CONFIG_DIR}/{CHAT_TEMPLATE_KEY}" if spec.model.chat_template else None
    if inf.engine == "builtin":
        cmd = ["rft", "serve", "--model", model_path(spec), "--host", BIND_HOST, "--port", port,
               "--served-model-name", job.name, "--dtype", spec.model.dtype]
        if inf.max_model_len is not None:
            cmd += ["--max-model-len", str(inf.max_model_len)]
        if inf.weight_sync != "none":
            cmd += ["--weights-dir", published_weights_dir(CHECKPOINT_DIR)]
    elif inf.engine == "vllm":
        cmd = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", exported_model_path(spec),
               "--served-model-name", job.name, "--host", BIND_HOST, "--port", port,
               "--logprobs-mode", "processed_logprobs"]
        if inf.max_model_len is not None:
            cmd += ["--max-model-len", str(inf.max_model_len)]
        if spec.model.dtype != "auto":
            cmd += ["--dtype", spec.model.dtype]
        if tok:
            cmd += ["--tokenizer", tok]
        if template:
            cmd += ["--chat-template", template]
        if lora is not None:
            loras = str(spec.rollout.policy_versions_served())
            cmd += ["--enable-lora", "--max-lora-rank", str(vllm_lora_rank(lora.rank)), "--max-loras", loras,
                    "--max-cpu-loras", loras]
    return cmd + list(inf.extra_args)


def vllm_lora_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that fits ``rank`` (validation bounds ``rank``)."""
    return next(r for r in VLLM_LORA_RANKS if r >= rank)


def _engine_env(job: RFTJob) -> list[Obj]:
    inf = job.spec.inference
    out = []
    if inf.engine == "vllm":
        # vLLM's --api-key, from the environment: the job token guards its /v1 routes (generation,
        # models, adapter loading) and never appears on a command line (ps, /proc/<pid>/cmdline)
        out.append(token_env(job, VLLM_API_KEY_ENV))
        if inf.weight_sync == "lora":
            out.append(env_var("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True"))
    return out


def _init_containers(job: RFTJob, ctx: BuildContext, mounts: list[Obj]) -> list[Obj]:
    spec = job.spec
    if spec.inference.engine == "builtin" or not spec.model.base.startswith("builtin:"):
        return []
    return [{
        "name": "export-model", "image": ctx.runtime_image_of(job),
        "command": ["rft", "model", "export", "--model", spec.model.base, "--out", exported_model_path(spec)],
        "env": base_env(job), "volumeMounts": mounts,
        "securityContext": container_security_context(read_only_root=True),
    }]


def deployment_for(job: RFTJob, ctx: BuildContext) -> Obj:
    """The inference Deployment."""
    spec, inf = job.spec, job.spec.inference
    data_vols, data_mounts = claim_volumes([spec.model.volume], "model")
    uri_vols, uri_mounts = input_volumes(job, inputs=False)  # the checkpoint claim is mounted whole
    volumes = [config_volume(job), checkpoint_volume(job), *scratch_volumes(), *data_vols, *uri_vols]
    mounts = [config_mount(), checkpoint_mount(read_only=True), *scratch_mounts(), *data_mounts, *uri_mounts]
    if inf.engine != "builtin":
        volumes.append({"name": "shm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
    container: Obj = {
        "name": ROLE, "image": image(job, ctx), "command": command(job),
        "ports": [{"name": "http", "containerPort": inf.port, "protocol": "TCP"}],
        "env": base_env(job) + _engine_env(job) + user_env(inf.env),
        "volumeMounts": mounts,
        "readinessProbe": http_probe("/health", inf.port),
        "startupProbe": http_probe("/health", inf.port, STARTUP_PERIOD_S, STARTUP_FAILURES),
        "securityContext": container_security_context(read_only_root=inf.engine == "builtin"),
    }
    res = resources(inf.resources)
    if res:
        container["resources"] = res
    pod = pod_spec([container], volumes, init_containers=_init_containers(job, ctx, mounts), automount_token=False)
    return with_pod_overrides(deployment(job, names.inference(job.name), ROLE, inf.replicas, pod), inf.pod)


def service_for(job: RFTJob, ctx: BuildContext) -> Obj:
    """The inference Service (``http://<job>-inference.<ns>.svc:<port>``): rollouts' requests, spread
    over the ready replicas."""
    return service(job, names.inference(job.name), ROLE, job.spec.inference.port, "http")


def pods_service_for(job: RFTJob, ctx: BuildContext) -> Obj:
    """The headless Service ``<job>-inference-pods`` (ready pods only): its DNS name resolves to every
    ready inference replica, to which the trainer publishes each policy version (docs/scale-out.md)."""
    return service(job, names.inference_pods(job.name), ROLE, job.spec.inference.port, "http",
                   headless=True, not_ready=False)
