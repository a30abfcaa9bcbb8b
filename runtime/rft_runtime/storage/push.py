"""Pushing a trained model (a local directory) to ``spec.output.uri``.

- ``s3://BUCKET/PREFIX``: each file to ``PREFIX/<sub>/<path>``. A file already there with the same
  size (and, for an object uploaded in one part, the same MD5) is skipped, so a push that was
  interrupted resumes where it stopped.
- ``hf://ORG/NAME[@BRANCH]``: one commit of the whole directory to the repository (created when
  missing, private unless ``spec.output.private`` is false) on the branch (created when missing).

Transient failures (unreachable, 5xx) are retried with a growing pause; refusals (401, 403, 404) are
not. The caller keeps the model where it is whatever happens here.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from rft_api.spec import OutputSpec, StorageSpec
from rft_api.storage import HubUri, S3Uri, parse_uri

from . import hf
from .errors import StorageError
from .s3 import S3Store
from .settings import hub_settings, s3_settings

__all__ = ["PushRecord", "push_dir"]

ATTEMPTS = 4
FIRST_PAUSE_S = 2.0
T = TypeVar("T")


@dataclass(frozen=True)
class PushRecord:
    uri: str
    """Where the model is now (the S3 prefix of its files, or the repository and branch)."""
    revision: str | None
    """The hub commit (None on S3)."""
    files: int
    bytes: int
    uploaded: int
    """Files sent by this push (the others were already there)."""


def _md5(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(src: Path) -> list[Path]:
    return sorted(p for p in src.rglob("*") if p.is_file() and not p.name.startswith(".rft-"))


def with_retries(what: Callable[[], T], attempts: int = ATTEMPTS, pause_s: float = FIRST_PAUSE_S,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """``what()``, tried again after a transient :class:`StorageError` (``attempts`` times in all, the
    pause doubling); a terminal one is raised at once."""
    for attempt in range(attempts):
        try:
            return what()
        except StorageError as e:
            if e.terminal or attempt == attempts - 1:
                raise
            sleep(pause_s * 2 ** attempt)
    raise AssertionError("unreachable")


def _push_s3(src: Path, uri: S3Uri, sub: str, store: S3Store) -> PushRecord:
    files = _files(src)
    uploaded = 0
    for path in files:
        key = uri.key(f"{sub}/{path.relative_to(src).as_posix()}")
        there = with_retries(lambda key=key: store.head(uri.bucket, key))  # type: ignore[misc]
        size = path.stat().st_size
        if there is not None and there.size == size and ("-" in there.etag or there.etag == _md5(path)):
            continue  # a multipart etag is not the file's MD5: same size and name is taken as the same file
        with_retries(lambda path=path, key=key: store.upload(path, uri.bucket, key))  # type: ignore[misc]
        uploaded += 1
    target = S3Uri(uri.bucket, uri.key(sub))
    return PushRecord(str(target), None, len(files), sum(p.stat().st_size for p in files), uploaded)


def push_dir(src: Path, output: OutputSpec, storage: StorageSpec | None, *, sub: str = "final", message: str = "",
             environ: Mapping[str, str] | None = None) -> PushRecord:
    """Push the directory ``src`` to ``output.uri`` (``sub``: its folder under an S3 prefix)."""
    uri = parse_uri(output.uri, ("hf", "s3"))
    if isinstance(uri, S3Uri):
        return _push_s3(src, uri, sub, S3Store(s3_settings(storage, environ)))
    if not isinstance(uri, HubUri):
        raise StorageError(output.uri, "Invalid", "output.uri must be s3:// or hf://")
    settings = hub_settings(storage, environ)
    files = _files(src)
    sha = with_retries(lambda: hf.upload(settings, uri.repo_id, "model", src, revision=uri.revision,
                                         private=output.private, message=message or f"rft: {sub}"))
    return PushRecord(str(uri), sha, len(files), sum(p.stat().st_size for p in files), len(files))
