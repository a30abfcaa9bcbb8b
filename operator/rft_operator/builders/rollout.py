"""The rollout role: ``rft rollout`` workers that lease tasks, sample, keep tokens and logprobs, score.

The image is the evaluator bundle's when there is one (it must have the runtime's ``rft`` installed),
else the runtime image. When the job has no reward role the rollout pods score in process: they then
get the evaluator files (``/etc/rft/evaluator/<index>/<key>``) and API-key Secrets; otherwise only the
files that define the rollout function (``evaluator.file.rollout``) and no Secret. No ServiceAccount
token is mounted unless ``spec.serviceAccountName`` names an account (whose own setting then decides).
"""
from __future__ import annotations

from typing import Any

from rft_api.job import RFTJob
from rft_api.layout import CONFIG_PATH

from .. import names
from ..topology import reward_required
from . import evaluator
from .common import (
    BuildContext,
    base_env,
    claim_volumes,
    config_mount,
    config_volume,
    container_security_context,
    deployment,
    input_volumes,
    pod_spec,
    scratch_mounts,
    scratch_volumes,
    with_pod_overrides,
)

Obj = dict[str, Any]
ROLE = "rollout"


def deployment_for(job: RFTJob, ctx: BuildContext) -> Obj:
    """The rollout Deployment."""
    scores_here = not reward_required(job.spec)
    # scoring here: every evaluator file; else only files whose rollout function these pods run
    ev_vols, ev_mounts = evaluator.file_volumes(job, rollout_only=not scores_here)
    # The tokenizer (chat template, prompt ids) is read from the model's directory: a model on a claim
    # is mounted here as in inference and trainer pods (read-only).
    model_vols, model_mounts = claim_volumes([job.spec.model.volume], "model")
    uri_vols, uri_mounts = input_volumes(job)
    container = {
        "name": ROLE, "image": evaluator.scoring_image(job, ctx),
        "command": ["rft", "rollout", "--config", CONFIG_PATH, "--when-done", "wait"],
        "env": base_env(job) + (evaluator.secret_envs(job.spec) if scores_here else []),
        "volumeMounts": [config_mount(), *scratch_mounts(), *ev_mounts, *model_mounts, *uri_mounts],
        "securityContext": container_security_context(read_only_root=True),
    }
    sa = job.spec.service_account_name
    pod = pod_spec([container], [config_volume(job), *scratch_volumes(), *ev_vols, *model_vols, *uri_vols],
                   service_account=sa, automount_token=None if sa else False)
    ro = job.spec.rollout
    return with_pod_overrides(deployment(job, names.rollout(job.name), ROLE, ro.replicas, pod), ro.pod)
