"""Waiting for a server a test started (a role's CLI, MLflow) to answer over HTTP."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx

from tests.support.polling import wait_for


def log_tail(log: Path, chars: int = 3000) -> str:
    """The end of a server's log (what a failed start printed)."""
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError as e:
        return f"<no log {log}: {e}>"


def wait_healthy(url: str, timeout: float, *, proc: subprocess.Popen | None = None, log: Path | None = None,
                 interval: float = 0.25, what: str | None = None) -> None:
    """Poll ``GET url`` until it answers 200 (a connection refused or a request error is "not yet").

    Fails at ``timeout`` seconds, or as soon as ``proc`` (the server's process) has exited, with the
    tail of ``log``."""
    def answers() -> bool:
        try:
            return httpx.get(url, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(what or f"{url} to answer 200", answers, timeout, interval, proc=proc,
             on_timeout=(lambda: log_tail(log)) if log is not None else None)
