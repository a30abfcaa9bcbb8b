"""The runtime contract (rft_api.runtime): the operator's config.json and rft run's parse the same way,
paths are resolved once, errors name the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rft_api import runtime
from rft_api.job import load_manifest, parse_manifest
from rft_operator.builders.common import BuildContext
from rft_operator.builders.config import config_map, runtime_config


def _job(**spec_over):
    spec = {"model": {"base": "builtin:tiny"}, "dataset": {"train": {"builtin": "arithmetic"}},
            "evaluator": {"builtin": "math"}}
    spec.update(spec_over)
    return parse_manifest({"apiVersion": "rft.dev/v1alpha1", "kind": "RFTJob",
                           "metadata": {"name": "j", "namespace": "ns"}, "spec": spec})


def test_operator_config_map_round_trips_through_the_contract():
    job = load_manifest("examples/01-tiny-arith.yaml")
    cm = config_map(job, BuildContext())
    cfg = runtime.parse(cm["data"]["config.json"])
    assert cfg == runtime_config(job, BuildContext())
    assert cfg.job.name == "tiny-arith" and cfg.spec.rollout.samples_per_prompt == 8
    assert cfg.algorithm.name == "grpo" and cfg.algorithm.policy_loss == "ppo_clip"
    assert cfg.endpoints.coordinator == "http://tiny-arith-trainer.default.svc:8100"
    assert cfg.ports.coordinator == 8100 and cfg.scoring == "rollout"
    assert cfg.progress.sink == "configmap" and cfg.progress.config_map == "tiny-arith-progress"
    assert cfg.paths.metrics_dir == Path("/checkpoints/metrics")


def test_relative_model_paths_resolve_against_the_model_volume_for_every_role():
    job = _job(model={"base": "models/qwen", "tokenizer": "tok/qwen", "warmStartFrom": "ws/step-5",
                      "volume": {"claimName": "models", "mountPath": "/models"}})
    cfg = runtime_config(job, BuildContext())
    assert (cfg.paths.model, cfg.paths.tokenizer, cfg.paths.warm_start) == (
        "/models/models/qwen", "/models/tok/qwen", "/models/ws/step-5")


def test_file_evaluators_and_api_keys_are_resolved_by_index():
    job = _job(evaluator={"evaluators": [
        {"builtin": "math"},
        {"file": {"configMapKeyRef": {"name": "evals", "key": "style.py"}, "function": "style", "rollout": "play"}},
        {"builtin": "llm_judge", "apiKeySecretRef": {"name": "judge", "key": "token"},
         "config": {"endpoint": "http://judge:8000"}}]})
    cfg = runtime_config(job, BuildContext())
    resolved = cfg.evaluators()
    assert resolved[1].file_path == "/etc/rft/evaluator/1/style.py"
    assert resolved[2].api_key_env == "RFT_EVALUATOR_2_API_KEY"
    assert cfg.rollout_function() == "/etc/rft/evaluator/1/style.py:play"
    assert json.loads(cfg.to_json())["secretEnv"] == [{"index": 2, "env": "RFT_EVALUATOR_2_API_KEY"}]


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.pop("job"), "job"),
    (lambda d: d["endpoints"].update(inference=["ftp://x"]), "endpoints.inference"),
    (lambda d: d["endpoints"].update(inference=[]), "endpoints.inference"),
    (lambda d: d["ports"].update(coordinator="eighty"), "ports.coordinator"),
    (lambda d: d["paths"].pop("checkpoints"), "paths.checkpoints"),
    (lambda d: d["spec"]["rollout"].update(samplesPerPrompt=0), "spec.rollout.samplesPerPrompt"),
    (lambda d: d["algorithm"].update(bogus=1), "algorithm"),
    (lambda d: d["progress"].update(sink="carrier-pigeon"), "progress.sink"),
    (lambda d: d.update(runtime={}), "runtime"),  # the old second dialect is refused, not tolerated
    (lambda d: d["trainer"].update(weightTransfer="carrier-pigeon"), "trainer.weightTransfer"),
    (lambda d: (d["trainer"].update(weightTransfer="http"), d["spec"]["inference"].update(engine="vllm", weightSync="none")),
     "trainer.weightTransfer: http uploads weights to the builtin server"),
])
def test_errors_name_the_field(mutate, field):
    doc = json.loads(runtime_config(load_manifest("examples/01-tiny-arith.yaml"), BuildContext()).to_json())
    mutate(doc)
    with pytest.raises(runtime.ConfigError, match=field.replace(".", r"\.")):
        runtime.parse(doc)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(runtime.ConfigError, match="does not exist"):
        runtime.load(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(runtime.ConfigError, match="not JSON"):
        runtime.load(tmp_path / "bad.json")
