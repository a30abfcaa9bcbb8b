"""The runtime's S3 client (:mod:`rft_runtime.storage.s3`) against a real S3-compatible server
(SeaweedFS, ``s3_server``): paginated listings, downloads that verify, resume and restart, uploads in
one PUT and in parts, the errors a wrong key, a missing bucket or object and a stopped server give,
and the server's own count of GET requests per object. Each test uses buckets of its own."""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import uuid
from pathlib import Path

import pytest

from rft_runtime.storage.errors import StorageError
from rft_runtime.storage.s3 import RemoteFile, S3Settings, S3Store, translate
from tests.support.s3server import S3Server

MiB = 1 << 20


class Interrupt(Exception):
    """Raised from ``on_bytes`` to cut a download short (as a killed process would)."""


def _settings(server: S3Server, **overrides: object) -> S3Settings:
    values: dict = {"endpoint": server.endpoint, "region": server.region, "access_key": server.access_key,
                    "secret_key": server.secret_key}
    values.update(overrides)
    return S3Settings(**values)


@pytest.fixture
def store(s3_server: S3Server) -> S3Store:
    return S3Store(_settings(s3_server))


@pytest.fixture
def bucket(store: S3Store) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    store.create_bucket(name)
    return name


def _put(store: S3Store, tmp_path: Path, bucket: str, key: str, data: bytes) -> str:
    src = tmp_path / f"src-{uuid.uuid4().hex}"
    src.write_bytes(data)
    return store.upload(src, bucket, key)


def _interrupted(store: S3Store, bucket: str, key: str, dest: Path, remote: RemoteFile) -> None:
    """Start downloading ``key`` and stop after its first chunk, leaving ``dest.part`` behind."""
    def stop(n: int) -> None:
        raise Interrupt

    with pytest.raises(Interrupt):
        store.download(bucket, key, dest, size=remote.size, etag=remote.etag, on_bytes=stop)
    assert dest.with_name(dest.name + ".part").stat().st_size > 0 and not dest.exists()


def test_listing_pages_through_every_object_sorted_by_path(s3_server, store, bucket, tmp_path):
    names = [f"f{i:02d}.bin" for i in range(23)] + ["sub/a.txt", "sub/deeper/b.txt"]
    etags = {n: _put(store, tmp_path, bucket, f"model/{n}", n.encode() * 3) for n in reversed(names)}
    _put(store, tmp_path, bucket, "modelx/outside.bin", b"not under model/")
    before = len([r for r in s3_server.requests(bucket) if r.method == "GET" and not r.key])

    files = store.list(bucket, "model/", page_size=5)

    assert [f.path for f in files] == sorted(names)
    assert all(f.size == 3 * len(f.path) and f.etag == etags[f.path] for f in files)
    listings = len([r for r in s3_server.requests(bucket) if r.method == "GET" and not r.key]) - before
    assert listings == 5  # 25 keys, 5 per page: every page requested
    assert [f.path for f in store.list(bucket, "model", page_size=1000)] == sorted(names)  # a directory
    assert store.list(bucket, "model/sub/deeper/b.txt") == [RemoteFile("b.txt", 48, etags["sub/deeper/b.txt"])]
    assert [f.path for f in store.list(bucket, "")][-1] == "modelx/outside.bin"


def test_download_writes_the_object_through_a_part_file_and_counts_one_get(s3_server, store, bucket,
                                                                            tmp_path):
    data = os.urandom(3 * MiB + 123)
    etag = _put(store, tmp_path, bucket, "w/model.safetensors", data)
    [remote] = store.list(bucket, "w/")
    assert remote == RemoteFile("model.safetensors", len(data), hashlib.md5(data).hexdigest()) and etag == remote.etag
    dest = tmp_path / "out" / "model.safetensors"
    seen: list[int] = []

    store.download(bucket, "w/model.safetensors", dest, size=remote.size, etag=remote.etag, on_bytes=seen.append)

    assert dest.read_bytes() == data and sum(seen) == len(data) and len(seen) > 1
    assert sorted(p.name for p in dest.parent.iterdir()) == ["model.safetensors"]  # no .part left
    assert s3_server.get_object_count(bucket, "w/model.safetensors") == 1


