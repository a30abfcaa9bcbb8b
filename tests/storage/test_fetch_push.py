"""Fetching a job's s3:// inputs and pushing its model, against a real S3 server (SeaweedFS): once per
file, resumed after an interruption, refused with a message that names the URI and never the secret."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from rft_api.layout import FETCH_MANIFEST, Input, fetched_dir
from rft_api.spec import DataSource, OutputSpec, S3Storage, StorageSpec
from rft_runtime.storage import fetch as fetch_mod
from rft_runtime.storage.errors import StorageError
from rft_runtime.storage.fetch import fetch_input, read_manifest
from rft_runtime.storage.push import push_dir
from rft_runtime.trainer.datasets import load_path
from tests.support.shared import shared_dir

MODEL_FILES = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"]}',
    "model.safetensors": bytes(range(256)) * 400,
    "tokenizer.json": b'{"version": "1.0"}',
    "pytorch_model.bin": b"not wanted when safetensors are there",
    "sub/extra.txt": b"nested files keep their path",
}


@pytest.fixture
def bucket(s3_server) -> str:
    name = f"b-{uuid.uuid4().hex[:10]}"
    s3_server.client().create_bucket(Bucket=name)
    return name


def _put(s3_server, bucket: str, prefix: str, files: dict[str, bytes]) -> None:
    s3 = s3_server.client()
    for rel, data in files.items():
        s3.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=data)


def _storage(s3_server) -> StorageSpec:
    return StorageSpec(s3=S3Storage(endpoint=s3_server.endpoint, region=s3_server.region))


def _env(s3_server, secret: str | None = None) -> dict[str, str]:
    return {"RFT_S3_ACCESS_KEY_ID": s3_server.access_key,
            "RFT_S3_SECRET_ACCESS_KEY": secret if secret is not None else s3_server.secret_key}


def _model_input(uri: str, tmp_path: Path) -> Input:
    return Input("spec.model.base", uri, "model", fetched_dir(uri, str(tmp_path / "inputs")))


def test_a_model_is_fetched_once_and_a_second_fetch_downloads_nothing(s3_server, bucket, tmp_path):
    _put(s3_server, bucket, "models/m1", MODEL_FILES)
    inp = _model_input(f"s3://{bucket}/models/m1", tmp_path)
    manifest, fetched = fetch_input(inp, _storage(s3_server), _env(s3_server))
    assert fetched
    dest = Path(inp.dest)
    wanted = {k: v for k, v in MODEL_FILES.items() if not k.endswith(".bin")}
    assert {f.path for f in manifest.files} == set(wanted)
    for rel, data in wanted.items():
        assert (dest / rel).read_bytes() == data
    assert not (dest / "pytorch_model.bin").exists()
    assert json.loads((dest / FETCH_MANIFEST).read_text())["uri"] == inp.uri
    counts = {rel: s3_server.get_object_count(bucket, f"models/m1/{rel}") for rel in wanted}
    assert counts == {rel: 1 for rel in wanted}

    again, fetched_again = fetch_input(inp, _storage(s3_server), _env(s3_server))
    assert not fetched_again and again == manifest
    assert {rel: s3_server.get_object_count(bucket, f"models/m1/{rel}") for rel in wanted} == counts


def test_a_changed_object_is_fetched_again_and_only_it(s3_server, bucket, tmp_path):
    _put(s3_server, bucket, "models/m2", MODEL_FILES)
    inp = _model_input(f"s3://{bucket}/models/m2", tmp_path)
    fetch_input(inp, _storage(s3_server), _env(s3_server))
    _put(s3_server, bucket, "models/m2", {"tokenizer.json": b'{"version": "2.0"}'})
    _, fetched = fetch_input(inp, _storage(s3_server), _env(s3_server))
    assert fetched
    assert (Path(inp.dest) / "tokenizer.json").read_bytes() == b'{"version": "2.0"}'
    assert s3_server.get_object_count(bucket, "models/m2/tokenizer.json") == 2
    assert s3_server.get_object_count(bucket, "models/m2/model.safetensors") == 1


def test_an_interrupted_fetch_resumes_after_the_files_it_completed(s3_server, bucket, tmp_path, monkeypatch):
    _put(s3_server, bucket, "models/m3", MODEL_FILES)
    inp = _model_input(f"s3://{bucket}/models/m3", tmp_path)
    real = fetch_mod.S3Store.download
    calls: list[str] = []

    def failing_second(self, b, key, dest, **kw):
        calls.append(key)
        if len(calls) == 2:
            raise StorageError(f"s3://{b}/{key}", "Unreachable", "connection reset")
        return real(self, b, key, dest, **kw)

    monkeypatch.setattr(fetch_mod.S3Store, "download", failing_second)
    with pytest.raises(StorageError) as err:
        fetch_input(inp, _storage(s3_server), _env(s3_server))
    assert not err.value.terminal and read_manifest(Path(inp.dest)) is None
    monkeypatch.setattr(fetch_mod.S3Store, "download", real)
    _, fetched = fetch_input(inp, _storage(s3_server), _env(s3_server))
    assert fetched
    first = calls[0].removeprefix("models/m3/")
    assert s3_server.get_object_count(bucket, calls[0]) == 1, f"{first} was downloaded again"
    assert (Path(inp.dest) / "model.safetensors").read_bytes() == MODEL_FILES["model.safetensors"]


def test_a_wrong_secret_is_forbidden_terminal_and_never_quoted(s3_server, bucket, tmp_path):
    _put(s3_server, bucket, "models/m4", MODEL_FILES)
    inp = _model_input(f"s3://{bucket}/models/m4", tmp_path)
    wrong = "WRONG-secret-" + uuid.uuid4().hex
    with pytest.raises(StorageError) as err:
        fetch_input(inp, _storage(s3_server), _env(s3_server, secret=wrong))
    e = err.value
    assert e.reason == "Forbidden" and e.terminal and e.status == 403
    assert inp.uri in str(e)
    for text in (str(e), repr(e)):
        assert wrong not in text and s3_server.secret_key not in text


@pytest.mark.parametrize("files,prefix,reason,words", [
    ({"weights.safetensors": b"x"}, "models/nocfg", "Invalid", "config.json"),
    ({}, "models/missing", "NotFound", "no object"),
])
def test_not_a_model_and_an_empty_prefix_are_refused(s3_server, bucket, tmp_path, files, prefix, reason, words):
    _put(s3_server, bucket, prefix, files)
    inp = _model_input(f"s3://{bucket}/{prefix}", tmp_path)
    with pytest.raises(StorageError) as err:
        fetch_input(inp, _storage(s3_server), _env(s3_server))
    assert err.value.reason == reason and err.value.terminal and words in str(err.value)


def test_gsm8k_from_one_object_with_a_field_mapping(s3_server, bucket, tmp_path):
    data = (shared_dir() / "datasets" / "gsm8k" / "test.jsonl").read_bytes()
    s3_server.client().put_object(Bucket=bucket, Key="data/gsm8k/test.jsonl", Body=data)
    uri = f"s3://{bucket}/data/gsm8k/test.jsonl"
    src = DataSource(uri=uri, fields={"prompt": "question", "groundTruth": "answer"})
    inp = Input("spec.dataset.train.uri", uri, "dataset", fetched_dir(uri, str(tmp_path / "inputs")))
    manifest, _ = fetch_input(inp, _storage(s3_server), _env(s3_server))
    assert [f.path for f in manifest.files] == ["test.jsonl"] and manifest.bytes == len(data)
    tasks = load_path(src, Path(inp.dest), "spec.dataset.train")
    assert len(tasks) == 1319
    assert tasks[0].prompt.startswith("Janet") and str(tasks[0].ground_truth).endswith("#### 18")


def test_a_pushed_model_reads_back_byte_for_byte_and_a_second_push_uploads_nothing(s3_server, bucket, tmp_path):
    src = tmp_path / "final"
    for rel, data in MODEL_FILES.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    out = OutputSpec(uri=f"s3://{bucket}/runs/job-1")
    rec = push_dir(src, out, _storage(s3_server), environ=_env(s3_server))
    assert rec.uri == f"s3://{bucket}/runs/job-1/final" and rec.files == len(MODEL_FILES)
    assert rec.uploaded == len(MODEL_FILES)
    s3 = s3_server.client()
    for rel, data in MODEL_FILES.items():
        assert s3.get_object(Bucket=bucket, Key=f"runs/job-1/final/{rel}")["Body"].read() == data
    assert push_dir(src, out, _storage(s3_server), environ=_env(s3_server)).uploaded == 0
    (src / "tokenizer.json").write_bytes(b'{"changed": true}')
    assert push_dir(src, out, _storage(s3_server), environ=_env(s3_server)).uploaded == 1


def test_a_push_with_a_wrong_secret_fails_at_once_naming_the_uri(s3_server, bucket, tmp_path):
    src = tmp_path / "final"
    src.mkdir()
    (src / "config.json").write_text("{}")
    wrong = "WRONG-" + uuid.uuid4().hex
    with pytest.raises(StorageError) as err:
        push_dir(src, OutputSpec(uri=f"s3://{bucket}/runs/x"), _storage(s3_server),
                 environ=_env(s3_server, secret=wrong))
    assert err.value.reason == "Forbidden" and bucket in str(err.value) and wrong not in str(err.value)
