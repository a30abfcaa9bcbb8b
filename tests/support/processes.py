"""Stopping a server process a test started, and what a process has loaded."""

from __future__ import annotations

import subprocess
from pathlib import Path


def stop(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM ``proc``, SIGKILL it if it has not exited after ``timeout`` seconds, and reap it."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def maps_torch(pid: int) -> bool:
    """Whether process ``pid`` has torch's shared library mapped (it imported torch)."""
    return "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text()
