"""A real S3-compatible server for the tests: SeaweedFS's ``weed mini`` (master, volume server, filer and
S3 gateway in one process; ``weed`` is built once by hack/seaweedfs.sh), on free ports, its data in a
temporary directory.

Requests must be signed (SigV4) with the server's own random access key and secret key; anything else
gets 403. Buckets named in ``public_buckets`` may also be read and listed without signing.

Every request the S3 gateway answers is one line in the server's log: the gateway's request logging
(glog verbosity 2, switched on for its request middleware alone with ``-vmodule=stats=2``) writes the
requester, the method, the path (``/bucket/key``: path-style requests) and the status, which
:meth:`S3Server.requests` reads back. SeaweedFS's Prometheus counter ``SeaweedFS_s3_request_total``
counts by action, status and bucket only, and its audit log (``-s3.auditLogConfig``) posts to a
fluentd server, so the log is what counts requests per object."""

from __future__ import annotations

import ast
import atexit
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Sequence

import boto3
import httpx
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from tests.support.polling import wait_for
from tests.support.ports import free_port
from tests.support.servers import log_tail

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
START_TIMEOUT_S = 120.0

# glog line of the S3 gateway's request middleware (weed/s3api/stats.go):
#   I1109 12:00:00.123456 stats.go:42 "rft" GET "/bucket/a/b.bin" 206 1.2ms
_REQUEST_LINE = re.compile(
    r'stats\.go:\d+\]? (?P<who>"(?:[^"\\]|\\.)*"|-) (?P<method>[A-Z]+) (?P<path>"(?:[^"\\]|\\.)*") (?P<status>\d{3}) ')


class WeedBuildError(RuntimeError):
    """hack/seaweedfs.sh failed; the message ends with its output."""


