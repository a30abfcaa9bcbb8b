"""The ``<job>-config`` ConfigMap: the resolved runtime config every role reads (``config.json``).

It holds the validated spec with its defaults, the resolved algorithm, the job's identity, the
service endpoints, the paths inside the pods and the names (never the values) of secret env vars.
"""
from __future__ import annotations

import json
from typing import Any

from rft_api.constants import API_VERSION
from rft_api.job import RFTJob
from rft_api.presets import resolve_algorithm

from .. import names
from ..topology import reward_required
from . import evaluator
from .common import (CACHE_DIR, CHAT_TEMPLATE_KEY, CHECKPOINT_DIR, CONFIG_DIR, CONFIG_PATH, MODEL_CACHE_DIR,
                     BuildContext, dataset_path, metadata, model_path, service_url, tokenizer_path)

Obj = dict[str, Any]
RUNTIME_CONFIG_KIND = "RFTRuntimeConfig"


def runtime_config(job: RFTJob, ctx: BuildContext) -> Obj:
    """The resolved runtime config (a JSON-ready dict)."""
    spec = job.spec
    remote = reward_required(spec)
    return {
        "apiVersion": API_VERSION,
        "kind": RUNTIME_CONFIG_KIND,
        "job": {"name": job.name, "namespace": job.namespace},
        "spec": spec.model_dump(by_alias=True, exclude_none=True, mode="json"),
        "algorithm": resolve_algorithm(spec).to_dict(),
        "endpoints": {
            "inference": [service_url(job, names.inference(job.name), spec.inference.port)],
            "servedModelName": job.name,
            "reward": service_url(job, names.reward(job.name), ctx.reward_port) if remote else None,
            "coordinator": service_url(job, names.trainer(job.name), ctx.coordinator_port),
        },
        "ports": {"inference": spec.inference.port, "reward": ctx.reward_port, "coordinator": ctx.coordinator_port},
        "scoring": "reward" if remote else "rollout",
        "paths": {
            "config": CONFIG_PATH,
            "checkpoints": CHECKPOINT_DIR,
            "cache": CACHE_DIR,
            "modelCache": MODEL_CACHE_DIR,
            "model": model_path(spec),
            "tokenizer": tokenizer_path(spec),
            "chatTemplate": f"{CONFIG_DIR}/{CHAT_TEMPLATE_KEY}" if spec.model.chat_template else None,
            "datasets": {"train": dataset_path("train", spec.dataset.train),
                         "eval": dataset_path("eval", spec.dataset.eval)},
            "evaluatorFiles": evaluator.file_entries(spec),
        },
        "secretEnv": evaluator.secret_entries(spec),
        "progress": {"configMap": names.progress(job.name), "key": names.PROGRESS_KEY},
    }


def config_map(job: RFTJob, ctx: BuildContext) -> Obj:
    """The ConfigMap carrying ``config.json`` (and the chat template override, if any)."""
    data = {names.CONFIG_KEY: json.dumps(runtime_config(job, ctx), indent=2, sort_keys=True)}
    if job.spec.model.chat_template:
        data[CHAT_TEMPLATE_KEY] = job.spec.model.chat_template
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": metadata(job, names.config(job.name), "config"), "data": data}
