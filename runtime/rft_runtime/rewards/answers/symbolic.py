"""Symbolic equivalence with sympy, in a separate worker process guarded by a timeout.

``sympy.parse_expr`` evaluates Python and ``simplify`` can run for a very long time on crafted input,
so comparisons run in a child process (``sympy_worker.py``, with an address-space limit) that is
killed and restarted when a comparison overruns. Inputs are whitelisted by ``to_sympy_syntax`` first.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time

__all__ = ["SymbolicChecker", "default_checker"]

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sympy_worker.py")
_START_TIMEOUT = 120.0


class SymbolicChecker:
    """One worker process; comparisons are serialised. ``compare`` returns (True/False, how), or
    (None, why) when the comparison failed or timed out (the worker is then replaced)."""

    def __init__(self, python: str | None = None) -> None:
        self._python = python or sys.executable
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self._lock = threading.Lock()
        self.restarts = 0

    def _readline(self, timeout: float) -> bytes | None:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise EOFError("worker exited")
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _start(self) -> None:
        self._buf = b""
        self._proc = subprocess.Popen([self._python, "-I", _WORKER], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={})
        line = self._readline(_START_TIMEOUT)
        if line is None or json.loads(line)[0] != "ready":
            self._kill()
            raise RuntimeError("sympy worker did not start")

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout):
                if stream is not None:
                    stream.close()
        self._proc = None

    def compare_sync(self, a: str, b: str, timeout: float, rel_tol: float = 1e-9) -> tuple[bool | None, str]:
        """Blocking comparison; returns (equal or None, detail)."""
        with self._lock:
            try:
                if self._proc is None or self._proc.poll() is not None:
                    self._start()
                assert self._proc is not None and self._proc.stdin is not None
                self._proc.stdin.write((json.dumps([a, b, rel_tol]) + "\n").encode())
                self._proc.stdin.flush()
                line = self._readline(timeout)
            except (EOFError, OSError, RuntimeError, ValueError) as exc:
                self._kill()
                self.restarts += 1
                return None, f"symbolic worker failed: {exc}"
            if line is None:
                self._kill()
                self.restarts += 1
                return None, f"symbolic comparison timed out after {timeout}s"
        status, value = json.loads(line)
        if status == "ok":
            return bool(value), "symbolic"
        return None, f"symbolic comparison failed: {value}"

    async def compare(self, a: str, b: str, timeout: float, rel_tol: float = 1e-9) -> tuple[bool | None, str]:
        """Async wrapper: runs :meth:`compare_sync` in a thread."""
        return await asyncio.to_thread(self.compare_sync, a, b, timeout, rel_tol)

    def close(self) -> None:
        """Stops the worker process."""
        with self._lock:
            self._kill()


_default: SymbolicChecker | None = None
_default_lock = threading.Lock()


def default_checker() -> SymbolicChecker:
    """The process-wide checker (started lazily, stopped at exit)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = SymbolicChecker()
            atexit.register(_default.close)
        return _default
