"""Fetching a job's hf:// model and dataset through the real huggingface_hub client from a real
hub-compatible server (olah): a revision resolved to its commit, each file fetched once, a dataset's
split and config picked as on the Hub."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rft_api.layout import Input, fetched_dir
from rft_api.spec import DataSource, HuggingFaceStorage, StorageSpec
from rft_runtime.storage.errors import StorageError
from rft_runtime.storage.fetch import fetch_input
from rft_runtime.trainer.datasets import load_path
from tests.support.shared import shared_dir

MODEL = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"], "vocab_size": 8}',
    "model.safetensors": bytes(range(256)) * 64,
    "tokenizer_config.json": b'{"chat_template": "{{ messages }}"}',
    "model.gguf": b"another weight format, not fetched" * 4,
}


def _storage(hub) -> StorageSpec:
    return StorageSpec(hugging_face=HuggingFaceStorage(endpoint=hub.endpoint))


def _input(uri: str, kind: str, tmp_path: Path) -> Input:
    return Input("spec.model.base" if kind == "model" else "spec.dataset.train.uri", uri, kind,  # type: ignore[arg-type]
                 fetched_dir(uri, str(tmp_path / "inputs")))


def _parquet(rows: list[dict]) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


def test_a_model_at_a_tag_is_fetched_once(hub_server, tmp_path):
    sha = hub_server.add_model_repo("org/tiny-llama", MODEL)
    hub_server.tag("org/tiny-llama", "v1")
    inp = _input("hf://org/tiny-llama@v1", "model", tmp_path)
    manifest, fetched = fetch_input(inp, _storage(hub_server), {})
    assert fetched and manifest.revision == sha
    assert {f.path for f in manifest.files} == {"config.json", "model.safetensors", "tokenizer_config.json"}
    for rel in ("config.json", "model.safetensors", "tokenizer_config.json"):
        assert (Path(inp.dest) / rel).read_bytes() == MODEL[rel]
        assert hub_server.download_count("org/tiny-llama", rel) == 1
    assert hub_server.download_count("org/tiny-llama", "model.gguf") == 0
    _, again = fetch_input(inp, _storage(hub_server), {})
    assert not again
    assert hub_server.download_count("org/tiny-llama", "model.safetensors") == 1


def test_a_new_commit_on_the_branch_is_fetched_at_its_new_revision(hub_server, tmp_path):
    hub_server.add_model_repo("org/moving", MODEL)
    inp = _input("hf://org/moving", "model", tmp_path)
    fetch_input(inp, _storage(hub_server), {})
    new = hub_server.add_model_repo("org/moving", {**MODEL, "config.json": b'{"architectures": ["X"]}'})
    manifest, fetched = fetch_input(inp, _storage(hub_server), {})
    assert fetched and manifest.revision == new
    assert json.loads((Path(inp.dest) / "config.json").read_text()) == {"architectures": ["X"]}


@pytest.mark.parametrize("uri,reason", [
    ("hf://org/absent", "NotFound"),
    ("hf://org/tiny-llama2@no-such-branch", "RevisionNotFound"),
])
def test_a_missing_repository_or_revision_is_refused_terminally(hub_server, tmp_path, uri, reason):
    hub_server.add_model_repo("org/tiny-llama2", MODEL)
    with pytest.raises(StorageError) as err:
        fetch_input(_input(uri, "model", tmp_path), _storage(hub_server), {})
    assert err.value.reason == reason and err.value.terminal and uri.split("@")[0] in str(err.value)


def test_gsm8k_as_a_hub_dataset_repository_with_a_config_and_splits(hub_server, tmp_path):
    rows = [json.loads(line) for line in (shared_dir() / "datasets" / "gsm8k" / "test.jsonl").read_text().splitlines()]
    hub_server.add_dataset_repo("openai/gsm8k", {
        "README.md": b"# gsm8k\n",
        "main/train-00000-of-00001.parquet": _parquet(rows[:300]),
        "main/test-00000-of-00001.parquet": _parquet(rows[300:400]),
        "socratic/test-00000-of-00001.parquet": _parquet(rows[400:410]),
    })
    fields = {"prompt": "question", "groundTruth": "answer"}
    for split, n in (("train", 300), ("test", 100)):
        uri = "hf://datasets/openai/gsm8k"
        inp = _input(uri, "dataset", tmp_path)
        fetch_input(inp, _storage(hub_server), {})
        tasks = load_path(DataSource(uri=uri, split=split, config="main", fields=fields), Path(inp.dest),
                          "spec.dataset.train")
        assert len(tasks) == n
        first = rows[0] if split == "train" else rows[300]
        assert tasks[0].prompt == first["question"] and tasks[0].ground_truth == first["answer"]


def test_the_fetch_reaches_the_hub_in_a_process_that_is_otherwise_offline(hub_server, tmp_path, monkeypatch):
    """The runtime's processes run with HF_HUB_OFFLINE=1 (nothing else may reach a hub); the fetch is
    the deliberate exception, and leaves the flag as it found it."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hub_server.add_model_repo("org/offline-proc", MODEL)
    manifest, fetched = fetch_input(_input("hf://org/offline-proc", "model", tmp_path), _storage(hub_server), {})
    assert fetched and len(manifest.files) == 3
    with pytest.raises(StorageError) as err:
        fetch_input(_input("hf://org/offline-proc@nope", "model", tmp_path), _storage(hub_server), {})
    assert err.value.reason == "RevisionNotFound"
    assert constants.HF_HUB_OFFLINE is True