def test_a_size_that_does_not_match_fails_and_leaves_no_file(store, bucket, tmp_path):
    etag = _put(store, tmp_path, bucket, "k", b"12345")
    dest = tmp_path / "k"
    with pytest.raises(StorageError) as e:
        store.download(bucket, "k", dest, size=4, etag=etag)
    assert e.value.reason == "ServerError" and not e.value.terminal
    assert not dest.exists() and not dest.with_name("k.part").exists()


def test_a_truncated_part_is_resumed_with_a_ranged_get(s3_server, store, bucket, tmp_path):
    data = os.urandom(5 * MiB + 7)
    _put(store, tmp_path, bucket, "big.bin", data)
    [remote] = store.list(bucket, "big.bin")
    dest = tmp_path / "big.bin"
    _interrupted(store, bucket, "big.bin", dest, remote)
    part = dest.with_name("big.bin.part")
    assert part.stat().st_size > 1_000_003
    with part.open("r+b") as f:  # keep an odd-sized prefix, as a crash mid-write would
        f.truncate(1_000_003)
    seen: list[int] = []

    store.download(bucket, "big.bin", dest, size=remote.size, etag=remote.etag, on_bytes=seen.append)

    assert dest.read_bytes() == data and not part.exists()
    assert sum(seen) == len(data) - 1_000_003  # only the missing bytes came over the wire
    assert [r.status for r in s3_server.requests(bucket, "big.bin") if r.method == "GET"] == [200, 206]


def test_a_changed_object_restarts_from_zero(s3_server, store, bucket, tmp_path):
    _put(store, tmp_path, bucket, "obj", os.urandom(4 * MiB))
    [old] = store.list(bucket, "obj")
    dest = tmp_path / "obj"
    _interrupted(store, bucket, "obj", dest, old)
    new_data = os.urandom(3 * MiB + 5)
    _put(store, tmp_path, bucket, "obj", new_data)
    [new] = store.list(bucket, "obj")
    assert new.etag != old.etag

    seen: list[int] = []
    store.download(bucket, "obj", dest, size=new.size, etag=new.etag, on_bytes=seen.append)

    assert dest.read_bytes() == new_data and sum(seen) == len(new_data)
    assert [r.status for r in s3_server.requests(bucket, "obj") if r.method == "GET"] == [200, 200]


def test_a_download_of_a_version_the_server_no_longer_has_fails_and_drops_the_part(store, bucket, tmp_path):
    _put(store, tmp_path, bucket, "obj", os.urandom(2 * MiB))
    [old] = store.list(bucket, "obj")
    dest = tmp_path / "obj"
    _interrupted(store, bucket, "obj", dest, old)
    _put(store, tmp_path, bucket, "obj", b"replaced")

    with pytest.raises(StorageError) as e:
        store.download(bucket, "obj", dest, size=old.size, etag=old.etag)

    assert e.value.status == 412 and not e.value.terminal and "list it again" in str(e.value)
    assert list(tmp_path.glob("obj*")) == []


def test_uploads_in_one_put_and_in_parts_read_back_byte_for_byte(s3_server, store, bucket, tmp_path):
    small, empty, big = tmp_path / "small", tmp_path / "empty", tmp_path / "big"
    small.write_bytes(os.urandom(1000))
    empty.write_bytes(b"")
    big.write_bytes(os.urandom(12 * MiB + 1))
    sent: list[int] = []

    assert store.upload(small, bucket, "u/small") == hashlib.md5(small.read_bytes()).hexdigest()
    assert store.upload(empty, bucket, "u/empty") == hashlib.md5(b"").hexdigest()
    big_etag = store.upload(big, bucket, "u/big", multipart_threshold=5 * MiB, part_size=5 * MiB,
                            on_bytes=sent.append)

    assert sent == [5 * MiB, 5 * MiB, 2 * MiB + 1] and big_etag.endswith("-3")
    assert store.head(bucket, "u/big") == RemoteFile("u/big", big.stat().st_size, big_etag)
    for remote in store.list(bucket, "u/"):
        dest = tmp_path / "back" / remote.path
        store.download(bucket, f"u/{remote.path}", dest, size=remote.size, etag=remote.etag)
        assert dest.read_bytes() == (tmp_path / remote.path).read_bytes(), remote.path


