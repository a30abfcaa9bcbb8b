"""Fetching a job's hf:// and s3:// models and datasets into local directories, once.

Each input (:class:`rft_api.layout.Input`) goes to its own directory. The remote side is listed first
(an hf:// revision is resolved to its commit); a directory whose manifest
(:data:`rft_api.layout.FETCH_MANIFEST`) lists the same files, sizes and etags, all present, is not
fetched again, so a restart or a second run costs one listing and no download. Otherwise each file
missing or different is downloaded (an S3 object resumes its partial ``.part`` file) and the manifest
is written last. What is fetched:

- a model: every file of the repository or prefix, less the weight formats the runtime does not read
  when safetensors are there (``.bin``, ``.pt``, ``.gguf``, ...); it must hold a ``config.json``;
- a dataset: an S3 object itself, or, for a prefix or a dataset repository, every data file
  (JSONL, JSON, parquet, CSV) and the dataset card; the loader picks the split's files among them
  (:func:`rft_runtime.data.split_files`), every row validated by ``rft fetch`` once.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from rft_api.layout import FETCH_MANIFEST, Input
from rft_api.spec import StorageSpec
from rft_api.storage import HubUri, S3Uri, parse_uri

from . import hf
from .errors import StorageError
from .s3 import S3Store
from .settings import hub_settings, s3_settings

__all__ = ["FetchedFile", "Manifest", "fetch_input", "read_manifest"]

_SKIPPED_WEIGHTS = (".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx", ".ot", ".tflite", ".ckpt")
_DATA_SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet", ".csv")


@dataclass(frozen=True)
class FetchedFile:
    path: str
    size: int
    etag: str


@dataclass(frozen=True)
class Manifest:
    uri: str
    revision: str | None
    files: tuple[FetchedFile, ...]

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> str:
        return json.dumps({"uri": self.uri, "revision": self.revision, "files": [asdict(f) for f in self.files]},
                          indent=1)


def read_manifest(dest: Path) -> Manifest | None:
    """The manifest of a completed fetch into ``dest`` (None when there is none, or it is unreadable)."""
    try:
        doc = json.loads((dest / FETCH_MANIFEST).read_text())
        files = tuple(FetchedFile(str(f["path"]), int(f["size"]), str(f["etag"])) for f in doc["files"])
        return Manifest(str(doc["uri"]), doc.get("revision"), files)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_manifest(dest: Path, manifest: Manifest) -> None:
    tmp = dest / f"{FETCH_MANIFEST}.tmp"
    tmp.write_text(manifest.to_json())
    os.replace(tmp, dest / FETCH_MANIFEST)


def select_model_files(paths: list[str]) -> list[str]:
    """A model's files worth fetching: all, less other weight formats when safetensors are there."""
    paths = [p for p in paths if not p.startswith(".") and "/." not in p]
    if any(p.endswith(".safetensors") for p in paths):
        paths = [p for p in paths if not p.endswith(_SKIPPED_WEIGHTS)]
    return paths


def select_dataset_files(paths: list[str]) -> list[str]:
    """A dataset directory's files worth fetching: its data files (JSONL, JSON, parquet, CSV) and its
    card (``README.md``, whose ``configs`` may name a split's files). Every split and config is
    fetched; the loader picks the split's files (:func:`rft_runtime.data.split_files`)."""
    return [p for p in paths if p.endswith(_DATA_SUFFIXES) or p.endswith(".jsonl.gz") or p == "README.md"]


def _check_model(inp: Input, files: list[str]) -> None:
    if "config.json" not in files:
        raise StorageError(inp.uri, "Invalid", "not a model: there is no config.json at its top level (a model is "
                                               "a Hugging Face model directory: config.json, safetensors weights, "
                                               "tokenizer files)")


def _selected(inp: Input, listed: list[FetchedFile]) -> list[FetchedFile]:
    by_path = {f.path: f for f in listed}
    if inp.kind == "model":
        chosen = select_model_files(sorted(by_path))
        _check_model(inp, chosen)
    else:
        chosen = select_dataset_files(sorted(by_path))
        if not any(p != "README.md" for p in chosen):
            raise StorageError(inp.uri, "NotFound", "no data file (jsonl, json, parquet, csv) there")
    return [by_path[p] for p in chosen]


