"""Polling with a deadline, for tests that wait on something outside the test process."""

from __future__ import annotations

import subprocess
import time
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class TimedOut(AssertionError):
    """A wait ran past its deadline; the message names what was awaited and the last value seen."""


class ProcessExited(AssertionError):
    """The process a wait depended on exited before the wait was over."""


def wait_for(what: str, fn: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.25, *,
             proc: subprocess.Popen | None = None, on_timeout: Callable[[], str] | None = None,
             retry_on: tuple[type[BaseException], ...] = ()) -> T:
    """Poll ``fn`` until it returns something truthy and return that. An exception in ``retry_on`` counts
    as a falsy answer. At ``timeout`` seconds raise :class:`TimedOut` naming ``what``, the last value
    and ``on_timeout()`` (diagnostics). With ``proc``, raise :class:`ProcessExited` (with the same
    diagnostics) as soon as that process has exited and ``fn`` still answers falsy."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = fn()
        except retry_on as e:
            last = f"<{e}>"
        else:
            if last:
                return last
        if proc is not None and proc.poll() is not None:
            extra = f"\n{on_timeout()}" if on_timeout is not None else ""
            raise ProcessExited(f"process exited ({proc.returncode}) before {what}{extra}")
        if time.monotonic() > deadline:
            extra = f"\n{on_timeout()}" if on_timeout is not None else ""
            raise TimedOut(f"timed out after {timeout:.0f}s waiting for {what} (last: {str(last)[:1500]}){extra}")
        time.sleep(interval)
