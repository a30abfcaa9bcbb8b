"""Fault injection for tests of crash safety (off unless its environment variable is set).

``RFT_OPERATOR_EXIT_AFTER_APPLIES=N``: the process exits abruptly (``os._exit(137)``, as if killed) just
before its N+1-th server-side apply, i.e. in the middle of a reconcile.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Any, Callable, Optional

ENV_EXIT_AFTER_APPLIES = "RFT_OPERATOR_EXIT_AFTER_APPLIES"
KILLED_EXIT_CODE = 137


def exit_after_applies(n: int) -> Callable[[dict[str, Any]], None]:
    """A ``before_apply`` hook that kills the process before apply number ``n + 1``."""
    lock = threading.Lock()
    count = [0]

    def hook(obj: dict[str, Any]) -> None:
        with lock:
            if count[0] >= n:
                sys.stderr.write(f"fault injection: exiting before applying {obj['kind']}/{obj['metadata']['name']}\n")
                sys.stderr.flush()
                os._exit(KILLED_EXIT_CODE)
            count[0] += 1

    return hook


def from_env() -> Optional[Callable[[dict[str, Any]], None]]:
    raw = os.environ.get(ENV_EXIT_AFTER_APPLIES)
    return exit_after_applies(int(raw)) if raw else None
