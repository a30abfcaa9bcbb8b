"""``hf://`` models and datasets: the Hugging Face Hub (or a Hub-compatible server, ``HF_ENDPOINT`` or
:attr:`HubSettings.endpoint`) through ``huggingface_hub``'s public API.

- :func:`resolve`: the commit sha a revision (branch, tag or sha) names.
- :func:`list_files`: a commit's files, their sizes and the sha the Hub reports for each.
- :func:`download`: a commit's files (all, or some) into a local directory; ``huggingface_hub`` resumes
  partial files and, for a pinned commit, skips files already complete there without asking the Hub.
- :func:`upload`: a local directory as one commit on a branch, the repository and branch created when
  missing.

The endpoint and token are passed to every call (``os.environ`` is never changed); a token of None sends
none (not even one saved by ``hf auth login``). ``huggingface_hub`` sends no telemetry from these calls.
Every failure is a :class:`~rft_runtime.storage.errors.StorageError` whose text is built here from the
status and the exception's class, never from the library's message (which quotes URLs and server text).
"""

from __future__ import annotations

import contextlib
import errno
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import httpx
from huggingface_hub import HfApi, snapshot_download
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import (
    DisabledRepoError,
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile

from .errors import StorageError

REPO_TYPES = ("model", "dataset")
DEFAULT_REVISION = "main"
LIBRARY_NAME = "rft-runtime"
_SHA = re.compile(r"[0-9a-f]{40}")
T = TypeVar("T")


@dataclass(frozen=True)
class HubSettings:
    """Where the Hub is and how to authenticate. ``endpoint`` None: ``HF_ENDPOINT``, else huggingface.co;
    ``token`` None: anonymous. The token is left out of ``repr``."""

    endpoint: str | None = None
    token: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class HubFile:
    """One file of a commit: its path, size in bytes and ``etag``, the sha the Hub reports for it (the
    LFS sha256 of an LFS file, the git blob sha1 of any other)."""

    path: str
    size: int
    etag: str


def hf_uri(repo_id: str, repo_type: str, revision: str | None = None) -> str:
    """``hf://[datasets/]ORG/NAME[@REVISION]``: how messages name a repository."""
    prefix = "datasets/" if repo_type == "dataset" else ""
    return f"hf://{prefix}{repo_id}" + (f"@{revision}" if revision else "")


def _api(settings: HubSettings) -> HfApi:
    return HfApi(endpoint=settings.endpoint, token=_token(settings), library_name=LIBRARY_NAME)


def _token(settings: HubSettings) -> str | bool:
    # False, not None: None would let huggingface_hub pick up HF_TOKEN or a token saved on this machine.
    return settings.token or False


def _where(settings: HubSettings) -> str:
    """The endpoint's scheme, host and port (never a user or password in it), for messages."""
    url = urlsplit(settings.endpoint or "https://huggingface.co")
    host = url.hostname or "?"
    if ":" in host:
        host = f"[{host}]"
    return f"{url.scheme}://{host}" + (f":{url.port}" if url.port else "")


def _check(uri: str, repo_id: str, repo_type: str) -> None:
    if repo_type not in REPO_TYPES:
        raise StorageError(uri, "Invalid", f"repository type {repo_type!r} is not one of {', '.join(REPO_TYPES)}")
    if repo_id.count("/") > 1 or not repo_id.strip("/"):
        raise StorageError(uri, "Invalid", "a repository is named ORG/NAME (or NAME)")


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def _http_error(uri: str, exc: HfHubHTTPError) -> StorageError:
    """An HTTP answer from the Hub, by class and status (never by its text)."""
    status = _status(exc)
    if isinstance(exc, GatedRepoError):
        return StorageError(uri, "Forbidden", "the repository is gated: the token's account has not been "
                            "granted access", status)
    if isinstance(exc, DisabledRepoError):
        return StorageError(uri, "Forbidden", "the repository is disabled", status)
    if isinstance(exc, RepositoryNotFoundError):
        return StorageError(uri, "NotFound", "repository not found (or private, and not visible with the "
                            "credentials given)", status)
    if isinstance(exc, RevisionNotFoundError):
        return StorageError(uri, "RevisionNotFound", "revision not found in the repository", status)
    if isinstance(exc, EntryNotFoundError):
        return StorageError(uri, "NotFound", "file not found in the repository at this revision", status)
    if status == 401:
        return StorageError(uri, "Unauthorized", "the Hub refused the credentials (HTTP 401)", status)
    if status == 403:
        return StorageError(uri, "Forbidden", "the credentials do not grant access (HTTP 403)", status)
    if status == 404:
        return StorageError(uri, "NotFound", "not found (HTTP 404)", status)
    if status is not None and 400 <= status < 500 and status not in (408, 429):
        return StorageError(uri, "Invalid", f"the Hub rejected the request (HTTP {status})", status)
    return StorageError(uri, "ServerError", f"the Hub failed the request (HTTP {status})", status)


def storage_error(uri: str, exc: BaseException, settings: HubSettings) -> StorageError | None:
    """The :class:`StorageError` for an exception a ``huggingface_hub`` call raised, or None when it is
    none of the failures a store reports (a bug: let it propagate)."""
    # snapshot_download and hf_hub_download wrap what went wrong (an outage, a 5xx) in a
    # LocalEntryNotFoundError ("and nothing usable on disk"): judge the cause.
    while isinstance(exc, LocalEntryNotFoundError) and exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, HfHubHTTPError):
        return _http_error(uri, exc)
    if isinstance(exc, LocalEntryNotFoundError):
        return StorageError(uri, "Unreachable", f"cannot reach the Hub at {_where(settings)}")
    if isinstance(exc, EntryNotFoundError):
        return StorageError(uri, "NotFound", "file not found in the repository at this revision")
    if isinstance(exc, (httpx.TransportError, OfflineModeIsEnabled, ConnectionError, TimeoutError)):
        return StorageError(uri, "Unreachable", f"cannot reach the Hub at {_where(settings)} "
                            f"({type(exc).__name__})")
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageError(uri, "NoSpace", "no space left on the local disk")
    if isinstance(exc, HFValidationError):
        return StorageError(uri, "Invalid", "not a valid repository id or revision")
    if isinstance(exc, httpx.HTTPStatusError):
        return StorageError(uri, "ServerError", f"the Hub failed the request (HTTP {_status(exc)})", _status(exc))
    return None


