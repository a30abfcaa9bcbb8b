"""``hf://`` storage (rft_runtime.storage.hf) through the real ``huggingface_hub`` client against a real
Hub-compatible server on loopback (olah, offline, serving git repositories the tests write; see
tests/support/hubserver.py): resolving branches, tags and shas, listing files with their sizes and
shas, downloading models and datasets byte for byte (and not again once complete, counted in the
server's own access log), errors, and that no token reaches an error's text.

olah cannot answer 401/403 (it checks no credentials) nor take uploads (it has no upload routes): the
mapping of those answers is checked on responses built here (the last tests), and an upload against
olah is checked to fail with a clean error; a successful upload is not tested against any server."""

from __future__ import annotations

import errno
import hashlib
import os
import traceback
from pathlib import Path

import httpx
import pytest
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
)

from rft_runtime.storage.errors import StorageError
from rft_runtime.storage.hf import HubFile, HubSettings, download, hf_uri, list_files, resolve, storage_error, upload
from tests.support.hubserver import HubServer, blob_id
from tests.support.ports import free_port

TOKEN = "hf_TestTokenThatMustNeverBeShown0123456789"
MODEL = "acme/tiny-model"
DATASET = "acme/tiny-math"
WEIGHTS = hashlib.sha256(b"w").digest() * 8192  # 256 KiB of binary: stored in LFS, as on the Hub
MODEL_V1 = {
    "config.json": b'{"model_type": "qwen2", "hidden_size": 8}\n',
    "model.safetensors": WEIGHTS,
    "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}\n',
    "tokenizer_config.json": b'{"eos_token": "</s>"}\n',
    "nested/dir/notes.txt": b"a file two directories down\n",
}
MODEL_V2 = {**MODEL_V1, "config.json": b'{"model_type": "qwen2", "hidden_size": 16}\n'}
DATA = {
    "train.jsonl": b"".join(b'{"prompt": "%d+%d=", "answer": "%d"}\n' % (i, i, 2 * i) for i in range(200)),
    "data/test-00000-of-00001.parquet": b"PAR1" + bytes(range(256)) * 4 + b"PAR1",
}


@pytest.fixture(scope="module")
def repos(hub_server: HubServer) -> dict[str, str]:
    """The model (two commits on main, tag v1 on the first, a branch dev) and the dataset; their shas."""
    v1 = hub_server.add_model_repo(MODEL, MODEL_V1)
    hub_server.tag(MODEL, "v1", v1)
    v2 = hub_server.add_model_repo(MODEL, MODEL_V2)
    dev = hub_server.add_model_repo(MODEL, {**MODEL_V2, "extra.txt": b"only on dev\n"}, branch="dev")
    data = hub_server.add_dataset_repo(DATASET, DATA)
    return {"v1": v1, "main": v2, "dev": dev, "data": data}


@pytest.fixture()
def hub(hub_server: HubServer) -> HubSettings:
    return HubSettings(endpoint=hub_server.endpoint, token=TOKEN)


