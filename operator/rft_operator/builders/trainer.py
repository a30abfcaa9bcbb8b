"""The trainer role: an Indexed Job (``rft trainer``) and the headless coordinator Service.

- ``backoffLimit: 0``: the operator owns the restart budget (``policies.failure``); each attempt is
  a new Job annotated with ``rft.dev/trainer-attempt`` and the pods get ``RFT_TRAINER_ATTEMPT``.
- ``podFailurePolicy``: a pod with the ``DisruptionTarget`` condition (evicted, preempted, its node
  drained) is ignored: the Job controller recreates it without counting it against ``backoffLimit``
  (:data:`IGNORE_DISRUPTION`, the first rule: the first rule that matches a failed pod applies, so a
  disrupted pod's exit status is never a verdict; a real one comes again from the recreated pod).
  Exit status 2 (``TERMINAL_EXIT_CODE``: an invalid config, a checkpoint this
  run cannot resume) fails the Job at once with reason ``PodFailurePolicy``, which the failure policy
  treats as terminal (any other failure is a restart, counted; with several nodes, the other ranks'
  failure after a disruption is not: ``policies.failure``). ``FallbackToLogsOnError`` makes the
  last log lines the container's termination message (the reason the operator reports).
- ``parallelism = completions = trainer.nodes``, ``completionMode: Indexed``; node = the pod's
  ``JOB_COMPLETION_INDEX``. Each pod starts ``trainer.processesPerNode`` processes; together the
  ``nodes × processesPerNode`` processes are one torch.distributed process group (global rank =
  node × processesPerNode + local rank). The headless Service ``<job>-trainer`` selects only pod 0
  (``publishNotReadyAddresses``), so ``<job>-trainer.<ns>.svc`` is pod 0's address whatever the node
  count: port 8100 is the coordinator (global rank 0 alone runs it), port 29500 the rendezvous
  (``trainer.masterAddress`` and ``ports.rendezvous`` in the runtime contract). Pods of several
  processes get a memory-backed ``/dev/shm`` (NCCL between the GPUs of a pod).
- The only pods with a ServiceAccount token: ``<job>-trainer``, allowed to get and patch
  ``<job>-progress`` and nothing else.
- The checkpoint claim is mounted read-write at ``/checkpoints``; datasets are read here.
"""
from __future__ import annotations

from typing import Any

from rft_api.job import RFTJob
from rft_api.layout import CONFIG_PATH, DATASET_DIR

from .. import names
from .common import (
    BuildContext,
    base_env,
    checkpoint_mount,
    checkpoint_volume,
    claim_volumes,
    config_mount,
    config_volume,
    container_security_context,
    env_var,
    input_volumes,
    metadata,
    pod_spec,
    resources,
    scratch_mounts,
    scratch_volumes,
    service,
    user_env,
    with_pod_overrides,
)
from .fetch import storage_env

Obj = dict[str, Any]
ROLE = "trainer"
TERMINAL_EXIT_CODE = 2
IGNORE_DISRUPTION: Obj = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
"""The pod failure policy rule that does not count a disrupted pod (evicted, preempted, its node
drained or tainted) against ``backoffLimit``: the Job controller creates it again."""


def _dataset_configmaps(job: RFTJob) -> tuple[list[Obj], list[Obj]]:
    """One ConfigMap volume per dataset source that names one (``dataset.train``, each ``mix`` entry's
    own ``train``, ``dataset.eval``), at ``<DATASET_DIR>/<mount>`` (``rft_api.layout.dataset_path``)."""
    vols, mounts = [], []
    for _, mount, src, _ in job.spec.dataset.sources():
        if src.config_map_key_ref is not None:
            ref = src.config_map_key_ref
            vols.append({"name": f"dataset-{mount}",
                         "configMap": {"name": ref.name, "items": [{"key": ref.key, "path": ref.key}]}})
            mounts.append({"name": f"dataset-{mount}", "mountPath": f"{DATASET_DIR}/{mount}", "readOnly": True})
    return vols, mounts


