"""The reward role: ``rft reward`` behind a Service, for scoring that should not run in the rollout pods.

Created only when ``topology.reward_required`` (``evaluator.remote``, a ``code_sandbox`` or an
``llm_judge`` evaluator). When it exists, all scoring happens here: the pods get the evaluator files and
the evaluators' API keys (as ``valueFrom.secretKeyRef`` env vars, never values), and run the bundle
image when the evaluator is a bundle. No ServiceAccount token is mounted. ``spec.reward`` sets its
replicas (one by default) and its pod overrides (``common.with_pod_overrides``).
"""
from __future__ import annotations

from typing import Any

from rft_api.job import RFTJob
from rft_api.layout import CONFIG_PATH
from rft_api.spec import RewardSpec

from .. import names
from . import evaluator
from .common import (
    BIND_HOST,
    BuildContext,
    base_env,
    config_mount,
    config_volume,
    container_security_context,
    deployment,
    http_probe,
    pod_spec,
    scratch_mounts,
    scratch_volumes,
    service,
    with_pod_overrides,
)

Obj = dict[str, Any]
ROLE = "reward"
# The seccomp profile (relative to the kubelet's seccomp directory) the chart ships in
# charts/rft-operator/files/seccomp/code-sandbox.json: RuntimeDefault forbids unshare(2) and mount(2),
# without which the code sandbox cannot build its user, mount, network and pid namespaces. The pod
# stays non-root with every capability dropped; docs/code-sandbox.md argues the choice.
CODE_SANDBOX_SECCOMP = "rft/code-sandbox.json"


def _security_context(job: RFTJob) -> Obj:
    sc = container_security_context(read_only_root=True)
    if any(e.builtin == "code_sandbox" for e in job.spec.evaluator.entries()):
        sc["seccompProfile"] = {"type": "Localhost", "localhostProfile": CODE_SANDBOX_SECCOMP}
    return sc


def deployment_for(job: RFTJob, ctx: BuildContext) -> Obj:
    """The reward Deployment."""
    ev_vols, ev_mounts = evaluator.file_volumes(job)
    container = {
        "name": ROLE, "image": evaluator.scoring_image(job, ctx),
        "command": ["rft", "reward", "--config", CONFIG_PATH, "--host", BIND_HOST, "--port", str(ctx.reward_port)],
        "ports": [{"name": "http", "containerPort": ctx.reward_port, "protocol": "TCP"}],
        "env": base_env(job) + evaluator.secret_envs(job.spec),
        "volumeMounts": [config_mount(), *scratch_mounts(), *ev_mounts],
        "readinessProbe": http_probe("/health", ctx.reward_port),
        "securityContext": _security_context(job),
        # A server that exits at start (its evaluators cannot be built) says why in its last log
        # lines; the operator fails the job with them (observe.observe_pod).
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    sa = job.spec.service_account_name
    pod = pod_spec([container], [config_volume(job), *scratch_volumes(), *ev_vols],
                   service_account=sa, automount_token=None if sa else False)
    rw = job.spec.reward or RewardSpec()
    return with_pod_overrides(deployment(job, names.reward(job.name), ROLE, rw.replicas, pod), rw.pod)


def service_for(job: RFTJob, ctx: BuildContext) -> Obj:
    """The reward Service (``http://<job>-reward.<ns>.svc:8200``)."""
    return service(job, names.reward(job.name), ROLE, ctx.reward_port, "http")
