"""The ``<job>-config`` ConfigMap: the runtime contract (:mod:`rft_api.runtime`) every role reads.

It holds the validated spec with its defaults, the resolved algorithm, the job's identity, the
service endpoints, the paths inside the pods (resolved by :mod:`rft_api.layout`) and the names
(never the values) of secret env vars.
"""
from __future__ import annotations

from typing import Any

from rft_api import runtime
from rft_api.job import RFTJob
from rft_api.layout import CHAT_TEMPLATE_KEY, CHECKPOINT_DIR, CONFIG_DIR, MODEL_CACHE_DIR

from .. import names
from ..topology import reward_required
from .common import BuildContext, metadata, service_url

Obj = dict[str, Any]


def runtime_config(job: RFTJob, ctx: BuildContext) -> runtime.RuntimeConfig:
    """The runtime contract of ``job`` as its pods see it."""
    spec = job.spec
    remote = reward_required(spec)
    return runtime.build(
        job,
        endpoints=runtime.Endpoints(
            inference=[service_url(job, names.inference(job.name), spec.inference.port)],
            inference_replicas=service_url(job, names.inference_pods(job.name), spec.inference.port),
            served_model_name=job.name,
            reward=service_url(job, names.reward(job.name), ctx.reward_port) if remote else None,
            coordinator=service_url(job, names.trainer(job.name), ctx.coordinator_port),
        ),
        ports=runtime.Ports(inference=spec.inference.port, reward=ctx.reward_port, coordinator=ctx.coordinator_port,
                            rendezvous=ctx.rendezvous_port),
        trainer=runtime.TrainerSettings(master_address=f"{names.trainer(job.name)}.{job.namespace}.svc"),
        paths=runtime.spec_paths(
            spec, checkpoints=CHECKPOINT_DIR, model_cache=MODEL_CACHE_DIR,
            chat_template=f"{CONFIG_DIR}/{CHAT_TEMPLATE_KEY}" if spec.model.chat_template else None),
        scoring="reward" if remote else "rollout",
        progress=runtime.ProgressTarget(sink="configmap", config_map=names.progress(job.name)),
    )


def config_map(job: RFTJob, ctx: BuildContext) -> Obj:
    """The ConfigMap carrying ``config.json`` (and the chat template override, if any)."""
    data = {names.CONFIG_KEY: runtime_config(job, ctx).to_json()}
    if job.spec.model.chat_template:
        data[CHAT_TEMPLATE_KEY] = job.spec.model.chat_template
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": metadata(job, names.config(job.name), "config"), "data": data}