def _complete(dest: Path, manifest: Manifest, wanted: list[FetchedFile], revision: str | None) -> bool:
    if manifest.revision != revision or set(manifest.files) != set(wanted):
        return False
    return all((dest / f.path).is_file() and (dest / f.path).stat().st_size == f.size for f in wanted)


Progress = Callable[[int], None]
_DONE_LOG = ".rft-fetch.done"
"""Each file a fetch completed, one JSON line each: an interrupted fetch resumes after them."""


def _done_so_far(dest: Path) -> set[FetchedFile]:
    try:
        lines = (dest / _DONE_LOG).read_text().splitlines()
    except OSError:
        return set()
    out = set()
    for line in lines:
        try:
            doc = json.loads(line)
            out.add(FetchedFile(str(doc["path"]), int(doc["size"]), str(doc["etag"])))
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by the interruption
    return out


def _fetch_s3(inp: Input, uri: S3Uri, dest: Path, storage: StorageSpec | None, environ: Mapping[str, str] | None,
              on_bytes: Progress | None, previous: Manifest | None) -> Manifest:
    store = S3Store(s3_settings(storage, environ))
    listed = store.list(uri.bucket, uri.prefix)
    if not listed:
        raise StorageError(inp.uri, "NotFound", "no object under this prefix")
    wanted = _selected(inp, [FetchedFile(f.path, f.size, f.etag) for f in listed])
    if previous is not None and _complete(dest, previous, wanted, None):
        return previous
    single = len(listed) == 1 and not uri.prefix.endswith("/") and store.head(uri.bucket, uri.prefix) is not None
    done = (set(previous.files) if previous is not None else set()) | _done_so_far(dest)
    with (dest / _DONE_LOG).open("a") as log:
        for f in wanted:
            target = dest / f.path
            if f in done and target.is_file() and target.stat().st_size == f.size:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            key = uri.prefix if single else uri.key(f.path)
            store.download(uri.bucket, key, target, size=f.size, etag=f.etag, on_bytes=on_bytes)
            log.write(json.dumps(asdict(f)) + "\n")
            log.flush()
    return Manifest(inp.uri, None, tuple(wanted))


def _fetch_hub(inp: Input, uri: HubUri, dest: Path, storage: StorageSpec | None, environ: Mapping[str, str] | None,
               on_bytes: Progress | None, previous: Manifest | None) -> Manifest:
    settings = hub_settings(storage, environ)
    sha = hf.resolve(settings, uri.repo_id, uri.repo_type, uri.revision)
    listed = hf.list_files(settings, uri.repo_id, uri.repo_type, sha)
    wanted = _selected(inp, [FetchedFile(f.path, f.size, f.etag) for f in listed])
    if previous is not None and _complete(dest, previous, wanted, sha):
        return previous
    hf.download(settings, uri.repo_id, uri.repo_type, sha, dest, files=[f.path for f in wanted])
    if on_bytes is not None:
        on_bytes(sum(f.size for f in wanted))
    return Manifest(inp.uri, sha, tuple(wanted))


def fetch_input(inp: Input, storage: StorageSpec | None, environ: Mapping[str, str] | None = None,
                on_bytes: Progress | None = None) -> tuple[Manifest, bool]:
    """Fetch ``inp`` into ``inp.dest`` unless a complete copy is there; returns its manifest and
    whether anything was downloaded. Raises :class:`StorageError` (never with a credential in it);
    a full local disk is reason ``NoSpace``."""
    dest = Path(inp.dest)
    dest.mkdir(parents=True, exist_ok=True)
    uri = parse_uri(inp.uri, ("hf", "s3"))
    before = read_manifest(dest)
    try:
        if isinstance(uri, S3Uri):
            manifest = _fetch_s3(inp, uri, dest, storage, environ, on_bytes, before)
        elif isinstance(uri, HubUri):
            manifest = _fetch_hub(inp, uri, dest, storage, environ, on_bytes, before)
        else:
            raise StorageError(inp.uri, "Invalid", "pvc:// inputs are read in place, not fetched")
    except OSError as e:
        if e.errno == 28:  # ENOSPC
            raise StorageError(inp.uri, "NoSpace", f"the local disk is full ({dest})") from None
        raise
    if manifest is before:
        return manifest, False
    _write_manifest(dest, manifest)
    return manifest, True
