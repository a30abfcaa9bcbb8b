"""`rft run` of a job whose model, dataset and output are s3:// URIs on a real S3 server (SeaweedFS):
the model and GSM8K (with a field mapping) fetched once into the inputs cache, the trained model pushed
and read back byte for byte; a second run fetches nothing; a wrong secret stops the run before any role
starts, naming the URI and the 403, and the secret appears nowhere."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml

from tests.local.conftest import run_rft
from tests.support.shared import shared_dir

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    from rft_runtime.model import resolve_builtin_model

    return resolve_builtin_model("builtin:tiny")


@pytest.fixture
def staged(s3_server, tiny_model) -> str:
    """A bucket holding the tiny model under ``models/tiny/`` and 48 GSM8K problems in ``data/``."""
    bucket = f"run-{uuid.uuid4().hex[:8]}"
    s3 = s3_server.client()
    s3.create_bucket(Bucket=bucket)
    for f in sorted(p for p in tiny_model.rglob("*") if p.is_file()):
        s3.put_object(Bucket=bucket, Key=f"models/tiny/{f.relative_to(tiny_model).as_posix()}", Body=f.read_bytes())
    lines = (shared_dir() / "datasets" / "gsm8k" / "train.jsonl").read_text().splitlines()[:48]
    s3.put_object(Bucket=bucket, Key="data/gsm8k/train.jsonl", Body=("\n".join(lines) + "\n").encode())
    return bucket


def _manifest(path: Path, s3_server, bucket: str, steps: int) -> Path:
    doc = {"apiVersion": "rft.dev/v1alpha1", "kind": "RFTJob", "metadata": {"name": "from-s3"}, "spec": {
        "model": {"base": f"s3://{bucket}/models/tiny"},
        "dataset": {"train": {"uri": f"s3://{bucket}/data/gsm8k/train.jsonl", "size": 8,
                              "fields": {"prompt": "question", "groundTruth": "answer"}}},
        "evaluator": {"builtin": "math"},
        "rollout": {"samplesPerPrompt": 4, "promptsPerStep": 4, "maxTokens": 8, "maxPromptTokens": 1024},
        "inference": {"engine": "builtin"},
        "trainer": {"algorithm": "grpo", "learningRate": 1e-3, "maxSteps": steps},
        "checkpoint": {"everySteps": steps},
        "storage": {"s3": {"endpoint": s3_server.endpoint, "region": s3_server.region,
                           "accessKeyIdSecretRef": {"name": "s3", "key": "id"},
                           "secretAccessKeySecretRef": {"name": "s3", "key": "secret"}}},
        "output": {"uri": f"s3://{bucket}/trained/run-1"},
    }}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _keys(s3_server, bucket: str, prefix: str) -> list[str]:
    pages = s3_server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def test_a_job_from_s3_trains_and_pushes_its_model_and_a_second_run_fetches_nothing(
        s3_server, staged, tmp_path, monkeypatch):
    monkeypatch.setenv("RFT_S3_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("RFT_S3_SECRET_ACCESS_KEY", s3_server.secret_key)
    monkeypatch.setenv("RFT_INPUTS_CACHE", str(tmp_path / "inputs"))
    out, log = tmp_path / "out", tmp_path / "rft.log"
    code = run_rft(["run", str(_manifest(tmp_path / "job.yaml", s3_server, staged, 2)), "--out", str(out),
                    "--no-progress"], log)
    text = log.read_text()
    assert code == 0, text[-4000:]
    assert s3_server.secret_key not in text

    final = out / "checkpoints" / "final"
    local = sorted(p.relative_to(final).as_posix() for p in final.rglob("*") if p.is_file())
    assert "config.json" in local and any(f.endswith(".safetensors") for f in local)
    assert _keys(s3_server, staged, "trained/run-1/final/") == [f"trained/run-1/final/{f}" for f in local]
    s3 = s3_server.client()
    for rel in local:
        body = s3.get_object(Bucket=staged, Key=f"trained/run-1/final/{rel}")["Body"].read()
        assert body == (final / rel).read_bytes(), rel
    progress = json.loads((out / "progress.json").read_text())
    assert progress["output"]["uri"] == f"s3://{staged}/trained/run-1/final"
    assert progress["output"]["files"] == len(local) and "error" not in progress["output"]

    fetched = {k: s3_server.get_object_count(staged, k) for k in _keys(s3_server, staged, "models/") + ["data/gsm8k/train.jsonl"]}
    assert set(fetched.values()) == {1}, fetched  # every input file downloaded exactly once
    code = run_rft(["run", str(_manifest(tmp_path / "job2.yaml", s3_server, staged, 1)), "--out",
                    str(tmp_path / "out2"), "--no-progress"], tmp_path / "rft2.log")
    assert code == 0, (tmp_path / "rft2.log").read_text()[-4000:]
    assert {k: s3_server.get_object_count(staged, k) for k in fetched} == fetched


def test_a_wrong_secret_stops_the_run_before_training_naming_the_uri(s3_server, staged, tmp_path, monkeypatch):
    wrong = "WRONG-" + uuid.uuid4().hex
    monkeypatch.setenv("RFT_S3_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("RFT_S3_SECRET_ACCESS_KEY", wrong)
    monkeypatch.setenv("RFT_INPUTS_CACHE", str(tmp_path / "inputs"))
    log = tmp_path / "rft.log"
    code = run_rft(["run", str(_manifest(tmp_path / "job.yaml", s3_server, staged, 1)), "--out",
                    str(tmp_path / "out"), "--no-progress"], log, timeout=300)
    text = log.read_text()
    assert code != 0
    assert f"s3://{staged}/models/tiny" in text and "spec.model.base" in text and "403" in text
    assert wrong not in text and s3_server.secret_key not in text
    assert not (tmp_path / "out" / "checkpoints" / "final").exists()
