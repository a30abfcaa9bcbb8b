"""A local OCI registry with basic auth: ``registry`` from github.com/distribution/distribution/v3, built
from the Go module proxy by ``hack/registry.sh`` (cached in ``$RFT_CACHE/bin``).

It serves plain HTTP on one address (a test binds it to the node's host-side address, ``10.213.<slot>.1``,
so the node's containerd reaches it: :meth:`e2e.node.LocalNode.trust_registry` writes containerd's
``hosts.toml`` for it), stores blobs under its directory, and admits only the users of its htpasswd file
(bcrypt, made by the ``registry-<version>-htpasswd`` helper built beside it).

    python -m e2e.registry serve --addr 127.0.0.1:5000 --dir /tmp/reg --user rft --password secret
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

REPO_ROOT = Path(__file__).resolve().parents[1]


class RegistryError(RuntimeError):
    pass


def registry_binary() -> Path:
    """``hack/registry.sh``: the registry binary's path (built once, then cached)."""
    p = subprocess.run(["bash", str(REPO_ROOT / "hack" / "registry.sh")], capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RegistryError(f"hack/registry.sh failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return Path(p.stdout.strip().splitlines()[-1])


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LocalRegistry:
    """One registry process: ``start`` it, push to :attr:`address`, ``stop`` it (its directory stays)."""

    def __init__(self, workdir: Path, host: str = "127.0.0.1", port: int = 0,
                 users: Optional[dict[str, str]] = None) -> None:
        self.workdir = Path(workdir)
        self.host = host
        self.port = port or free_port(host)
        self.users = dict(users or {"rft": secrets.token_urlsafe(12)})
        self._proc: Optional[subprocess.Popen[bytes]] = None

    @property
    def address(self) -> str:
        """``host:port``: what image references and pull secrets name."""
        return f"{self.host}:{self.port}"

    def _config(self) -> str:
        return json.dumps({  # YAML is a superset of JSON
            "version": 0.1,
            "log": {"level": "warn", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(self.workdir / "data")}, "delete": {"enabled": True}},
            "http": {"addr": self.address, "secret": secrets.token_hex(16)},
            "auth": {"htpasswd": {"realm": "rft-test", "path": str(self.workdir / "htpasswd")}},
        })

    def start(self, timeout: float = 30) -> "LocalRegistry":
        exe = registry_binary()
        self.workdir.mkdir(parents=True, exist_ok=True)
        lines = "".join(f"{u} {p}\n" for u, p in self.users.items())
        hashed = subprocess.run([f"{exe}-htpasswd"], input=lines, capture_output=True, text=True, check=True)
        (self.workdir / "htpasswd").write_text(hashed.stdout)
        (self.workdir / "config.yml").write_text(self._config())
        log = open(self.workdir / "registry.log", "ab")
        try:
            self._proc = subprocess.Popen([str(exe), "serve", str(self.workdir / "config.yml")], stdin=subprocess.DEVNULL,
                                          stdout=log, stderr=log, start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while self.status("/v2/") != 401:  # up, and asking for credentials
            if self._proc.poll() is not None:
                raise RegistryError(f"the registry exited ({self._proc.returncode}): {self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RegistryError(f"the registry did not answer on {self.address} in {timeout:.0f}s: {self.log_tail()}")
            time.sleep(0.2)
        return self

    def log_tail(self, n: int = 3000) -> str:
        try:
            return (self.workdir / "registry.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait(10)
        self._proc = None

    def __enter__(self) -> "LocalRegistry":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- clients --------------------------------------------------------------------------------

    def status(self, path: str, user: Optional[str] = None, password: Optional[str] = None,
               method: str = "GET", accept: Optional[str] = None) -> int:
        """The HTTP status of ``path`` on the registry (0: no answer)."""
        return self.request(path, user, password, method, accept)[0]

    def request(self, path: str, user: Optional[str] = None, password: Optional[str] = None, method: str = "GET",
                accept: Optional[str] = None) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(f"http://{self.address}{path}", method=method)
        if user is not None:
            token = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        if accept:
            req.add_header("Accept", accept)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()
        except OSError:
            return 0, {}, b""

    def dockerconfigjson(self, user: str, password: str) -> str:
        """The ``.dockerconfigjson`` of a ``kubernetes.io/dockerconfigjson`` Secret for this registry."""
        auth = base64.b64encode(f"{user}:{password}".encode()).decode()
        return json.dumps({"auths": {self.address: {"username": user, "password": password, "auth": auth}}})


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m e2e.registry")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run a registry with basic auth until interrupted")
    s.add_argument("--addr", default="127.0.0.1:5000", help="host:port to listen on (default 127.0.0.1:5000)")
    s.add_argument("--dir", type=Path, default=Path(".cluster/registry"), help="its data and config")
    s.add_argument("--user", default="rft")
    s.add_argument("--password", default=os.environ.get("REGISTRY_PASSWORD") or "rft")
    a = ap.parse_args(argv)
    host, _, port = a.addr.rpartition(":")
    reg = LocalRegistry(a.dir, host, int(port), {a.user: a.password}).start()
    print(f"registry on {reg.address} (user {a.user}); push with: make images REGISTRY={reg.address} "
          f"REGISTRY_USER={a.user} REGISTRY_PASSWORD=... REGISTRY_TLS_VERIFY=false", flush=True)
    try:
        while reg._proc is not None and reg._proc.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        reg.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
