"""The inference role: a Deployment serving the policy (builtin or vLLM) and its Service.

Every engine serves the policy under the job's name (``--served-model-name <job>``), on
``spec.inference.port``, with ``/health`` as readiness probe, and mounts the checkpoint claim
read-only at ``/checkpoints`` to load the weights the trainer publishes there. Two Services: the
ClusterIP one rollouts send requests to, and the headless ``<job>-inference-pods`` that resolves to
every ready replica (the trainer publishes each version to each of them). A replica that starts loads
the current policy version before it answers ``/health``.

- builtin: ``rft serve`` in the runtime image with the spec's ``model.dtype`` and
  ``inference.maxModelLen`` (weight reload: ``/update_weights_from_disk``, ``--weights-dir``).
- vllm: ``python -m vllm.entrypoints.openai.api_server`` on the pod's loopback (port
  :data:`VLLM_LOOPBACK_PORT`) with ``--logprobs-mode processed_logprobs`` (logprobs after temperature, as
  the trainer computes them), behind the gate (``rft gate``, container ``gate`` from the runtime image,
  ``rft_runtime.gate``): the only way in, on ``inference.port``; it requires the job token on every route
  but ``/health`` and ``/metrics`` and forwards only the OpenAI API, ``/tokenize``, ``/detokenize`` and
  ``/version``. The job token also reaches vLLM as ``VLLM_API_KEY`` (its ``--api-key``, from the
  environment so the token is on no command line).
  weightSync=disk (full weights): vLLM's development routes on loopback (``VLLM_SERVER_DEV_MODE``) and the
  gate's worker extension (``--worker-extension-cls``, copied onto vLLM's ``PYTHONPATH`` by init container
  ``vllm-extension``); the gate takes the trainer's ``/update_weights_from_disk`` and reloads vLLM's weights
  in place (``--weights-dir``). weightSync=lora adds ``--enable-lora`` (rank rounded up to one vLLM
  accepts; as many adapters as policy versions are served at once) and runtime adapter loading
  (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``): the trainer loads each policy version as adapter
  ``<job>-v<version>`` (see ``rft_runtime.adapters``). vLLM's liveness probe asks the gate
  (``/health?probe=liveness``): a reload vLLM failed part-way leaves weights only a restart repairs.

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
from rft_api.spec import gpu_count

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
VLLM_LOOPBACK_PORT = 18000
"""vLLM's port on the pod's loopback, behind the gate (the next one when ``inference.port`` is this one)."""
VLLM_EXTENSION_DIR = "/opt/rft-vllm"
VLLM_WORKER_EXTENSION = "rft_vllm_worker.RFTWorkerExtension"
"""The gate's worker extension (``rft_runtime.gate.extension.WORKER_EXTENSION_CLS``), installed by
``rft gate --install-vllm-extension`` into :data:`VLLM_EXTENSION_DIR`."""
GATE_CONTAINER = "gate"
GATE_RESOURCES = {"requests": {"cpu": "50m", "memory": "128Mi"}}


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
               "--served-model-name", job.name, "--host", "127.0.0.1", "--port", str(vllm_loopback_port(job)),
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
        if inf.weight_sync == "disk":
            cmd += ["--worker-extension-cls", VLLM_WORKER_EXTENSION]
        cmd += vllm_options(job)
    return cmd + list(inf.extra_args)


def vllm_options(job: RFTJob) -> list[str]:
    """``inference.vllm`` as vLLM's options; the tensor parallel size defaults to the replica's GPUs."""
    inf = job.spec.inference
    v = inf.vllm
    tp = (v.tensor_parallel_size if v is not None else None) or gpu_count(inf.resources)
    out = ["--tensor-parallel-size", str(tp)] if tp > 1 else []
    if v is None:
        return out
    if v.gpu_memory_utilization is not None:
        out += ["--gpu-memory-utilization", str(v.gpu_memory_utilization)]
    if v.max_num_seqs is not None:
        out += ["--max-num-seqs", str(v.max_num_seqs)]
    if v.enable_prefix_caching is not None:
        out.append("--enable-prefix-caching" if v.enable_prefix_caching else "--no-enable-prefix-caching")
    return out


def vllm_loopback_port(job: RFTJob) -> int:
    """Where vLLM listens on the pod's loopback, behind the gate."""
    return VLLM_LOOPBACK_PORT + (job.spec.inference.port == VLLM_LOOPBACK_PORT)


