"""The checkpoint PersistentVolumeClaim and the progress ConfigMap: children that hold state.

Both are kept while the job is suspended and are owner-referenced, so deleting the job deletes them.
"""
from __future__ import annotations

from typing import Any, Optional

from rft_api.job import RFTJob

from .. import names
from .common import BuildContext, metadata

Obj = dict[str, Any]


def checkpoint_claim(job: RFTJob, ctx: BuildContext) -> Optional[Obj]:
    """The ``<job>-checkpoints`` claim (ReadWriteOnce), or None with ``checkpoint.existingClaim``."""
    cp = job.spec.checkpoint
    if cp.existing_claim:
        return None
    spec: Obj = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": cp.size}}}
    if cp.storage_class_name:
        spec["storageClassName"] = cp.storage_class_name
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": metadata(job, names.checkpoints(job.name), "checkpoints"), "spec": spec}


def progress_config_map(job: RFTJob, ctx: BuildContext) -> Obj:
    """``<job>-progress`` with metadata only: the operator never writes (nor, by server-side apply,
    takes) its data, which belongs to the trainer (``docs/progress.md``)."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(job, names.progress(job.name), "progress")}
