"""What a test needs built before it runs (the control plane, the node, the images, ``weed``, a model),
built or waited for once per session, just before the first test that needs it, outside that test's
timeout.

``make test`` starts ``hack/prepare.sh --background`` and runs the tests while the long builds go on:
the build scripts serialise on their own locks, so a prerequisite whose build is still running is
waited for here, and one already built returns at once. The collected tests are ordered so that the
ones needing nothing come first, then by how late their prerequisites are ready on a cold machine
(:attr:`Prerequisite.rank`), so the builds and the tests overlap.

A build that fails fails once: every later test that needs it fails with the same message, and
nothing is built again in this session.

A conftest declares one with :func:`register`; the root conftest's hooks call :func:`order` and
:func:`before`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest


@dataclass
class Prerequisite:
    """One thing built for the session: ``build`` returns it or raises; ``wanted`` says whether a test
    needs it; ``rank`` orders the tests that need it after those of lower rank (its build is ready later
    on a cold machine)."""

    name: str
    rank: int
    wanted: Callable[[pytest.Item], bool]
    build: Callable[[], Any]
    _result: Any = None
    _error: str | None = None
    _done: bool = False
    _waited_s: float = field(default=0.0)

    def get(self) -> Any:
        """The built thing; fails the calling test when the build failed (without building again)."""
        if not self._done:
            self._run()
        if self._error is not None:
            pytest.fail(f"{self.name}: not built again in this run: {self._error}", pytrace=False)
        return self._result

    def _run(self, say: Callable[[str], None] | None = None) -> None:
        t0 = time.monotonic()
        try:
            self._result = self.build()
        except BaseException as e:  # noqa: BLE001 - pytest.fail's exception included: it is the message
            if isinstance(e, KeyboardInterrupt):
                raise
            self._error = str(e) or type(e).__name__
        self._done = True
        self._waited_s = time.monotonic() - t0
        if self._waited_s > 5:
            state = "ready" if self._error is None else "FAILED"
            (say or (lambda line: print(line, file=sys.stderr)))(
                f"[prereqs] {self.name} {state} after waiting {self._waited_s:.0f}s")


_REGISTRY: dict[str, Prerequisite] = {}


def register(name: str, rank: int, wanted: Callable[[pytest.Item], bool], build: Callable[[], Any]) -> Prerequisite:
    """Declare a prerequisite (once per name: a conftest imported twice keeps the first)."""
    return _REGISTRY.setdefault(name, Prerequisite(name, rank, wanted, build))


def uses_fixture(*names: str) -> Callable[[pytest.Item], bool]:
    """``wanted`` for the tests that use any of these fixtures."""
    return lambda item: any(n in getattr(item, "fixturenames", ()) for n in names)


def has_marker(name: str) -> Callable[[pytest.Item], bool]:
    """``wanted`` for the tests carrying this marker."""
    return lambda item: item.get_closest_marker(name) is not None


def rank_of(item: pytest.Item) -> int:
    """The highest rank among what the test needs; 0 when it needs nothing."""
    return max((p.rank for p in _REGISTRY.values() if p.wanted(item)), default=0)


def order(items: list[pytest.Item]) -> None:
    """Sort the tests in place (stable) by :func:`rank_of`."""
    items.sort(key=rank_of)


def before(item: pytest.Item) -> None:
    """Build (or wait for) what ``item`` needs that is not built yet in this session; a failure is
    recorded for :meth:`Prerequisite.get`, not raised here."""
    reporter = item.config.pluginmanager.get_plugin("terminalreporter")
    say = (lambda line: reporter.write_line(f"\n{line}")) if reporter is not None else None
    for p in sorted(_REGISTRY.values(), key=lambda p: p.rank):
        if not p._done and p.wanted(item):
            p._run(say)
