"""The process kubelet's HTTPS endpoint, so that ``kubectl logs`` works (TEST INFRASTRUCTURE).

The API server proxies ``kubectl logs`` to ``https://<node InternalIP>:<daemonEndpoints port>/
containerLogs/<ns>/<pod>/<container>`` and, without ``--kubelet-certificate-authority`` (as in
``e2e.cluster``), does not verify the serving certificate; this server answers that one route from
the container log files (``tailLines``, ``limitBytes``, ``follow``; ``previous`` and ``timestamps``
are accepted and ignored: the file holds every restart). It trusts every caller: it binds
127.0.0.1 only. ``exec``, ``attach``, ``port-forward`` and metrics are not served.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

LogPath = Callable[[str, str, str], Path]
IsRunning = Callable[[str, str], bool]


def tail(data: bytes, lines: int | None, limit: int | None) -> bytes:
    """The last ``lines`` lines of ``data``, then at most ``limit`` bytes of that."""
    if lines is not None:
        parts = data.splitlines(keepends=True)
        data = b"".join(parts[-lines:]) if lines > 0 else b""
    if limit is not None:
        data = data[:limit]
    return data


class KubeletServer:
    """Serves ``/containerLogs`` on ``127.0.0.1:<port>`` with the given certificate."""

    def __init__(self, cert: Path, key: Path, log_path: LogPath, is_running: IsRunning,
                 follow_limit_s: float = 600.0) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                server._get(self)

        self._log_path, self._is_running, self._follow_limit_s = log_path, is_running, follow_limit_s
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert), str(key))
        self._httpd.socket = ctx.wrap_socket(self._httpd.socket, server_side=True)
        self.port = self._httpd.server_address[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="kubelet-server", daemon=True)

    def start(self) -> KubeletServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def _get(self, h: BaseHTTPRequestHandler) -> None:
        url = urlparse(h.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        if len(parts) != 4 or parts[0] != "containerLogs":
            h.send_error(404, "only /containerLogs/<namespace>/<pod>/<container> is served")
            return
        _, ns, pod, container = parts
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        path = self._log_path(ns, pod, container)
        if not path.exists():
            h.send_error(404, f"no logs for container {container!r} of pod {ns}/{pod}")
            return
        try:
            lines = int(q["tailLines"]) if "tailLines" in q else None
            limit = int(q["limitBytes"]) if "limitBytes" in q else None
        except ValueError:
            h.send_error(400, "tailLines and limitBytes must be integers")
            return
        data = tail(path.read_bytes(), lines, limit)
        follow = q.get("follow") in ("true", "1")
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        if not follow:
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
            return
        h.end_headers()
        h.wfile.write(data)
        h.wfile.flush()
        offset = path.stat().st_size
        deadline = time.monotonic() + self._follow_limit_s
        try:
            while not self._stop.is_set() and time.monotonic() < deadline:
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
                if chunk:
                    offset += len(chunk)
                    h.wfile.write(chunk)
                    h.wfile.flush()
                elif not self._is_running(ns, pod):
                    return
                time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            return
