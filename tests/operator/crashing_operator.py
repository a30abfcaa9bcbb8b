"""``python -m tests.operator.crashing_operator ARGS``: the real operator (``rft_operator.main``) that
dies abruptly (``os._exit(137)``, as if SIGKILLed) just before its N+1-th server-side apply, N from
``$CRASH_AFTER_APPLIES`` — a crash in the middle of a reconcile, at a point a test chooses.

The fault lives here, in the test tree: the product has no hook for it; this wraps ``Kube.apply``.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Any

from rft_operator import kube, main

ENV = "CRASH_AFTER_APPLIES"
KILLED_EXIT_CODE = 137
MESSAGE = "fault injection: exiting before applying"


def install(n: int) -> None:
    lock, count = threading.Lock(), [0]
    real_apply = kube.Kube.apply

    def apply(self: kube.Kube, obj: dict[str, Any], force: bool = True) -> dict[str, Any]:
        with lock:
            if count[0] >= n:
                sys.stderr.write(f"{MESSAGE} {obj['kind']}/{obj['metadata']['name']}\n")
                sys.stderr.flush()
                os._exit(KILLED_EXIT_CODE)
            count[0] += 1
        return real_apply(self, obj, force)

    kube.Kube.apply = apply  # type: ignore[method-assign]


if __name__ == "__main__":
    install(int(os.environ[ENV]))
    sys.exit(main.main(sys.argv[1:]))
