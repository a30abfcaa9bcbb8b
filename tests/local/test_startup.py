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


def test_inference_extra_args_under_rft_run(tmp_path, manifest):
    """``spec.inference.extraArgs`` give the builtin engine under ``rft run`` what ``rft serve`` takes from them
    on a cluster; an option ``rft run`` sets itself, one ``rft serve`` does not know, or a bad value is refused
    before anything starts, naming the field."""
    from rft_runtime.local.runner import LocalRunError, RunOptions, literal_env, run_local
    from rft_runtime.serve.server import ExtraArgsError, engine_settings

    assert engine_settings([]) == {}
    assert engine_settings(["--kv-cache-dtype", "float16", "--max-batch-size=64", "--enforce-eager",
                            "--engine-pacing", "never", "--trust-request-chat-template"]) == {
        "kv_cache_dtype": "float16", "max_batch_size": 64, "cuda_graphs": "never", "pacing": "never",
        "trust_request_chat_template": True}
    for args, message in ((["--port", "9000"], "--port: rft run sets it from the port rft run binds"),
                          (["--dtype=float16"], "--dtype: rft run sets it from spec.model.dtype"),
                          (["--kv-cache-dtype", "fp8"], "argument --kv-cache-dtype: invalid choice: 'fp8'"),
                          (["--max-batch"], "unrecognized arguments: --max-batch"),
                          (["--max-batch-size", "0"], "--max-batch-size must be at least 1")):
        with pytest.raises(ExtraArgsError, match=message):
            engine_settings(args)
    out = tmp_path / "out"
    # (--model, --port, --weights-dir and the other options the operator sets are refused by the manifest's
    # own validation, on a cluster as here; --threads is rft run's own)
    job = manifest("bad-args", inference={"extraArgs": ["--threads", "4"]})
    with pytest.raises(LocalRunError, match=r"spec.inference.extraArgs: --threads: rft run sets it from rft run "
                                            r"--threads"):
        run_local(RunOptions(manifest=str(job), out=str(out)))
    assert not out.exists()  # refused before the run's directory or Ray

    # a role's env: the literal values; a secretKeyRef is left to the environment rft run started in
    from rft_api.spec import EnvVar

    entries = [EnvVar.model_validate(e) for e in (
        {"name": "A", "value": "1"}, {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": "B", "value": ""})]
    assert literal_env(entries) == {"A": "1", "B": ""}
