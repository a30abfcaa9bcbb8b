"""Child builders: one module per child kind, each a pure function ``(job, ctx) -> dict``.

:func:`desired_children` lists what a job should have, in apply order (identity and state first,
then Services, then workloads), given which workloads the reconcile plan allows.
"""
from __future__ import annotations

from typing import Any

from rft_api.job import RFTJob

from ..topology import reward_required
from . import config, inference, rbac, reward, rollout, storage, trainer
from .common import BuildContext

Obj = dict[str, Any]

__all__ = ["BuildContext", "desired_children", "stateful_children", "workload_children", "key_of"]


def stateful_children(job: RFTJob, ctx: BuildContext) -> list[Obj]:
    """Children that exist whenever the job is valid (kept while suspended)."""
    out = [rbac.service_account(job, ctx), rbac.role(job, ctx), rbac.role_binding(job, ctx),
           config.config_map(job, ctx), storage.progress_config_map(job, ctx)]
    pvc = storage.checkpoint_claim(job, ctx)
    if pvc is not None:
        out.append(pvc)
    out.append(inference.service_for(job, ctx))
    if reward_required(job.spec):
        out.append(reward.service_for(job, ctx))
    out.append(trainer.service_for(job, ctx))
    return out


def workload_children(job: RFTJob, ctx: BuildContext, *, deployments: bool = True, trainer_job: bool = True) -> list[Obj]:
    """The role workloads: Deployments (inference, reward, rollout) and the trainer Job."""
    out = []
    if deployments:
        out.append(inference.deployment_for(job, ctx))
        if reward_required(job.spec):
            out.append(reward.deployment_for(job, ctx))
        out.append(rollout.deployment_for(job, ctx))
    if trainer_job:
        out.append(trainer.job_for(job, ctx))
    return out


def desired_children(job: RFTJob, ctx: BuildContext, *, deployments: bool = True, trainer_job: bool = True) -> list[Obj]:
    """Everything the job should have, in apply order."""
    return stateful_children(job, ctx) + workload_children(job, ctx, deployments=deployments, trainer_job=trainer_job)


def key_of(obj: Obj) -> tuple[str, str]:
    """(kind, name): what identifies a child within its job's namespace."""
    return obj["kind"], obj["metadata"]["name"]
