"""The fetch Job: the job's hf:// and s3:// models and datasets, downloaded once into the checkpoint
claim (``<checkpoints>/inputs/``) before any role starts (``rft fetch``).

A Job rather than an init container of every role: the inputs are fetched once however many replicas
and restarts follow, a failure is the Job's (with its own retries) and never spends the trainer's
restart budget, and the roles start only when it completed (``policies.inputs``). Its name carries a
hash of what it fetches, so a spec naming other inputs gets a new Job (the claim keeps what the old
one fetched; ``rft fetch`` skips a complete copy).

- ``backoffLimit`` 3: an unreachable store or a 5xx is retried; ``rft fetch`` exits 2 when retrying
  cannot help (401, 403, not found, not a model, a dataset row that does not validate), which fails
  the Job at once (``podFailurePolicy``). The container's termination message is ``rft fetch``'s
  summary or error (never a credential: those reach it by secretKeyRef env only).
- Resources: the trainer's CPU and memory (it validates every dataset row, as the trainer does), no
  GPU; what they leave out, ``spec.defaultResources``.
- Placement: the trainer's pod overrides (``trainer.pod``: node selector, tolerations, affinity,
  priority, pull secrets, ...) but its ``shmSizeLimit``: the claim is first used where the trainer runs.
- Credentials: ``spec.storage``'s secretKeyRefs as ``RFT_S3_ACCESS_KEY_ID``, ``RFT_S3_SECRET_ACCESS_KEY``
  and ``RFT_HF_TOKEN``; the hub endpoint as ``HF_ENDPOINT``; downloads allowed (``HF_HUB_OFFLINE=0``).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Optional

from rft_api import layout
from rft_api.job import RFTJob
from rft_api.layout import CONFIG_PATH
from rft_api.spec import StorageSpec

from .. import names
from .common import (
    BuildContext,
    base_env,
    checkpoint_mount,
    checkpoint_volume,
    config_mount,
    config_volume,
    container_security_context,
    env_var,
    metadata,
    pod_spec,
    resources,
    scratch_mounts,
    scratch_volumes,
    secret_env,
    with_pod_overrides,
)

Obj = dict[str, Any]
ROLE = "fetch"
TERMINAL_EXIT_CODE = 2
BACKOFF_LIMIT = 3


def storage_env(storage: Optional[StorageSpec]) -> list[Obj]:
    """The store credentials (by secretKeyRef) and the hub endpoint, for pods that fetch or push."""
    env: list[Obj] = []
    if storage is None:
        return env
    s3, hub = storage.s3, storage.hugging_face
    if s3 is not None and s3.access_key_id_secret_ref is not None and s3.secret_access_key_secret_ref is not None:
        env.append(secret_env(layout.S3_ACCESS_KEY_ENV, s3.access_key_id_secret_ref.name, s3.access_key_id_secret_ref.key))
        env.append(secret_env(layout.S3_SECRET_KEY_ENV, s3.secret_access_key_secret_ref.name,
                              s3.secret_access_key_secret_ref.key))
    if hub is not None and hub.token_secret_ref is not None:
        env.append(secret_env(layout.HF_TOKEN_ENV, hub.token_secret_ref.name, hub.token_secret_ref.key))
    if hub is not None and hub.endpoint:
        env.append(env_var("HF_ENDPOINT", hub.endpoint))
    return env


def _cpu_and_memory(job: RFTJob) -> Obj:
    """The trainer's CPU and memory (requests and limits), none of its accelerators: the fetch reads
    every dataset row once to validate it, as the trainer does at start, and needs no GPU."""
    out: Obj = {}
    for kind, values in resources(job.spec.trainer.resources).items():
        kept = {k: v for k, v in values.items() if k in ("cpu", "memory", "ephemeral-storage")}
        if kept:
            out[kind] = kept
    return out


def job_for(job: RFTJob, ctx: BuildContext) -> Optional[Obj]:
    """The fetch Job, or None when the job has nothing to fetch. Its name ends with a hash of its spec
    and of the URIs it fetches (a Job's template is immutable, and a completed Job fetched those URIs:
    other ones are another Job)."""
    inputs = layout.inputs(job.spec, layout.inputs_dir())
    if not inputs:
        return None
    env = [e for e in base_env(job) if e["name"] != "HF_HUB_OFFLINE"] + [env_var("HF_HUB_OFFLINE", "0")]
    container: Obj = {
        "name": ROLE, "image": ctx.runtime_image_of(job),
        "command": ["rft", "fetch", "--config", CONFIG_PATH],
        "env": env + storage_env(job.spec.storage),
        "volumeMounts": [config_mount(), checkpoint_mount(read_only=False), *scratch_mounts()],
        "securityContext": container_security_context(read_only_root=True),
    }
    res = _cpu_and_memory(job)
    if res:
        container["resources"] = res
    pod = pod_spec([container], [config_volume(job), checkpoint_volume(job), *scratch_volumes()],
                   automount_token=False, restart_policy="Never")
    spec: Obj = {
        "backoffLimit": BACKOFF_LIMIT,
        "podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": ROLE, "operator": "In",
                                                  "values": [TERMINAL_EXIT_CODE]}},
        ]},
            "template": {"metadata": {"labels": names.labels(job.name, ROLE)}, "spec": pod},
    }
    # placed as the trainer (its nodes, taints, registry credentials, priority; not its shared memory)
    placed = job.spec.trainer.pod and job.spec.trainer.pod.model_copy(update={"shm_size_limit": None})
    spec = with_pod_overrides({"spec": spec}, placed)["spec"]
    what = {"inputs": [i.uri for i in inputs], "spec": spec}
    digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:8]
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata(job, names.fetch_prefix(job.name) + digest, ROLE),
            "spec": spec}
