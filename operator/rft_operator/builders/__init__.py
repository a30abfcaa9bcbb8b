"""Child builders: one module per child kind, each a pure function ``(job, ctx) -> dict``.

The job's token Secret (``secret.token_secret``) is not among the desired children: its content is
random, so the reconcile creates it once (``reconcile.ensure_token``) and never applies it again.

:func:`desired_children` lists what a job should have, in apply order (identity and state first,
then Services, then workloads), given which workloads the reconcile plan allows, stamped with
hashes (see :func:`stamp`):

- ``rft.dev/config-hash`` on every pod template: the hash of the rendered ``<job>-config``, so a
  config edit changes the template and rolls the pods that read it;
- ``rft.dev/template-hash`` on the trainer Job: the hash of its (immutable) spec, so the reconcile
  knows when the Job must be recreated rather than applied;
- ``rft.dev/applied-hash`` on every child: the hash of the child as built, so an unchanged child is
  not applied again (the reconcile compares it with the observed child's);
- ``rft.dev/token-digest`` on every role's pod template (``ctx.token_digest``): a new token restarts
  every role (``secret``).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from rft_api.job import RFTJob

from .. import names
from ..topology import checkpoint_sharing, reward_required
from . import config, fetch, inference, network, rbac, reward, rollout, storage, trainer, workload
from .common import BuildContext, resources

Obj = dict[str, Any]

__all__ = ["BuildContext", "desired_children", "stateful_children", "workload_children", "key_of", "config_hash",
           "content_hash", "stamp", "with_default_resources"]
HASH_LEN = 16


def content_hash(value: Any) -> str:
    """A short, stable hash of a JSON-ready value (keys sorted)."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:HASH_LEN]


def config_hash(job: RFTJob, ctx: BuildContext) -> str:
    """The hash of the rendered ``<job>-config`` data: what every pod template carries."""
    return content_hash(config.config_map(job, ctx)["data"])


def _annotate(meta: Obj, key: str, value: str) -> None:
    meta.setdefault("annotations", {})[key] = value


def with_default_resources(job: RFTJob, children: list[Obj]) -> list[Obj]:
    """Complete every container (and init container) of every pod template with the job's
    ``spec.defaultResources`` (in place; returns ``children``): each default request the container
    names neither in its requests nor in its limits (Kubernetes takes a request from the limit), and
    each default limit it does not name. Every pod then has requests, so a namespace with a
    ResourceQuota admits it."""
    default = resources(job.spec.default_resources)
    for obj in children:
        pod = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        for c in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            res = c.get("resources") or {}
            requests, limits = dict(res.get("requests") or {}), dict(res.get("limits") or {})
            for k, v in (default.get("requests") or {}).items():
                if k not in requests and k not in limits:
                    requests[k] = v
            for k, v in (default.get("limits") or {}).items():
                limits.setdefault(k, v)
            res = {}
            if limits:
                res["limits"] = dict(sorted(limits.items()))
            if requests:
                res["requests"] = dict(sorted(requests.items()))
            if res:
                c["resources"] = res
    return children


def stamp(children: list[Obj], cfg_hash: str) -> list[Obj]:
    """Put the config hash on every pod template, the template hash on Jobs and the applied hash on
    every child (in place; returns ``children``)."""
    for obj in children:
        template = (obj.get("spec") or {}).get("template")
        if isinstance(template, dict):
            _annotate(template.setdefault("metadata", {}), names.ANNOTATION_CONFIG_HASH, cfg_hash)
        if obj["kind"] == "Job":
            _annotate(obj["metadata"], names.ANNOTATION_TEMPLATE_HASH, content_hash(obj["spec"]))
        _annotate(obj["metadata"], names.ANNOTATION_APPLIED_HASH, content_hash(obj))
    return children


def stateful_children(job: RFTJob, ctx: BuildContext) -> list[Obj]:
    """Children that exist whenever the job is valid (kept while suspended)."""
    out = [rbac.service_account(job, ctx), rbac.role(job, ctx), rbac.role_binding(job, ctx),
           config.config_map(job, ctx), storage.progress_config_map(job, ctx)]
    pvc = storage.checkpoint_claim(job, ctx)
    if pvc is not None:
        out.append(pvc)
    out.append(inference.service_for(job, ctx))
    out.append(inference.pods_service_for(job, ctx))
    if reward_required(job.spec):
        out.append(reward.service_for(job, ctx))
    out.append(trainer.service_for(job, ctx))
    out += network.policies(job, ctx)
    return out


def workload_children(job: RFTJob, ctx: BuildContext, *, deployments: bool = True, trainer_job: bool = True) -> list[Obj]:
    """The role workloads: Deployments (inference, reward, rollout) and the trainer Job, with the job's
    default resources, co-located when they share a ReadWriteOnce checkpoint claim, and placed as a
    Kueue admission says (``ctx.placements``)."""
    out = []
    if deployments:
        out.append(inference.deployment_for(job, ctx))
        if reward_required(job.spec):
            out.append(reward.deployment_for(job, ctx))
        out.append(rollout.deployment_for(job, ctx))
    if trainer_job:
        out.append(trainer.job_for(job, ctx))
    if checkpoint_sharing(job.spec)[1]:
        out = [storage.colocate(job, o) for o in out]
    placements = dict(ctx.placements)
    if placements:
        out = [workload.place(o, placements) for o in out]
    if ctx.token_digest:
        for o in out:
            _annotate(o["spec"]["template"].setdefault("metadata", {}), names.ANNOTATION_TOKEN_DIGEST, ctx.token_digest)
    return with_default_resources(job, out)


def with_pull_settings(ctx: BuildContext, children: list[Obj]) -> list[Obj]:
    """Every pod template of ``children`` (in place; returns them) with the operator's pull settings:
    ``ctx.image_pull_policy`` on each container and init container, ``ctx.image_pull_secrets`` added to
    the pod's ``imagePullSecrets`` (after the role's own, without repeating one)."""
    for obj in children:
        pod = ((obj.get("spec") or {}).get("template") or {}).get("spec")
        if not isinstance(pod, dict):
            continue
        if ctx.image_pull_policy:
            for c in [*pod.get("initContainers", []), *pod.get("containers", [])]:
                c["imagePullPolicy"] = ctx.image_pull_policy
        if ctx.image_pull_secrets:
            secrets = list(pod.get("imagePullSecrets") or [])
            secrets += [{"name": n} for n in ctx.image_pull_secrets if {"name": n} not in secrets]
            pod["imagePullSecrets"] = secrets
    return children


def desired_children(job: RFTJob, ctx: BuildContext, *, deployments: bool = True, trainer_job: bool = True,
                     fetch_job: bool = False) -> list[Obj]:
    """Everything the job should have, in apply order, stamped with their hashes (``fetch_job``: with
    the Job that fetches its hf:// and s3:// inputs, when it has any)."""
    fetcher = fetch.job_for(job, ctx) if fetch_job else None
    # the fetch Job's template carries no config hash: a config edit must not make it another Job
    fetched = stamp(with_default_resources(job, [fetcher]), "") if fetcher is not None else []
    children = stateful_children(job, ctx) + workload_children(job, ctx, deployments=deployments,
                                                               trainer_job=trainer_job)
    out = stamp(children, config_hash(job, ctx))
    cut = len(out) - sum(1 for o in out if o["kind"] in ("Deployment", "Job"))
    return with_pull_settings(ctx, out[:cut] + fetched + out[cut:])


def key_of(obj: Obj) -> tuple[str, str]:
    """(kind, name): what identifies a child within its job's namespace."""
    return obj["kind"], obj["metadata"]["name"]