def gate_command(job: RFTJob) -> list[str]:
    """The gate's command line: the inference port, vLLM on loopback, and the published weights when
    it loads full policy versions."""
    inf = job.spec.inference
    cmd = ["rft", "gate", "--host", BIND_HOST, "--port", str(inf.port),
           "--upstream", f"http://127.0.0.1:{vllm_loopback_port(job)}"]
    if inf.weight_sync == "disk":
        cmd += ["--weights-dir", published_weights_dir(CHECKPOINT_DIR)]
    return cmd


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
        if inf.weight_sync == "disk":
            # the reload routes the gate calls on loopback (it forwards none of them)
            out += [env_var("VLLM_SERVER_DEV_MODE", "1"), env_var("PYTHONPATH", VLLM_EXTENSION_DIR)]
    return out


def _init_containers(job: RFTJob, ctx: BuildContext, mounts: list[Obj]) -> list[Obj]:
    spec = job.spec
    if spec.inference.engine == "builtin":
        return []
    out = []
    if spec.model.base.startswith("builtin:"):
        out.append({
            "name": "export-model", "image": ctx.runtime_image_of(job),
            "command": ["rft", "model", "export", "--model", spec.model.base, "--out", exported_model_path(spec)],
            "env": base_env(job), "volumeMounts": mounts,
            "securityContext": container_security_context(read_only_root=True),
        })
    if spec.inference.weight_sync == "disk":
        out.append({
            "name": "vllm-extension", "image": ctx.runtime_image_of(job),
            "command": ["rft", "gate", "--install-vllm-extension", VLLM_EXTENSION_DIR],
            "volumeMounts": [_extension_mount()],
            "securityContext": container_security_context(read_only_root=True),
        })
    return out


def _extension_mount() -> Obj:
    return {"name": "vllm-extension", "mountPath": VLLM_EXTENSION_DIR}


def _gate_container(job: RFTJob, ctx: BuildContext) -> Obj:
    """The gate in front of vLLM (``rft gate``): the pod's port and probes are its."""
    inf = job.spec.inference
    mounts = [checkpoint_mount(read_only=True), *scratch_mounts()] if inf.weight_sync == "disk" else scratch_mounts()
    return {
        "name": GATE_CONTAINER, "image": ctx.runtime_image_of(job), "command": gate_command(job),
        "ports": [{"name": "http", "containerPort": inf.port, "protocol": "TCP"}],
        "env": base_env(job), "volumeMounts": mounts, "resources": GATE_RESOURCES,
        "readinessProbe": http_probe("/health", inf.port),
        "startupProbe": http_probe("/health", inf.port, STARTUP_PERIOD_S, STARTUP_FAILURES),
        "securityContext": container_security_context(read_only_root=True),
    }


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
    init_containers = _init_containers(job, ctx, list(mounts))
    if inf.engine != "builtin" and inf.weight_sync == "disk":
        volumes.append({"name": "vllm-extension", "emptyDir": {"sizeLimit": "1Mi"}})
        mounts.append(_extension_mount())
    builtin = inf.engine == "builtin"  # else the gate holds the port and answers the probes
    container: Obj = {
        "name": ROLE, "image": image(job, ctx), "command": command(job),
        **({"ports": [{"name": "http", "containerPort": inf.port, "protocol": "TCP"}]} if builtin else {}),
        "env": base_env(job) + _engine_env(job) + user_env(inf.env),
        "volumeMounts": mounts,
        **({"readinessProbe": http_probe("/health", inf.port),
            "startupProbe": http_probe("/health", inf.port, STARTUP_PERIOD_S, STARTUP_FAILURES)} if builtin else
           # the gate says when vLLM failed a reload part-way and only a restart repairs its weights
           {"livenessProbe": http_probe("/health?probe=liveness", inf.port, 10, 3)}),
        "securityContext": container_security_context(read_only_root=builtin),
    }
    res = resources(inf.resources)
    if res:
        container["resources"] = res
    containers = [container] if inf.engine == "builtin" else [container, _gate_container(job, ctx)]
    pod = pod_spec(containers, volumes, init_containers=init_containers, automount_token=False)
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
