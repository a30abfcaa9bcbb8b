"""One storage URI grammar for models, datasets and outputs (pure: parsing only, no I/O).

- ``hf://ORG/NAME[@REVISION]``: a Hugging Face model repository (``NAME`` alone for the few
  repositories without an organisation); ``REVISION`` a branch, tag or commit (default ``main``).
- ``hf://datasets/ORG/NAME[@REVISION]``: a Hugging Face dataset repository (its split and config are
  the data source's ``split`` and ``config``).
- ``s3://BUCKET[/PREFIX]``: an object, or every object under a prefix, in an S3-compatible store
  (endpoint, region, path-style and credentials from ``spec.storage.s3``).
- ``pvc://CLAIM/PATH``: a path on a PersistentVolumeClaim of the job's namespace (mounted read-only;
  nothing is copied). On one machine (``rft run``) a claim is a local directory.

The hub endpoint (``HF_ENDPOINT``) and the credentials come from ``spec.storage``, never from the URI.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Optional, Union

SCHEMES = ("hf://", "s3://", "pvc://")
Scheme = Literal["hf", "s3", "pvc"]

_REPO_PART = r"[A-Za-z0-9](?:[-._A-Za-z0-9]{0,94}[A-Za-z0-9])?"
_REPO = re.compile(rf"^(?:{_REPO_PART}/)?{_REPO_PART}$")
_REVISION = re.compile(r"^[A-Za-z0-9][-._/A-Za-z0-9]{0,254}$")
_BUCKET = re.compile(r"^[a-z0-9][-.a-z0-9]{1,61}[a-z0-9]$")
_CLAIM = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class HubUri:
    repo_id: str
    repo_type: Literal["model", "dataset"]
    revision: Optional[str] = None

    def __str__(self) -> str:
        kind = "datasets/" if self.repo_type == "dataset" else ""
        return f"hf://{kind}{self.repo_id}" + (f"@{self.revision}" if self.revision else "")


@dataclass(frozen=True)
class S3Uri:
    bucket: str
    prefix: str = ""

    def __str__(self) -> str:
        return f"s3://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")

    def key(self, relative: str) -> str:
        """The key of ``relative`` under this prefix (the prefix as a directory)."""
        return f"{self.prefix.rstrip('/')}/{relative}" if self.prefix else relative


@dataclass(frozen=True)
class ClaimUri:
    claim: str
    path: str = ""

    def __str__(self) -> str:
        return f"pvc://{self.claim}" + (f"/{self.path}" if self.path else "")


StorageUri = Union[HubUri, S3Uri, ClaimUri]


class UriError(ValueError):
    """A URI outside the grammar; the message says which part is wrong (never a credential: a URI
    carries none)."""


def is_uri(text: str) -> bool:
    """Whether ``text`` is written as a storage URI (``hf://``, ``s3://``, ``pvc://``)."""
    return text.startswith(SCHEMES)


def _relative_path(path: str, what: str, text: str) -> str:
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise UriError(f"{text!r}: the {what} may not contain '.' or '..' segments")
    return "/".join(parts) + ("/" if path.endswith("/") and parts else "")


def _parse_hf(rest: str, text: str) -> HubUri:
    repo_type: Literal["model", "dataset"] = "model"
    if rest.startswith("datasets/"):
        repo_type, rest = "dataset", rest[len("datasets/"):]
    repo, _, revision = rest.partition("@")
    if not _REPO.match(repo):
        raise UriError(f"{text!r}: expected hf://[datasets/]ORG/NAME[@REVISION] (ORG and NAME: letters, digits, "
                       "'-', '_', '.', at most 96 characters each)")
    if "@" in rest and not _REVISION.match(revision):
        raise UriError(f"{text!r}: the revision after '@' must be a branch, tag or commit (letters, digits, "
                       "'-', '_', '.', '/')")
    return HubUri(repo_id=repo, repo_type=repo_type, revision=revision or None)


def _parse_s3(rest: str, text: str) -> S3Uri:
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.match(bucket):
        raise UriError(f"{text!r}: expected s3://BUCKET[/PREFIX] with a bucket name of 3-63 lowercase letters, "
                       "digits, '-' and '.'")
    return S3Uri(bucket=bucket, prefix=_relative_path(prefix, "prefix", text))


def _parse_pvc(rest: str, text: str) -> ClaimUri:
    claim, _, path = rest.partition("/")
    if not claim or len(claim) > 253 or not _CLAIM.match(claim):
        raise UriError(f"{text!r}: expected pvc://CLAIM/PATH with CLAIM the name of a PersistentVolumeClaim "
                       "(lowercase letters, digits, '-', '.')")
    return ClaimUri(claim=claim, path=_relative_path(path, "path", text).rstrip("/"))


def parse_uri(text: str, allowed: tuple[Scheme, ...] = ("hf", "s3", "pvc")) -> StorageUri:
    """The URI ``text`` parsed; :class:`UriError` names what is wrong (an unknown scheme lists the
    ``allowed`` ones)."""
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in allowed:
        known = ", ".join(f"{s}://" for s in allowed)
        raise UriError(f"{text!r}: unknown storage scheme (the schemes here are {known})")
    if not rest:
        raise UriError(f"{text!r}: nothing after {scheme}://")
    if scheme == "hf":
        return _parse_hf(rest, text)
    if scheme == "s3":
        return _parse_s3(rest, text)
    return _parse_pvc(rest, text)


def uri_problem(text: str, allowed: tuple[Scheme, ...] = ("hf", "s3", "pvc"),
                repo_type: Optional[Literal["model", "dataset"]] = None) -> Optional[str]:
    """Why ``text`` is not an acceptable URI here (None when it is): outside the grammar, a scheme not
    ``allowed``, or an ``hf://`` URI of the other repository type."""
    try:
        uri = parse_uri(text, allowed)
    except UriError as e:
        return str(e)
    if repo_type is not None and isinstance(uri, HubUri) and uri.repo_type != repo_type:
        want = "hf://datasets/ORG/NAME" if repo_type == "dataset" else "hf://ORG/NAME (a model repository)"
        return f"{text!r}: expected {want} here"
    return None
