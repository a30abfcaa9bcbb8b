"""Stopping a server process a test started."""

from __future__ import annotations

import subprocess


def stop(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM ``proc``, SIGKILL it if it has not exited after ``timeout`` seconds, and reap it."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
