"""A real Hugging Face Hub-compatible server on loopback: olah (a self-hosted Hub mirror from PyPI;
hack/olah-venv.sh builds its venv once), serving git repositories the test creates.

olah runs in its offline mode with a ``mirrors-path``: every request for ``ORG/NAME`` is answered from
the git repository ``<mirrors>/{models,datasets}/ORG/NAME`` (branches, tags and full commit shas as
revisions; the repo metadata, ``/tree`` listings with sizes and LFS sha256s, ``/resolve`` HEAD and GET),
and its upstream is pointed at a closed loopback port, so nothing ever leaves the machine. What olah
does not do (so tests cannot check it against it): authentication (the ``Authorization`` header is
ignored, every repository is public), uploads (no ``/api/repos/create``, preupload or commit routes:
405/404), ``GET /api/models/ORG/NAME`` without a revision (answered "not found" when offline), a
missing branch or tag (answered 401 ``RepoNotFound``, not ``RevisionNotFound``), an unknown full sha
(500), ``Range`` requests on mirrored files (the whole file, 200), and its index page ``GET /`` (500
with this starlette).

Repositories are written with git plumbing (no work tree, no git-lfs binary): a file stored "in LFS"
is committed as a git-lfs pointer with its bytes under ``.git/lfs/objects/`` (git-lfs's own layout, where
olah reads it), as the Hub stores weights and parquet files.

Downloads are counted from olah's own access log (uvicorn's, on the server's stdout and stderr, which
go to :attr:`HubServer.log`): :meth:`HubServer.download_count` counts the ``GET .../resolve/...``
requests for one file.

    with HubServer(tmp_path) as hub:
        sha = hub.add_model_repo("acme/tiny", {"config.json": b"{}", "model.safetensors": weights})
        snapshot_download("acme/tiny", revision=sha, local_dir=..., endpoint=hub.endpoint)
        assert hub.download_count("acme/tiny", "config.json") == 1
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO
from urllib.parse import unquote

import httpx

from tests.support.polling import wait_for
from tests.support.ports import free_port
from tests.support.processes import stop
from tests.support.servers import log_tail

ROOT = Path(__file__).resolve().parents[2]
LFS_OVER = 10 * 1024 * 1024
"""Files larger than this are stored in LFS by default (binary files always are)."""
_PREFIX = {"model": "models", "dataset": "datasets"}
_ACCESS = re.compile(r'"(GET|HEAD|POST|PUT|DELETE|PATCH|OPTIONS) (\S+) HTTP/[0-9.]+" (\d{3})')
_GIT_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "rft-tests", "GIT_AUTHOR_EMAIL": "tests@rft.invalid",
    "GIT_COMMITTER_NAME": "rft-tests", "GIT_COMMITTER_EMAIL": "tests@rft.invalid",
}


@functools.cache
def olah_cli() -> str:
    """The ``olah-cli`` executable of the cached olah venv (built by hack/olah-venv.sh on first use)."""
    out = subprocess.run(["bash", str(ROOT / "hack" / "olah-venv.sh")], capture_output=True, text=True,
                         check=True, timeout=1800)
    return out.stdout.strip().splitlines()[-1]


def blob_id(content: bytes) -> str:
    """The git blob sha1 of ``content``: the etag and ``blob_id`` the Hub reports for a non-LFS file."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def _is_text(content: bytes) -> bool:
    try:
        content.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class HubServer:
    """olah serving the git repositories under ``root/mirrors`` on ``host`` and a free port.

    ``start()`` (or ``with``) starts it and waits until it answers; :meth:`stop` ends it. Repositories can
    be added and changed while it runs (olah opens the repository on every request)."""

    def __init__(self, root: Path, *, host: str = "127.0.0.1", start_timeout: float = 120.0,
                 wrap: Sequence[str] = ()) -> None:
        """``wrap``: a command prefix the server runs under (``nsenter --net=...`` to serve on a local
        node's own network, ``host`` being the node's address)."""
        self.root = root
        self.host = host
        self.wrap = tuple(wrap)
        self.port = free_port()
        self.mirrors = root / "mirrors"
        self.log = root / "server.log"
        self.start_timeout = start_timeout
        netloc = f"[{host}]" if ":" in host else host
        self.endpoint = f"http://{netloc}:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    def _config(self) -> Path:
        netloc = self.endpoint.removeprefix("http://")
        # The upstream is a closed loopback port: offline mode never asks it, and should anything try,
        # it fails at once instead of reaching huggingface.co.
        text = f"""[basic]
host = "{self.host}"
port = {self.port}
repos-path = "{self.root / 'cache'}"
mirrors-path = ["{self.mirrors}"]
hf-scheme = "http"
hf-netloc = "127.0.0.1:1"
hf-lfs-netloc = "127.0.0.1:1"
mirror-scheme = "http"
mirror-netloc = "{netloc}"
mirror-lfs-netloc = "{netloc}"

[accessibility]
offline = true
"""
        path = self.root / "olah.toml"
        path.write_text(text)
        return path

    def start(self) -> HubServer:
        exe = olah_cli()
        (self.mirrors / "models").mkdir(parents=True, exist_ok=True)
        (self.mirrors / "datasets").mkdir(parents=True, exist_ok=True)
        config = self._config()
        self._log_file = self.log.open("wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self._proc = subprocess.Popen([*self.wrap, exe, "-c", str(config), "--log-path", str(self.root / "logs")],
                                      cwd=self.root, stdout=self._log_file, stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True)
        # olah's own index page fails (500) with this starlette; the refs of a repository nobody made
        # answer 404 from olah's routes once it serves.
        probe = self.endpoint + "/api/models/rft-tests/no-such-repo/refs"
        try:
            wait_for("olah (the hub server) to start", lambda: httpx.get(probe, timeout=5).status_code == 404,
                     self.start_timeout, proc=self._proc, on_timeout=self.log_tail, retry_on=(httpx.HTTPError,))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and close its log; the repositories stay on disk."""
        if self._proc is not None:
            stop(self._proc, timeout=10)
            self._proc = None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # Repositories.

    def repo_path(self, repo_id: str, repo_type: str = "model") -> Path:
        org, sep, name = repo_id.partition("/")
        assert sep and org and name and "/" not in name, f"repo_id must be ORG/NAME: {repo_id!r}"
        return self.mirrors / _PREFIX[repo_type] / org / name

    def _git(self, repo: Path, *args: str, stdin: bytes | None = None, env: Mapping[str, str] = {}) -> str:
        out = subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True, check=False,
                             env={**os.environ, **_GIT_ENV, **env})
        if out.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)} failed: {out.stderr.decode(errors='replace')}")
        return out.stdout.decode().strip()

    def _head(self, repo: Path, branch: str) -> str | None:
        try:
            return self._git(repo, "rev-parse", "--verify", "-q", f"refs/heads/{branch}^{{commit}}")
        except RuntimeError:
            return None

    def _blob(self, repo: Path, path: str, content: bytes, lfs: bool) -> str:
        if lfs:
            oid = hashlib.sha256(content).hexdigest()
            obj = repo / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid
            obj.parent.mkdir(parents=True, exist_ok=True)
            obj.write_bytes(content)
            content = f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {len(content)}\n".encode()
        return self._git(repo, "hash-object", "-w", "--stdin", stdin=content)

    def add_repo(self, repo_id: str, repo_type: str, files: Mapping[str, bytes], branch: str = "main", *,
                 lfs: Collection[str] | None = None, message: str = "files from the test") -> str:
        """Commit ``files`` (path -> bytes) as the whole tree of ``branch`` of ``repo_id`` (created when
        missing; a new branch starts from ``main``) and return the commit sha.

        ``lfs``: the paths stored as git-lfs pointers with their bytes in LFS; None: every binary
        (non-UTF-8) file and every file over :data:`LFS_OVER` bytes, as on the Hub (olah cannot serve a
        binary non-LFS file of 121 to 149 bytes, which it takes for a pointer)."""
        repo = self.repo_path(repo_id, repo_type)
        if not (repo / ".git").is_dir():
            repo.mkdir(parents=True, exist_ok=True)
            self._git(repo, "init", "-q", "-b", "main")
        index = repo / ".git" / "rft-test-index"
        index.unlink(missing_ok=True)
        entries = []
        for path, content in sorted(files.items()):
            in_lfs = path in lfs if lfs is not None else (not _is_text(content) or len(content) > LFS_OVER)
            entries.append(f"100644 {self._blob(repo, path, content, in_lfs)}\t{path}\n")
        env = {"GIT_INDEX_FILE": str(index)}
        self._git(repo, "update-index", "--add", "--index-info", stdin="".join(entries).encode(), env=env)
        tree = self._git(repo, "write-tree", env=env)
        index.unlink(missing_ok=True)
        parent = self._head(repo, branch) or self._head(repo, "main")
        commit = self._git(repo, "commit-tree", tree, *(["-p", parent] if parent else []), "-m", message)
        self._git(repo, "update-ref", f"refs/heads/{branch}", commit)
        return commit

    def add_model_repo(self, repo_id: str, files: Mapping[str, bytes], branch: str = "main", *,
                       lfs: Collection[str] | None = None) -> str:
        """:meth:`add_repo` for a model repository."""
        return self.add_repo(repo_id, "model", files, branch, lfs=lfs)

    def add_dataset_repo(self, repo_id: str, files: Mapping[str, bytes], branch: str = "main", *,
                         lfs: Collection[str] | None = None) -> str:
        """:meth:`add_repo` for a dataset repository."""
        return self.add_repo(repo_id, "dataset", files, branch, lfs=lfs)

    def tag(self, repo_id: str, tag: str, revision: str = "main", repo_type: str = "model") -> str:
        """Tag ``revision`` (a branch or sha) of ``repo_id`` as ``tag``; return the tagged commit's sha."""
        repo = self.repo_path(repo_id, repo_type)
        sha = self._git(repo, "rev-parse", "--verify", f"{revision}^{{commit}}")
        self._git(repo, "tag", "-f", tag, sha)
        return sha

    # What the server was asked, from its access log.

    def requests(self) -> list[tuple[str, str, int]]:
        """``(method, path with query, status)`` of every request olah has logged so far, in order."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return [(m.group(1), m.group(2), int(m.group(3))) for m in _ACCESS.finditer(text)]

    def download_count(self, repo_id: str, filename: str, repo_type: str = "model") -> int:
        """How many times olah answered a ``GET`` for ``filename`` of ``repo_id`` (at any revision)."""
        heads = [f"/{_PREFIX[repo_type]}/{repo_id}/resolve/"] + ([f"/{repo_id}/resolve/"] if repo_type == "model" else [])
        count = 0
        for method, target, status in self.requests():
            path = target.split("?", 1)[0]
            head = next((h for h in heads if path.startswith(h)), None)
            if method != "GET" or head is None or status >= 400:
                continue
            _rev, _, name = path[len(head):].partition("/")
            count += unquote(name) == filename
        return count

    def log_tail(self, chars: int = 3000) -> str:
        return log_tail(self.log, chars)
