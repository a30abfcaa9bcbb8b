"""A real MLflow tracking server (``mlflow server`` from hack/mlflow-venv.sh's cached venv) on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.support.ports import free_port
from tests.support.processes import stop
from tests.support.servers import wait_healthy

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def running_mlflow(root: Path, artifacts: Sequence[str]) -> Iterator[str]:
    """``mlflow server`` with its SQLite store under ``root`` and ``artifacts`` (its artifact options,
    e.g. ``["--default-artifact-root", "file://..."]``); yields its URL and stops it, with the job
    workers MLflow 3 starts in its session, afterwards."""
    exe = subprocess.run(["bash", str(ROOT / "hack" / "mlflow-venv.sh")], capture_output=True, text=True,
                         check=True, timeout=1800).stdout.strip()
    port = free_port()
    log = (root / "server.log").open("w")
    proc = subprocess.Popen([exe, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                             "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", *artifacts],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=root)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url + "/health", 180, proc=proc, log=root / "server.log", what="the mlflow server to start")
        yield url
    finally:
        stop(proc)
        try:  # MLflow 3 starts job workers (huey consumers) that outlive the server: end its session's group
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        log.close()
