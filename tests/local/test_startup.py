"""What ``rft run`` does to start quickly: its driver imports no torch, the inference servers' sockets
are bound (and their URLs final) before the model loads, and the roles' environment reaches Ray's
processes without staying in the driver's."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import httpx
import pytest
from aiohttp import web

from rft_runtime.coordinator.server import AppThread, bind_socket
from rft_runtime.local.runner import _environ


def test_the_driver_imports_no_torch():
    """The modules ``rft run``'s driver loads, the errors it reports included, leave torch unimported
    (1.8 s of a start-up measured in seconds: the roles import it in their own processes)."""
    code = textwrap.dedent("""
        import sys
        from rft_runtime.local import cli, runner, actors
        cli.known_errors()
        print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_app_thread_serves_on_a_socket_bound_earlier():
    """A bound socket's port is known and held before the server starts: nothing else can bind it, a
    connection is refused until the app listens, and then the app answers on that port."""
    sock = bind_socket("127.0.0.1")
    port = sock.getsockname()[1]
    other = socket.socket()
    with pytest.raises(OSError):
        other.bind(("127.0.0.1", port))
    other.close()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/ping", timeout=2)

    async def ping(_request: web.Request) -> web.Response:
        return web.Response(text="pong")

    app = web.Application()
    app.router.add_get("/ping", ping)
    server = AppThread(app, sock=sock).start()
    try:
        assert server.port == port and server.host == "127.0.0.1"
        assert httpx.get(f"http://127.0.0.1:{port}/ping", timeout=10).text == "pong"
    finally:
        server.stop()


def test_environ_is_put_back():
    key_new, key_old = "RFT_TEST_STARTUP_NEW", "RFT_TEST_STARTUP_OLD"
    os.environ[key_old] = "before"
    try:
        with _environ({key_new: "1", key_old: "during"}):
            assert os.environ[key_new] == "1" and os.environ[key_old] == "during"
        assert key_new not in os.environ and os.environ[key_old] == "before"
        with pytest.raises(RuntimeError), _environ({key_new: "2"}):
            raise RuntimeError("the environment is put back after an error too")
        assert key_new not in os.environ
    finally:
        os.environ.pop(key_old, None)