def test_a_wrong_key_is_forbidden_and_no_credential_appears_in_errors_or_logs(s3_server, bucket, caplog):
    caplog.set_level(logging.DEBUG, logger="rft_runtime")
    wrong_secret = "wrong-" + s3_server.secret_key[::-1]
    unknown_key = "AKUNKNOWN" + uuid.uuid4().hex[:10].upper()
    for settings in (_settings(s3_server, secret_key=wrong_secret),
                     _settings(s3_server, access_key=unknown_key, secret_key=wrong_secret)):
        store = S3Store(settings)
        with pytest.raises(StorageError) as e:
            store.list(bucket, "")
        assert e.value.reason == "Forbidden" and e.value.terminal and e.value.status == 403
        texts = [str(e.value), repr(e.value), repr(settings), repr(store), caplog.text]
        for secret in (wrong_secret, unknown_key, s3_server.access_key, s3_server.secret_key):
            assert not any(secret in text for text in texts), secret
        assert e.value.__cause__ is None and e.value.__suppress_context__


def test_a_missing_bucket_or_object_is_not_found(store, bucket, tmp_path):
    missing_bucket = f"missing-{uuid.uuid4().hex[:8]}"
    for call in (lambda: store.list(missing_bucket, "x/"), lambda: store.list(bucket, "nothing/"),
                 lambda: store.list(bucket, "nothing"),
                 lambda: store.download(bucket, "nothing", tmp_path / "n", size=1, etag="abc")):
        with pytest.raises(StorageError) as e:
            call()
        assert e.value.reason == "NotFound" and e.value.terminal, e.value
    assert store.head(bucket, "nothing") is None
    assert str(e.value).startswith(f"s3://{bucket}/nothing: ")


def test_a_stopped_server_is_unreachable_and_worth_retrying(tmp_path):
    own = S3Server()
    with own:
        store = S3Store(_settings(own, max_attempts=2))
        store.create_bucket("gone")
        (tmp_path / "f").write_bytes(b"x")
        etag = store.upload(tmp_path / "f", "gone", "f")
        data_dir = own.log.parent
    assert not data_dir.exists()

    for call in (lambda: store.list("gone", ""),
                 lambda: store.download("gone", "f", tmp_path / "g", size=1, etag=etag)):
        with pytest.raises(StorageError) as e:
            call()
        assert e.value.reason == "Unreachable" and not e.value.terminal and e.value.status is None
        assert own.endpoint.removeprefix("http://") in str(e.value)


def test_unsigned_requests_read_a_public_bucket_only(s3_server, store, tmp_path):
    store.create_bucket("public")
    store.create_bucket("public")  # idempotent
    _put(store, tmp_path, "public", "open.txt", b"anyone may read this")
    anonymous = S3Store(S3Settings(endpoint=s3_server.endpoint))
    [remote] = anonymous.list("public", "open.txt")
    anonymous.download("public", "open.txt", tmp_path / "open.txt", size=remote.size, etag=remote.etag)
    assert (tmp_path / "open.txt").read_bytes() == b"anyone may read this"

    private = f"p-{uuid.uuid4().hex[:8]}"
    store.create_bucket(private)
    with pytest.raises(StorageError) as e:
        anonymous.list(private, "")
    assert e.value.reason == "Forbidden"


def test_the_server_counts_get_requests_per_object(s3_server, store, bucket, tmp_path):
    for key in ("a", "b"):
        _put(store, tmp_path, bucket, key, key.encode())
    files = {f.path: f for f in store.list(bucket, "")}
    for i in range(3):
        store.download(bucket, "a", tmp_path / f"a{i}", size=1, etag=files["a"].etag)
    store.head(bucket, "b")

    assert s3_server.get_object_count(bucket, "a") == 3
    assert s3_server.get_object_count(bucket, "b") == 0  # a HEAD is no GET
    assert s3_server.get_object_count(bucket) == 3  # the listing is no GET of an object
    assert s3_server.get_object_count(f"other-{bucket}") == 0


def test_a_full_local_disk_is_no_space_and_other_local_errors_pass_through():
    full = translate(OSError(errno.ENOSPC, "No space left on device"), "s3://b/k", "download", None)
    assert full is not None and full.reason == "NoSpace" and not full.terminal
    assert translate(PermissionError(errno.EACCES, "denied"), "s3://b/k", "download", None) is None