def _call(uri: str, settings: HubSettings, fn: Callable[[], T]) -> T:
    """``fn()``, its failures raised as :class:`StorageError` (without the library's exception chained:
    its text quotes URLs and server messages). The runtime's processes run with ``HF_HUB_OFFLINE=1`` so
    that nothing else reaches a hub; the calls made here are the deliberate exception."""
    try:
        with _online():
            return fn()
    except Exception as e:
        err = storage_error(uri, e, settings)
        if err is None:
            raise
        raise err from None


@contextlib.contextmanager
def _online() -> Iterator[None]:
    """``huggingface_hub`` allowed to reach the hub meanwhile, whatever ``HF_HUB_OFFLINE`` said."""
    offline = hf_constants.HF_HUB_OFFLINE
    hf_constants.HF_HUB_OFFLINE = False
    try:
        yield
    finally:
        hf_constants.HF_HUB_OFFLINE = offline


def _repo_exists(api: HfApi, repo_id: str, repo_type: str) -> bool:
    try:
        with _online():
            api.list_repo_refs(repo_id, repo_type=repo_type)
    except Exception:
        return False
    return True


def resolve(settings: HubSettings, repo_id: str, repo_type: str, revision: str | None) -> str:
    """The commit sha that ``revision`` (a branch, tag or sha; None: ``main``) of ``repo_id`` names."""
    uri = hf_uri(repo_id, repo_type, revision)
    _check(uri, repo_id, repo_type)
    api = _api(settings)
    try:
        info = _call(uri, settings, lambda: api.repo_info(repo_id, repo_type=repo_type,
                                                          revision=revision or DEFAULT_REVISION))
    except StorageError as e:
        # A mirror (olah, offline) answers a missing branch or tag as a missing repository (401
        # RepoNotFound); the Hub itself says RevisionNotFound. The refs tell the two apart.
        if e.reason == "NotFound" and _repo_exists(api, repo_id, repo_type):
            raise StorageError(uri, "RevisionNotFound", "revision not found in the repository", e.status) from None
        raise
    if not info.sha or not _SHA.fullmatch(info.sha):
        raise StorageError(uri, "ServerError", "the Hub answered without the revision's commit sha")
    return info.sha


