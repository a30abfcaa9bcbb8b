"""An S3 client for the runtime (AWS S3 and S3-compatible servers, through boto3): list every object under
a prefix, download one object resumably, upload one file (multipart above a threshold), look one object
up, create a bucket.

Failures surface as :class:`~rft_runtime.storage.errors.StorageError`. Transient ones (a refused or
broken connection, 5xx, throttling) are retried first: each request by botocore's standard retry mode,
and a download whose body breaks off is continued from the bytes already on disk. The error text is
built from the HTTP status and the S3 error code only, so neither key appears in it, and the settings'
repr leaves both keys out.

Requests go out unsigned when no access key is given (public buckets), signed with SigV4 otherwise.
Request checksums are sent only where S3 requires them, which every S3-compatible server accepts;
uploads carry ``Content-MD5`` instead, so the server checks every byte it stores."""

from __future__ import annotations

import base64
import builtins
import contextlib
import errno
import hashlib
import logging
import os
import posixpath
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

import boto3
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError, IncompleteReadError, ParamValidationError
from botocore.exceptions import ConnectionError as BotoConnectionError

from rft_runtime.storage.errors import StorageError

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
"""Bytes read from a download's body between two writes (and two ``on_bytes`` calls)."""
MULTIPART_THRESHOLD = 64 << 20
"""Files larger than this are uploaded in parts."""
MIN_PART_BYTES = 5 << 20
"""S3's smallest part (except the last)."""
DEFAULT_PART_BYTES = 16 << 20
"""The part size of a multipart upload, unless the file needs bigger parts to fit S3's 10,000."""
MAX_PARTS = 10_000
MAX_ATTEMPTS = 5
"""Attempts per request (botocore's standard retry mode), and per download whose body breaks off."""
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_NOT_FOUND_CODES = frozenset({"NoSuchBucket", "NoSuchKey", "NotFound", "NoSuchUpload", "404"})
_FORBIDDEN_CODES = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled",
                              "AccountProblem", "InvalidToken", "ExpiredToken", "RequestTimeTooSkewed"})
_TRANSIENT_400_CODES = frozenset({"RequestTimeout", "SlowDown", "Throttling", "ThrottlingException",
                                  "RequestThrottled", "BadDigest", "IncompleteBody"})
_STREAM_ERRORS = (BotoConnectionError, HTTPClientError, IncompleteReadError)
_HINTS = {
    "Unauthorized": "; the server wants credentials",
    "Forbidden": "; check the access key, the secret key and their permissions on the bucket",
    "NotFound": "; no such bucket or object",
}


@dataclass(frozen=True)
class S3Settings:
    """Where the store is and how to sign requests. ``endpoint`` None: AWS's own endpoint for ``region``.
    ``path_style``: ``http://endpoint/bucket/key`` (what S3-compatible servers want) rather than
    ``http://bucket.endpoint/key``. No ``access_key``: anonymous (unsigned) requests. ``max_attempts``:
    tries per request before a transient failure is raised."""

    endpoint: str | None = None
    region: str = "us-east-1"
    path_style: bool = True
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    max_attempts: int = MAX_ATTEMPTS

    def __post_init__(self) -> None:
        if (self.access_key is None) != (self.secret_key is None):
            raise ValueError("S3Settings: access_key and secret_key are given together or not at all")
        if self.max_attempts < 1:
            raise ValueError("S3Settings: max_attempts must be at least 1")


@dataclass(frozen=True)
class RemoteFile:
    """One object: ``path`` relative to the prefix it was listed under ('/'-separated; :meth:`S3Store.head`
    gives the whole key), its size in bytes, and its ETag as the server gives it, quotes stripped."""

    path: str
    size: int
    etag: str


class _BodyBroken(Exception):
    """A download's body broke off after the server answered (the bytes so far are on disk)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def s3_uri(bucket: str, key: str = "") -> str:
    """``s3://bucket/key``: how errors name what failed."""
    return f"s3://{bucket}/{key}"


def _etag(raw: str) -> str:
    return raw.strip().strip('"')


def _client_error(e: ClientError) -> tuple[int | None, str]:
    """The HTTP status and the S3 error code of ``e`` (the code reduced to the characters codes use)."""
    response: dict[str, Any] = e.response or {}
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    code = str(response.get("Error", {}).get("Code", "") or "")
    return (int(status) if status is not None else None), re.sub(r"[^A-Za-z0-9._-]", "", code)[:64]