def _files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` but huggingface_hub's bookkeeping (``.cache/``)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".cache" not in p.relative_to(root).parts}


def _clean(e: StorageError) -> None:
    """Neither the token nor anything of the library's exception reaches the error's text."""
    text = str(e) + repr(e) + "".join(traceback.format_exception(e))
    assert TOKEN not in text and "hunter2" not in text, text


def test_resolve_main_a_tag_a_branch_and_a_sha(hub, repos):
    assert resolve(hub, MODEL, "model", None) == repos["main"]
    assert resolve(hub, MODEL, "model", "main") == repos["main"]
    assert resolve(hub, MODEL, "model", "v1") == repos["v1"]
    assert resolve(hub, MODEL, "model", "dev") == repos["dev"]
    assert resolve(hub, MODEL, "model", repos["v1"]) == repos["v1"]
    assert resolve(hub, DATASET, "dataset", None) == repos["data"]


def test_a_wrong_revision_is_revision_not_found(hub, repos):
    with pytest.raises(StorageError) as e:
        resolve(hub, MODEL, "model", "no-such-branch")
    assert e.value.reason == "RevisionNotFound" and e.value.terminal
    assert str(e.value).startswith(f"hf://{MODEL}@no-such-branch: ")
    _clean(e.value)


@pytest.mark.parametrize("repo_type", ["model", "dataset"])
def test_a_missing_repository_is_not_found(hub, repos, repo_type):
    with pytest.raises(StorageError) as e:
        resolve(hub, "acme/no-such-repo", repo_type, None)
    assert e.value.reason == "NotFound" and e.value.terminal
    assert str(e.value).startswith(hf_uri("acme/no-such-repo", repo_type) + ": ")
    _clean(e.value)
    # The model's name is not a dataset's.
    with pytest.raises(StorageError) as e:
        resolve(hub, MODEL if repo_type == "dataset" else DATASET, repo_type, None)
    assert e.value.reason == "NotFound"


def test_list_files_with_sizes_and_the_shas_the_hub_reports(hub, repos):
    got = list_files(hub, MODEL, "model", repos["v1"])
    lfs = {"model.safetensors"}
    assert got == [HubFile(path, len(data), hashlib.sha256(data).hexdigest() if path in lfs else blob_id(data))
                   for path, data in sorted(MODEL_V1.items())]
    paths = [f.path for f in list_files(hub, MODEL, "model", repos["dev"])]
    assert "extra.txt" in paths
    data = {f.path: f.size for f in list_files(hub, DATASET, "dataset", repos["data"])}
    assert data == {path: len(content) for path, content in DATA.items()}


def test_download_a_model_byte_for_byte_and_not_again_when_complete(hub, hub_server, repos, tmp_path):
    dest = tmp_path / "model"
    download(hub, MODEL, "model", repos["main"], dest)
    assert _files(dest) == MODEL_V2
    assert not any(p.is_symlink() for p in dest.rglob("*"))
    assert all(hub_server.download_count(MODEL, path) == 1 for path in MODEL_V2), hub_server.requests()

    asked = len(hub_server.requests())
    download(hub, MODEL, "model", repos["main"], dest)  # complete: nothing is asked of the server
    assert _files(dest) == MODEL_V2
    assert len(hub_server.requests()) == asked, hub_server.requests()[asked:]

    (dest / "model.safetensors").unlink()  # a file lost: only it is fetched again
    download(hub, MODEL, "model", repos["main"], dest)
    assert _files(dest) == MODEL_V2
    assert hub_server.download_count(MODEL, "model.safetensors") == 2
    assert hub_server.download_count(MODEL, "config.json") == 1


def test_download_an_older_commit_and_a_dataset(hub, hub_server, repos, tmp_path):
    download(hub, MODEL, "model", repos["v1"], tmp_path / "v1")
    assert _files(tmp_path / "v1") == MODEL_V1
    download(hub, DATASET, "dataset", repos["data"], tmp_path / "data")
    assert _files(tmp_path / "data") == DATA
    assert hub_server.download_count(DATASET, "train.jsonl", "dataset") == 1


def test_download_some_files(hub, hub_server, repos, tmp_path):
    before = hub_server.download_count(DATASET, "data/test-00000-of-00001.parquet", "dataset")
    download(hub, DATASET, "dataset", repos["data"], tmp_path / "d", files=["train.jsonl"])
    assert _files(tmp_path / "d") == {"train.jsonl": DATA["train.jsonl"]}
    assert hub_server.download_count(DATASET, "data/test-00000-of-00001.parquet", "dataset") == before
    with pytest.raises(StorageError) as e:
        download(hub, DATASET, "dataset", repos["data"], tmp_path / "e", files=["train.jsonl", "nope/*.jsonl"])
    assert e.value.reason == "NotFound" and "nope/*.jsonl" in str(e.value)
    _clean(e.value)


def test_download_takes_a_commit_sha_only(hub, repos, tmp_path):
    with pytest.raises(StorageError) as e:
        download(hub, MODEL, "model", "main", tmp_path)
    assert e.value.reason == "Invalid"


def test_an_unreachable_hub_is_not_terminal_and_hides_credentials(repos, tmp_path):
    settings = HubSettings(endpoint=f"http://user:hunter2@127.0.0.1:{free_port()}", token=TOKEN)
    for call in (lambda: resolve(settings, MODEL, "model", None),
                 lambda: list_files(settings, MODEL, "model", repos["main"]),
                 lambda: download(settings, MODEL, "model", repos["main"], tmp_path / "m")):
        with pytest.raises(StorageError) as e:
            call()
        assert e.value.reason == "Unreachable" and not e.value.terminal
        assert "127.0.0.1" in str(e.value)
        _clean(e.value)
    assert TOKEN not in repr(settings)


def test_upload_to_a_server_without_upload_routes_fails_cleanly(hub, tmp_path):
    """olah has no upload API (POST /api/repos/create answers 405); a successful upload is untested."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "adapter_config.json").write_text("{}")
    with pytest.raises(StorageError) as e:
        upload(hub, "acme/trained", "model", tmp_path / "out", revision="run-1", private=True, message="step 10")
    assert e.value.status == 405 and e.value.reason == "Invalid" and e.value.terminal
    assert str(e.value).startswith("hf://acme/trained@run-1: ")
    _clean(e.value)
    with pytest.raises(StorageError) as e:
        upload(hub, "acme/trained", "model", tmp_path / "missing", revision=None, private=True, message="m")
    assert e.value.reason == "Invalid"


def test_invalid_arguments(hub):
    with pytest.raises(StorageError) as e:
        resolve(hub, MODEL, "space", None)
    assert e.value.reason == "Invalid"
    with pytest.raises(StorageError) as e:
        resolve(hub, "a/b/c", "model", None)
    assert e.value.reason == "Invalid"


# Answers olah cannot give (it checks no credentials): the mapping, on responses built here.

def _response(status: int, code: str | None = None) -> httpx.Response:
    headers = {"x-error-code": code, "x-error-message": f"token {TOKEN} refused"} if code else {}
    return httpx.Response(status, headers=headers, request=httpx.Request("GET", "http://hub.invalid/api/models/a/b"))


@pytest.mark.parametrize(("exc", "reason", "status"), [
    (GatedRepoError(f"gated {TOKEN}", response=_response(403, "GatedRepo")), "Forbidden", 403),
    (RepositoryNotFoundError(f"nf {TOKEN}", response=_response(401, "RepoNotFound")), "NotFound", 401),
    (HfHubHTTPError(f"unauthorized {TOKEN}", response=_response(401)), "Unauthorized", 401),
    (HfHubHTTPError(f"forbidden {TOKEN}", response=_response(403)), "Forbidden", 403),
    (HfHubHTTPError(f"down {TOKEN}", response=_response(503)), "ServerError", 503),
    (HfHubHTTPError(f"slow down {TOKEN}", response=_response(429)), "ServerError", 429),
    (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), "NoSpace", None),
])
def test_the_mapping_of_answers_olah_cannot_give(exc, reason, status):
    err = storage_error("hf://a/b", exc, HubSettings(token=TOKEN))
    assert err is not None and (err.reason, err.status) == (reason, status)
    assert err.terminal == (reason in {"Forbidden", "NotFound", "Unauthorized"})
    _clean(err)
    wrapped = LocalEntryNotFoundError("nothing on disk")  # how snapshot_download reports a failed API call
    wrapped.__cause__ = exc
    again = storage_error("hf://a/b", wrapped, HubSettings(token=TOKEN))
    assert again is not None and again.reason == reason