def _shared_memory(job: RFTJob) -> tuple[list[Obj], list[Obj]]:
    """A memory-backed ``/dev/shm`` when a pod runs several trainer processes (NCCL moves data between
    the GPUs of one pod through shared memory; a container's default 64 MiB is too small)."""
    if job.spec.trainer.processes() < 2:
        return [], []
    return ([{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
            [{"name": "dshm", "mountPath": "/dev/shm"}])


def _output_env(job: RFTJob) -> list[Obj]:
    """With ``spec.output``: the store credentials the final push needs (by secretKeyRef), and hub
    access for an hf:// push (every other pod of the job stays offline)."""
    out = job.spec.output
    if out is None:
        return []
    return storage_env(job.spec.storage) + ([env_var("HF_HUB_OFFLINE", "0")] if out.uri.startswith("hf://") else [])


def job_for(job: RFTJob, ctx: BuildContext) -> Obj:
    """The trainer Job of attempt ``ctx.trainer_attempt``."""
    spec, tr = job.spec, job.spec.trainer
    ds = spec.dataset
    claim_vols, claim_mounts = claim_volumes([spec.model.volume, *(src.volume for _, _, src, _ in ds.sources())], "data")
    uri_vols, uri_mounts = input_volumes(job, inputs=False)  # the checkpoint claim is mounted whole
    claim_vols, claim_mounts = claim_vols + uri_vols, claim_mounts + uri_mounts
    cm_vols, cm_mounts = _dataset_configmaps(job)
    shm_vols, shm_mounts = _shared_memory(job)
    attempt = str(ctx.trainer_attempt)
    online = job.spec.output is not None and job.spec.output.uri.startswith("hf://")
    env = [e for e in base_env(job) if not (online and e["name"] == "HF_HUB_OFFLINE")] + \
        [env_var("RFT_TRAINER_ATTEMPT", attempt)] + _output_env(job) + user_env(tr.env)
    container: Obj = {
        "name": ROLE, "image": tr.image or ctx.runtime_image_of(job),
        "command": ["rft", "trainer", "--config", CONFIG_PATH],
        "ports": [{"name": "coordinator", "containerPort": ctx.coordinator_port, "protocol": "TCP"},
                  {"name": "rendezvous", "containerPort": ctx.rendezvous_port, "protocol": "TCP"}],
        "env": env,
        "volumeMounts": [config_mount(), checkpoint_mount(read_only=False), *scratch_mounts(), *claim_mounts,
                         *cm_mounts, *shm_mounts],
        "securityContext": container_security_context(read_only_root=True),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    res = resources(tr.resources)
    if res:
        container["resources"] = res
    pod = pod_spec([container], [config_volume(job), checkpoint_volume(job), *scratch_volumes(), *claim_vols,
                                 *cm_vols, *shm_vols],
                   service_account=names.trainer(job.name), automount_token=True, restart_policy="Never",
                   extra={"subdomain": names.trainer(job.name)})
    annotations = {names.ANNOTATION_ATTEMPT: attempt}
    return with_pod_overrides({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": metadata(job, names.trainer(job.name), ROLE, annotations),
        "spec": {
            "backoffLimit": 0,
            "completions": tr.nodes,
            "parallelism": tr.nodes,
            "completionMode": "Indexed",
            "podFailurePolicy": {"rules": [
                IGNORE_DISRUPTION,
                {"action": "FailJob", "onExitCodes": {"containerName": ROLE, "operator": "In",
                                                      "values": [TERMINAL_EXIT_CODE]}},
            ]},
            "template": {"metadata": {"labels": names.labels(job.name, ROLE), "annotations": annotations},
                         "spec": pod},
        },
    }, tr.pod)


def service_for(job: RFTJob, ctx: BuildContext) -> Obj:
    """Headless Service of pod 0: the coordinator (``http://<job>-trainer.<ns>.svc:8100``) and the
    torch.distributed rendezvous (``<job>-trainer.<ns>.svc:29500``)."""
    svc = service(job, names.trainer(job.name), ROLE, ctx.coordinator_port, "coordinator", headless=True,
                  extra_selector={names.LABEL_COMPLETION_INDEX: "0"})
    svc["spec"]["ports"].append({"name": "rendezvous", "port": ctx.rendezvous_port,
                                 "targetPort": ctx.rendezvous_port, "protocol": "TCP"})
    return svc