def _reason(status: int | None, code: str) -> str:
    """The :class:`StorageError` reason for an S3 error response."""
    if status == 401:
        return "Unauthorized"
    if code in _NOT_FOUND_CODES or status == 404:
        return "NotFound"
    if code in _FORBIDDEN_CODES or status == 403:
        return "Forbidden"
    if code in _TRANSIENT_400_CODES:
        return "ServerError"
    if status is not None and 400 <= status < 500 and status not in (408, 409, 412, 429):
        return "Invalid"
    return "ServerError"


def _display(endpoint: str | None) -> str:
    """The endpoint as errors show it (no user information), or 'AWS S3'."""
    if not endpoint:
        return "AWS S3"
    parts = urlsplit(endpoint)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


def translate(e: BaseException, uri: str, what: str, endpoint: str | None) -> StorageError | None:
    """The :class:`StorageError` for an exception raised while doing ``what`` to ``uri``; None for one that
    is no storage failure (a local error other than a full disk, a bug)."""
    if isinstance(e, StorageError):
        return e
    if isinstance(e, ClientError):
        status, code = _client_error(e)
        reason = _reason(status, code)
        shown = f"HTTP {status}" if status is not None else "an error"
        return StorageError(uri, reason, f"{what} failed: {shown} {code}".rstrip() + _HINTS.get(reason, ""), status)
    if isinstance(e, _STREAM_ERRORS):
        return StorageError(uri, "Unreachable", f"{what} failed: no answer from {_display(endpoint)} "
                                                f"({type(e).__name__})")
    if isinstance(e, ParamValidationError):
        return StorageError(uri, "Invalid", f"{what} failed: the request's parameters are invalid")
    if isinstance(e, BotoCoreError):
        return StorageError(uri, "ServerError", f"{what} failed ({type(e).__name__})")
    if isinstance(e, OSError) and e.errno in _NO_SPACE:
        return StorageError(uri, "NoSpace", f"{what} failed: no space left on the local disk")
    return None


