"""The reward role: ``rft reward`` behind a Service, for scoring that should not run in the rollout pods.

Created only when ``topology.reward_required`` (``evaluator.remote``, a ``code_sandbox`` or an
``llm_judge`` evaluator). When it exists, all scoring happens here: the pods get the evaluator files and
the evaluators' API keys (as ``valueFrom.secretKeyRef`` env vars, never values), and run the bundle
image when the evaluator is a bundle. No ServiceAccount token is mounted.
"""
from __future__ import annotations

from typing import Any

from rft_api.job import RFTJob
from rft_api.layout import CONFIG_PATH

from .. import names
from ..topology import REWARD_REPLICAS
from . import evaluator
from .common import BIND_HOST, BuildContext, base_env, config_mount, config_volume, container_security_context, deployment, http_probe, pod_spec, scratch_mounts, scratch_volumes, service

Obj = dict[str, Any]
ROLE = "reward"


def deployment_for(job: RFTJob, ctx: BuildContext) -> Obj:
    """The reward Deployment."""
    ev_vols, ev_mounts = evaluator.file_volumes(job)
    container = {
        "name": ROLE, "image": evaluator.scoring_image(job),
        "command": ["rft", "reward", "--config", CONFIG_PATH, "--host", BIND_HOST, "--port", str(ctx.reward_port)],
        "ports": [{"name": "http", "containerPort": ctx.reward_port, "protocol": "TCP"}],
        "env": base_env(job) + evaluator.secret_envs(job.spec),
        "volumeMounts": [config_mount(), *scratch_mounts(), *ev_mounts],
        "readinessProbe": http_probe("/health", ctx.reward_port),
        "securityContext": container_security_context(read_only_root=True),
    }
    sa = job.spec.service_account_name
    pod = pod_spec([container], [config_volume(job), *scratch_volumes(), *ev_vols],
                   service_account=sa, automount_token=None if sa else False)
    return deployment(job, names.reward(job.name), ROLE, REWARD_REPLICAS, pod)


def service_for(job: RFTJob, ctx: BuildContext) -> Obj:
    """The reward Service (``http://<job>-reward.<ns>.svc:8200``)."""
    return service(job, names.reward(job.name), ROLE, ctx.reward_port, "http")
