"""The resolved runtime config: build → parse round trip, errors naming the field."""

from __future__ import annotations

import json

import pytest

from rft_api.job import load_manifest
from rft_runtime.trainer.config import ConfigError, build_config, load_config, parse_config


@pytest.fixture
def doc():
    job = load_manifest("examples/01-tiny-arith.yaml")
    return build_config(job.name, job.spec, inference=["http://127.0.0.1:8000"], reward=None,
                        coordinator_host="tiny-arith-trainer", coordinator_port=8080, checkpoints="/ckpt",
                        model_cache="/models")


def test_roundtrip(doc, tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(doc))
    cfg = load_config(p)
    assert cfg.job_name == "tiny-arith" and cfg.spec.rollout.samples_per_prompt == 8
    assert cfg.algorithm.name == "grpo" and cfg.algorithm.policy_loss == "ppo_clip"
    assert cfg.coordinator_url == "http://tiny-arith-trainer:8080" and cfg.coordinator_bind == "0.0.0.0"
    assert cfg.served_model == "tiny-arith" and str(cfg.output_dir) == "/ckpt/metrics"


@pytest.mark.parametrize("mutate,field", [
    (lambda d: d.pop("job"), "job"),
    (lambda d: d["endpoints"].update(inference="x"), "endpoints.inference"),
    (lambda d: d["endpoints"]["coordinator"].update(port="80"), "endpoints.coordinator.port"),
    (lambda d: d["paths"].pop("checkpoints"), "paths.checkpoints"),
    (lambda d: d["spec"]["rollout"].update(samplesPerPrompt=0), "spec.rollout.samplesPerPrompt"),
    (lambda d: d["algorithm"].update(bogus=1), "algorithm"),
    (lambda d: d.update(runtime={"progress": "carrier-pigeon"}), "runtime.progress"),
])
def test_errors_name_the_field(doc, mutate, field):
    mutate(doc)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        parse_config(doc)


def test_algorithm_from_config_overrides_preset(doc):
    doc["algorithm"]["clip_high"] = 0.28
    assert parse_config(doc).algorithm.clip_high == 0.28


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.json")