def _part_size(size: int, wanted: int | None) -> int:
    """Bytes per part: ``wanted`` (or the default), at least S3's minimum, and big enough for 10,000 parts."""
    return max(wanted or DEFAULT_PART_BYTES, MIN_PART_BYTES, -(-size // MAX_PARTS))


def _md5_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


def _resume_offset(part: Path, tag: Path, etag: str, size: int) -> int:
    """Bytes of ``part`` a download of version ``etag`` may keep: all of them when ``tag`` records that
    version and they do not exceed ``size``; otherwise none (the part is removed)."""
    if not part.exists():
        return 0
    have = part.stat().st_size
    try:
        recorded = tag.read_text().strip()
    except OSError:
        recorded = None
    if recorded == etag and have <= size:
        return have
    part.unlink()
    return 0


class S3Store:
    """One S3 endpoint with one set of credentials (see the module docstring)."""

    def __init__(self, settings: S3Settings) -> None:
        self.settings = settings
        config = Config(
            region_name=settings.region,
            signature_version=UNSIGNED if settings.access_key is None else "s3v4",
            s3={"addressing_style": "path" if settings.path_style else "virtual"},
            retries={"max_attempts": settings.max_attempts, "mode": "standard"},
            connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
            request_checksum_calculation="when_required", response_checksum_validation="when_required",
        )
        session = boto3.session.Session()
        self._s3: Any = session.client(
            "s3", endpoint_url=settings.endpoint, aws_access_key_id=settings.access_key,
            aws_secret_access_key=settings.secret_key, config=config)

    def __repr__(self) -> str:
        return f"S3Store({self.settings!r})"

    @contextlib.contextmanager
    def _failing_as(self, uri: str, what: str) -> Iterator[None]:
        """Raise what the block raises as a :class:`StorageError` (the original never chained: its text may
        quote the request)."""
        try:
            yield
        except (ClientError, BotoCoreError, OSError) as e:
            error = translate(e, uri, what, self.settings.endpoint)
            if error is None:
                raise
            raise error from None

    def head(self, bucket: str, key: str) -> RemoteFile | None:
        """The object ``key`` (``path`` is the whole key), or None when the bucket has no such object (or
        there is no such bucket: a HEAD answer cannot tell the two apart)."""
        with self._failing_as(s3_uri(bucket, key), "HEAD"):
            try:
                r = self._s3.head_object(Bucket=bucket, Key=key)
            except ClientError as e:
                if _client_error(e)[0] == 404:
                    return None
                raise
        return RemoteFile(path=key, size=int(r["ContentLength"]), etag=_etag(r["ETag"]))

    def list(self, bucket: str, prefix: str, *, page_size: int = 1000) -> list[RemoteFile]:
        """Every object under ``prefix``, sorted by path, read ``page_size`` keys per request.

        ``prefix`` '' or ending in '/' is a directory: paths are the keys with the prefix cut off
        (directory markers, keys ending in '/', are left out). Any other prefix is a directory when
        objects lie under ``prefix + '/'``, else the one object whose key it is (its path is the key's
        last segment). Nothing found raises ``NotFound``, and so does a missing bucket; a key whose
        path would leave the prefix (an empty, '.' or '..' segment) raises ``Invalid``."""
        uri = s3_uri(bucket, prefix)
        with self._failing_as(uri, "listing"):
            if prefix == "" or prefix.endswith("/"):
                files = self._list_under(bucket, prefix, page_size)
            else:
                files = self._list_under(bucket, prefix + "/", page_size)
                if not files:
                    one = self.head(bucket, prefix)
                    files = [RemoteFile(posixpath.basename(prefix), one.size, one.etag)] if one else []
        if not files:
            raise StorageError(uri, "NotFound", "no objects under this prefix", 404)
        return sorted(files, key=lambda f: f.path)

    def _list_under(self, bucket: str, prefix: str, page_size: int) -> builtins.list[RemoteFile]:
        files = []
        pages = self._s3.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix, PaginationConfig={"PageSize": page_size})
        for page in pages:
            for obj in page.get("Contents", []):
                path = obj["Key"][len(prefix):]
                if not path or path.endswith("/"):
                    continue
                if any(part in ("", ".", "..") for part in path.split("/")):
                    raise StorageError(s3_uri(bucket, obj["Key"]), "Invalid",
                                       f"the key's path {path!r} does not stay under the prefix {prefix!r}")
                files.append(RemoteFile(path=path, size=int(obj["Size"]), etag=_etag(obj["ETag"])))
        return files

    def download(self, bucket: str, key: str, dest: Path, *, size: int, etag: str,
                 on_bytes: Callable[[int], None] | None = None) -> None:
        """Download version ``etag`` (``size`` bytes) of ``key`` to ``dest``, resumably.

        Bytes go to ``dest.part``, and ``dest.part.etag`` records the version they belong to; a later
        call for the same version continues the part with a ranged GET, a call for another version
        starts over. Every GET carries ``If-Match: etag``: an object that changed on the server since it
        was listed removes the part and raises ``ServerError`` (status 412; list it again). A body that
        breaks off is continued up to ``max_attempts`` times. The complete part, exactly ``size`` bytes,
        is renamed to ``dest``. ``on_bytes(n)`` follows every chunk written (resumed bytes are not
        reported again)."""
        uri = s3_uri(bucket, key)
        part = dest.with_name(dest.name + ".part")
        tag = dest.with_name(dest.name + ".part.etag")
        with self._failing_as(uri, "download"):
            dest.parent.mkdir(parents=True, exist_ok=True)
            offset = _resume_offset(part, tag, etag, size)
            tag.write_text(etag)
            for attempt in range(1, self.settings.max_attempts + 1):
                try:
                    offset = self._fetch_into(bucket, key, part, offset, size, etag, on_bytes)
                    break
                except _BodyBroken as e:
                    offset = part.stat().st_size
                    if attempt == self.settings.max_attempts:
                        raise StorageError(uri, "Unreachable", f"download broke off at byte {offset} of {size} "
                                                               f"({e.kind}), {attempt} times") from None
                    log.info("%s: the download broke off at byte %d of %d (%s); continuing", uri, offset, size,
                             e.kind)
                    time.sleep(min(0.5 * 2 ** attempt, 8.0))
                except ClientError as e:
                    if _client_error(e)[0] != 412:
                        raise
                    part.unlink(missing_ok=True)
                    tag.unlink(missing_ok=True)
                    raise StorageError(uri, "ServerError", f"the object changed since it was listed (no longer "
                                                           f"ETag {etag}); list it again", 412) from None
            if offset != size:
                part.unlink(missing_ok=True)
                raise StorageError(uri, "ServerError", f"the server sent {offset} bytes, the listing said {size}")
            os.replace(part, dest)
            tag.unlink(missing_ok=True)

    def _fetch_into(self, bucket: str, key: str, part: Path, offset: int, size: int, etag: str,
                    on_bytes: Callable[[int], None] | None) -> int:
        """Append the object's bytes from ``offset`` on to ``part``; the bytes it then holds."""
        if offset >= size:  # nothing left to read: only confirm the version is still there
            self._s3.head_object(Bucket=bucket, Key=key, IfMatch=f'"{etag}"')
            part.touch()
            return offset
        args: dict[str, Any] = {"Bucket": bucket, "Key": key, "IfMatch": f'"{etag}"'}
        if offset:
            args["Range"] = f"bytes={offset}-"
            log.info("%s: resuming the download at byte %d of %d", s3_uri(bucket, key), offset, size)
        body = self._s3.get_object(**args)["Body"]
        with part.open("ab") as f, contextlib.closing(body):
            try:
                for chunk in body.iter_chunks(CHUNK_BYTES):
                    f.write(chunk)
                    offset += len(chunk)
                    if on_bytes is not None:
                        on_bytes(len(chunk))
                    if offset > size:
                        break
            except _STREAM_ERRORS as e:
                f.flush()
                raise _BodyBroken(type(e).__name__) from None
            f.flush()
            os.fsync(f.fileno())
        return offset

    def upload(self, local: Path, bucket: str, key: str, *, on_bytes: Callable[[int], None] | None = None,
               multipart_threshold: int = MULTIPART_THRESHOLD, part_size: int | None = None) -> str:
        """Upload ``local`` as ``key`` and return the new object's ETag (quotes stripped). A file of at
        most ``multipart_threshold`` bytes goes in one PUT (read into memory, its MD5 sent along, so its
        ETag is that MD5); a larger one in parts of ``part_size`` bytes (default
        :data:`DEFAULT_PART_BYTES`, at least 5 MiB and enough for 10,000 parts), each with its MD5, an
        unfinished upload aborted. ``on_bytes(n)`` follows every PUT that the server accepted."""
        uri = s3_uri(bucket, key)
        with self._failing_as(uri, "upload"):
            size = local.stat().st_size
            if size > multipart_threshold:
                return self._upload_parts(local, bucket, key, size, _part_size(size, part_size), on_bytes)
            data = local.read_bytes()
            r = self._s3.put_object(Bucket=bucket, Key=key, Body=data, ContentMD5=_md5_b64(data))
            if on_bytes is not None:
                on_bytes(len(data))
            return _etag(r["ETag"])

    def _upload_parts(self, local: Path, bucket: str, key: str, size: int, part_size: int,
                      on_bytes: Callable[[int], None] | None) -> str:
        upload_id = self._s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        parts: list[dict[str, Any]] = []
        try:
            with local.open("rb") as f:
                while chunk := f.read(part_size):
                    number = len(parts) + 1
                    r = self._s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                             Body=chunk, ContentMD5=_md5_b64(chunk))
                    parts.append({"PartNumber": number, "ETag": r["ETag"]})
                    if on_bytes is not None:
                        on_bytes(len(chunk))
            r = self._s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id,
                                                   MultipartUpload={"Parts": parts})
        except BaseException:
            with contextlib.suppress(ClientError, BotoCoreError):
                self._s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
            raise
        log.info("%s: uploaded %d bytes in %d parts", s3_uri(bucket, key), size, len(parts))
        return _etag(r["ETag"])

    def create_bucket(self, bucket: str) -> None:
        """Create ``bucket``; one this account already owns is fine (idempotent)."""
        with self._failing_as(s3_uri(bucket), "creating the bucket"):
            args: dict[str, Any] = {"Bucket": bucket}
            if self.settings.region != "us-east-1":
                args["CreateBucketConfiguration"] = {"LocationConstraint": self.settings.region}
            try:
                self._s3.create_bucket(**args)
            except ClientError as e:
                if _client_error(e)[1] != "BucketAlreadyOwnedByYou":
                    raise