def list_files(settings: HubSettings, repo_id: str, repo_type: str, revision_sha: str) -> list[HubFile]:
    """Every file of commit ``revision_sha`` of ``repo_id``, by path."""
    uri = hf_uri(repo_id, repo_type, revision_sha)
    _check(uri, repo_id, repo_type)
    api = _api(settings)
    entries = _call(uri, settings, lambda: list(api.list_repo_tree(repo_id, repo_type=repo_type,
                                                                   revision=revision_sha, recursive=True)))
    files = []
    for entry in entries:
        if isinstance(entry, RepoFile):
            etag = entry.lfs.sha256 if entry.lfs is not None else entry.blob_id
            files.append(HubFile(path=entry.path, size=int(entry.size), etag=etag))
    return sorted(files, key=lambda f: f.path)


def _exact(path: str) -> str:
    """An fnmatch pattern matching ``path`` alone (``*``, ``?`` and ``[`` taken literally)."""
    return "".join(f"[{c}]" if c in "*?[]" else c for c in path)


def download(settings: HubSettings, repo_id: str, repo_type: str, revision_sha: str, dest: Path,
             files: list[str] | None = None) -> None:
    """Commit ``revision_sha`` of ``repo_id`` into ``dest``: every file, or the paths in ``files`` (each
    must exist). Files land as plain files under ``dest`` (no links into a shared cache);
    ``huggingface_hub`` keeps its bookkeeping (partial downloads, what is complete) in
    ``dest/.cache/huggingface``, so a second call finds complete files there and fetches nothing."""
    uri = hf_uri(repo_id, repo_type, revision_sha)
    _check(uri, repo_id, repo_type)
    if not _SHA.fullmatch(revision_sha):
        raise StorageError(uri, "Invalid", "downloads take a full commit sha (resolve the revision first)")
    if files is not None and not files:
        return
    dest.mkdir(parents=True, exist_ok=True)
    patterns = [_exact(f) for f in files] if files is not None else None
    _call(uri, settings, lambda: snapshot_download(
        repo_id, repo_type=repo_type, revision=revision_sha, local_dir=dest,
        cache_dir=dest / ".cache" / "huggingface" / "hub", endpoint=settings.endpoint, token=_token(settings),
        allow_patterns=patterns, library_name=LIBRARY_NAME))
    missing = [f for f in files or [] if not (dest / f).is_file()]
    if missing:
        raise StorageError(uri, "NotFound", f"not in the repository at this revision: {', '.join(sorted(missing))}")


def upload(settings: HubSettings, repo_id: str, repo_type: str, folder: Path, *, revision: str | None,
           private: bool, message: str) -> str:
    """Push ``folder`` as one commit on branch ``revision`` (None: ``main``) of ``repo_id`` and return its
    sha. The repository is created when missing (``private`` then says how), the branch too (from
    ``main``)."""
    branch = revision or DEFAULT_REVISION
    uri = hf_uri(repo_id, repo_type, revision)
    _check(uri, repo_id, repo_type)
    if not folder.is_dir():
        raise StorageError(uri, "Invalid", f"nothing to upload: {folder} is not a directory")
    api = _api(settings)
    _call(uri, settings, lambda: api.create_repo(repo_id, repo_type=repo_type, private=private, exist_ok=True))
    if branch != DEFAULT_REVISION:
        _call(uri, settings, lambda: api.create_branch(repo_id, repo_type=repo_type, branch=branch, exist_ok=True))
    info = _call(uri, settings, lambda: api.upload_folder(repo_id=repo_id, repo_type=repo_type, folder_path=folder,
                                                          revision=branch, commit_message=message))
    if not info.oid:
        raise StorageError(uri, "ServerError", "the Hub answered the commit without its sha")
    return info.oid
