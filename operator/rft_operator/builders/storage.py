"""The checkpoint PersistentVolumeClaim and the progress ConfigMap: children that hold state.

Both are kept while the job is suspended and are owner-referenced, so deleting the job deletes them,
except a claim with ``checkpoint.retainOnDelete``: it has no owner reference (annotation
``rft.dev/retained-for`` names the job's uid instead) and outlives the job. A claim once retained stays
retained: a job that adopts it (same name, after the first job was deleted) never adds an owner
reference to it, whatever its own ``retainOnDelete`` (``BuildContext.retained_claim``), so deleting the
second job never deletes the first run's model.
"""
from __future__ import annotations

from typing import Any, Optional

from rft_api.job import RFTJob

from .. import names
from ..topology import checkpoint_sharing
from .common import BuildContext, metadata

Obj = dict[str, Any]


def checkpoint_claim(job: RFTJob, ctx: BuildContext) -> Optional[Obj]:
    """The ``<job>-checkpoints`` claim (its access mode from :func:`~rft_operator.topology.checkpoint_sharing`),
    or None with ``checkpoint.existingClaim``."""
    cp = job.spec.checkpoint
    if cp.existing_claim:
        return None
    mode, _ = checkpoint_sharing(job.spec)
    spec: Obj = {"accessModes": [mode], "resources": {"requests": {"storage": cp.size}}}
    if cp.storage_class_name:
        spec["storageClassName"] = cp.storage_class_name
    meta = metadata(job, names.checkpoints(job.name), "checkpoints")
    if cp.retain_on_delete or ctx.retained_claim:
        del meta["ownerReferences"]
        meta["annotations"] = {names.ANNOTATION_RETAINED_FOR: job.metadata.get("uid", "")}
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": spec}


def progress_config_map(job: RFTJob, ctx: BuildContext) -> Obj:
    """``<job>-progress`` with metadata only: the operator never writes (nor, by server-side apply,
    takes) its data, which belongs to the trainer (``docs/progress.md``)."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(job, names.progress(job.name), "progress")}


def colocate(job: RFTJob, workload: Obj) -> Obj:
    """``workload`` (in place) with, when its pods mount the checkpoint claim, a label and a required
    pod affinity that put every pod sharing the ReadWriteOnce claim onto one node."""
    template = workload["spec"]["template"]
    if not any(v.get("name") == "checkpoints" for v in template["spec"].get("volumes") or []):
        return workload
    template.setdefault("metadata", {}).setdefault("labels", {})[names.LABEL_SHARES_CHECKPOINTS] = job.name
    term = {"labelSelector": {"matchLabels": {names.LABEL_INSTANCE: job.name, names.LABEL_SHARES_CHECKPOINTS: job.name}},
            "topologyKey": "kubernetes.io/hostname"}
    affinity = template["spec"].setdefault("affinity", {})
    affinity.setdefault("podAffinity", {}).setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(term)
    return workload
