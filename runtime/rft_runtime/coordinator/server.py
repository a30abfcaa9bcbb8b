"""Run aiohttp applications in a background thread: the coordinator inside the trainer process
(and, through :class:`AppThread`, the builtin inference server inside a local Ray actor)."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

from aiohttp import web

from .. import auth
from .http import create_app
from .service import CoordinatorService


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0 = a free port), not yet listening: its port is known, and
    held, before the server that will listen on it (:class:`AppThread`'s ``sock``) is ready."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)  # no SO_REUSEADDR: no other socket may share the port
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class AppThread:
    """Runs ``app`` on ``host:port`` (0 = a free port), or on the bound socket ``sock``
    (:func:`bind_socket`), in its own thread and event loop."""

    def __init__(self, app: web.Application, host: str = "127.0.0.1", port: int = 0,
                 sock: socket.socket | None = None) -> None:
        self.app = app
        self.sock = sock
        if sock is not None:
            host, port = sock.getsockname()[:2]
        self.host = host
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 120.0) -> "AppThread":
        """Start serving; returns once bound (re-raises a binding or startup error)."""
        ready = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            runner = web.AppRunner(self.app, access_log=None)
            try:
                loop.run_until_complete(runner.setup())
                site = web.SockSite(runner, self.sock) if self.sock is not None else \
                    web.TCPSite(runner, self.host, self.port)
                loop.run_until_complete(site.start())
                sockets = getattr(site._server, "sockets", None) or []
                if sockets:
                    self.port = sockets[0].getsockname()[1]
            except BaseException as e:  # noqa: BLE001 - handed to the starting thread
                errors.append(e)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(runner.cleanup())
                loop.close()

        self._thread = threading.Thread(target=run, name="rft-http", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise TimeoutError(f"server on {self.host}:{self.port} did not start within {timeout}s")
        if errors:
            raise errors[0]
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop (running the app's cleanup) and join the thread."""
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
        self._thread = None


class CoordinatorServer(AppThread):
    """Serves a :class:`CoordinatorService` over HTTP from its own thread and event loop.

    ``port=0`` picks a free port; :attr:`port` and :attr:`url` are valid after :meth:`start`.
    ``advertise_host`` is the host workers use (default: ``host``, or 127.0.0.1 for a wildcard).
    ``token``: the job token the data-plane routes require; by default ``$RFT_JOB_TOKEN``
    (:func:`rft_runtime.auth.server_token`: without one it refuses to start on a cluster).
    """

    def __init__(self, service: CoordinatorService, host: str = "127.0.0.1", port: int = 0,
                 metrics_registry: Any = None, advertise_host: str | None = None, *,
                 token: str | None = None) -> None:
        token = token or auth.server_token("coordinator")
        super().__init__(create_app(service, metrics_registry, token=token), host, port)
        self.service = service
        self.advertise_host = advertise_host or ("127.0.0.1" if host in ("0.0.0.0", "::", "") else host)

    @property
    def url(self) -> str:
        """Base URL workers use (``http://host:port``)."""
        return f"http://{self.advertise_host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "CoordinatorServer":
        super().start(timeout)
        return self

    def __enter__(self) -> "CoordinatorServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