def weed_binary() -> Path:
    """The ``weed`` executable: ``$RFT_WEED`` when set, else the one hack/seaweedfs.sh builds (once, into the
    cache) or finds there."""
    given = os.environ.get("RFT_WEED", "").strip()
    if given:
        return Path(given)
    proc = subprocess.run(["bash", str(ROOT / "hack" / "seaweedfs.sh")], cwd=ROOT, capture_output=True,
                          text=True, timeout=3600, check=False)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise WeedBuildError(f"hack/seaweedfs.sh failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return Path(lines[-1])


@dataclass(frozen=True)
class S3Request:
    """One request the S3 gateway answered: method, bucket, key ('' for a bucket-level request such as a
    listing) and HTTP status."""

    method: str
    bucket: str
    key: str
    status: int


def _identities(access_key: str, secret_key: str, public_buckets: Sequence[str]) -> dict:
    """SeaweedFS's S3 identity configuration (the ``-s3.config`` file): one admin identity with the keys,
    and read/list rights without signing on ``public_buckets``."""
    identities: list[dict] = [{
        "name": "rft-tests",
        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }]
    if public_buckets:
        identities.append({"name": "anonymous",
                           "actions": [f"{a}:{b}" for b in public_buckets for a in ("Read", "List")]})
    return {"identities": identities}


class S3Server:
    """``weed server`` with its S3 gateway on ``host`` (see the module docstring). Use it as a context
    manager, or call :meth:`start` and :meth:`stop`."""

    def __init__(self, host: str = "127.0.0.1", *, public_buckets: Sequence[str] = (),
                 weed: Path | None = None, wrap: Sequence[str] = ()) -> None:
        """``wrap``: a command prefix the server runs under (``nsenter --net=...`` to serve on a local
        node's own network, ``host`` being the node's address)."""
        self.host = host
        self.wrap = tuple(wrap)
        self.region = REGION
        self.access_key = "RFT" + secrets.token_hex(8).upper()
        self.secret_key = secrets.token_urlsafe(30)
        self.public_buckets = tuple(public_buckets)
        self.port = 0
        self._grpc: dict[str, int] = {}
        self._weed = weed
        self._dir: Path | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        """``http://host:port`` of the S3 gateway."""
        return f"http://{self.host}:{self.port}"

    @property
    def log(self) -> Path:
        """The server's log (stdout and stderr)."""
        if self._dir is None:
            raise RuntimeError("the S3 server is not started")
        return self._dir / "weed.log"

    def _command(self, weed: Path, root: Path) -> list[str]:
        """``weed mini`` (SeaweedFS's all-in-one server: master, volume server, filer, S3 gateway and its
        admin server; it starts in about half the time ``weed server -filer -s3`` takes) with every port
        chosen (the gRPC ports too: the default, HTTP port + 10000, may not exist), WebDAV, Iceberg,
        Lance, IAM, the admin UI and telemetry off, and small volumes (a bucket is a collection with
        volumes of its own)."""
        self.port = free_port()
        self._grpc = {name: free_port() for name in ("master", "volume", "filer", "s3", "admin")}
        (root / "data").mkdir()
        return [
            str(weed), "-logtostderr", "-v=0", "-vmodule=stats=2",
            "mini", f"-dir={root / 'data'}", f"-ip={self.host}", f"-ip.bind={self.host}",
            f"-master.port={free_port()}", f"-master.port.grpc={self._grpc['master']}",
            "-master.volumeSizeLimitMB=64", "-master.telemetry=false",
            f"-volume.port={free_port()}", f"-volume.port.grpc={self._grpc['volume']}",
            f"-filer.port={free_port()}", f"-filer.port.grpc={self._grpc['filer']}",
            f"-filer.localSocket={root / 'filer.sock'}",
            f"-s3.port={self.port}", f"-s3.port.grpc={self._grpc['s3']}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-s3.iam=false", f"-s3.config={root / 's3.json'}", f"-s3.localSocket={root / 's3.sock'}",
            "-webdav=false", "-admin.ui=false", f"-admin.port={free_port()}",
            f"-admin.port.grpc={self._grpc['admin']}", "-admin.port.legacy=0",
        ]

    def start(self) -> S3Server:
        """Start the server and wait until it stores and serves an object (the volume server has
        joined the master). Fails, with the log's tail, when it exits or is not ready in time."""
        weed = self._weed or weed_binary()
        root = self._dir = Path(tempfile.mkdtemp(prefix="rft-s3-"))
        (root / "s3.json").write_text(json.dumps(_identities(self.access_key, self.secret_key,
                                                             self.public_buckets)))
        cmd = [*self.wrap, *self._command(weed, root)]
        with self.log.open("wb") as out:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                          cwd=root, start_new_session=True)
        atexit.register(self.stop)
        try:
            wait_for("the S3 server to store an object", self._stores_an_object, START_TIMEOUT_S, 0.5,
                     proc=self._proc, on_timeout=lambda: log_tail(self.log),
                     retry_on=(OSError, httpx.HTTPError, RuntimeError))
        except BaseException:
            self.stop()
            raise
        return self

    def client(self) -> Any:
        """A boto3 S3 client signed with this server's keys."""
        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, region_name=self.region, aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                          request_checksum_calculation="when_required"))

    def _stores_an_object(self) -> bool:
        """Whether a PUT and a GET of a probe object in the bucket ``rft-probe`` succeed."""
        s3 = self.client()
        try:
            existing = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
            if "rft-probe" not in existing:
                s3.create_bucket(Bucket="rft-probe")
            s3.put_object(Bucket="rft-probe", Key="probe", Body=b"ok")
            return s3.get_object(Bucket="rft-probe", Key="probe")["Body"].read() == b"ok"
        except (ClientError, BotoCoreError):
            return False

    def requests(self, bucket: str | None = None, key: str | None = None) -> list[S3Request]:
        """Every request the S3 gateway answered so far, oldest first (the start's probes of the bucket
        ``rft-probe`` included); only those on ``bucket`` (and on ``key`` in it) when given. Requests
        answered before the call are all there: it first sends a marker request and waits until its
        line is in the log."""
        marker = f"rft-sync-{uuid.uuid4().hex}"
        httpx.head(f"{self.endpoint}/{marker}", timeout=10)
        wait_for("the S3 server to log a request", lambda: marker in self.log.read_text(errors="replace"), 10, 0.05)
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            m = _REQUEST_LINE.search(line)
            if m is None:
                continue
            path: str = ast.literal_eval(m["path"])
            b, _, k = path.lstrip("/").partition("/")
            if b == marker or (bucket is not None and b != bucket) or (key is not None and k != key):
                continue
            found.append(S3Request(m["method"], b, k, int(m["status"])))
        return found

    def get_object_count(self, bucket: str, key: str | None = None) -> int:
        """How many GET-object requests the server answered for ``key`` in ``bucket`` (any key in it when
        None), whatever their status (200, a ranged 206, 304, 403, 404, 412): GETs of the bucket itself
        (listings) and HEADs are not counted."""
        return sum(1 for r in self.requests(bucket, key) if r.method == "GET" and r.key)

    def stop(self) -> None:
        """Kill the server's process group and remove its directory and its gRPC sockets."""
        atexit.unregister(self.stop)
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        for name, port in self._grpc.items():  # weed puts these in /tmp whatever its flags say
            Path(f"/tmp/seaweedfs-{name}-grpc-{port}.sock").unlink(missing_ok=True)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
