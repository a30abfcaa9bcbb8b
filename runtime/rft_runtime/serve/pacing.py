"""When the engine pauses between iterations: a small batch on a machine whose CPUs are all taken.

An iteration's time is mostly a fixed cost on a CPU (for a small model, almost all of it): 32 sequences
cost little more than 8. When the processes that feed the engine (its HTTP front end, and the clients:
rollout workers, or a load generator) run on the same cores, an engine that iterates as fast as it can
over a few sequences takes a core from them; fewer requests then reach it, its batches stay small, and
the machine can settle in a state where every token costs the most CPU. Measured on 2 cores with the
plain shape at concurrency 32 (``bench/inference.py``'s load generator on the same cores): without
pacing the same run either kept 21-24 sequences per iteration (15-16k tokens/s) or 5-9 (10-16k
tokens/s, p95 latency 0.35-0.5 s, the engine iterating about 2000 times a second on a full core); with
it and at most 5 % of the time paused, most rounds kept 19-25 and the others 7.7-13 (the budget was
then spent: 5.5 % of the time paused); with at most 15 %, 17 of 18 rounds of four runs kept 15-26, one
9.95 (the engine's counts from ``/metrics``, which ``bench/inference.py`` records per cell).

:class:`ContentionPacer` decides, after each iteration, whether the engine waits before the next one:
only while its batch is below half its slots, sequences joined it in the last :data:`WINDOW_S` (it is
being fed, so a wait lets it fill), nothing waits for admission, and in the last
:data:`WINDOW_S` some task of the machine (of the pod's cgroup, where cgroup v2 reports it) was waiting
for a CPU at least :data:`CONTENDED` of the time (the kernel's pressure stall information, "some"): the
CPUs are oversubscribed, so what the engine leaves is used by others. It then waits as long as its last
iteration took, and at most :data:`PAUSE_SHARE` of each window in all: a few
pauses are enough to let the batch fill, and where it cannot grow (fewer clients than half the slots)
the bound keeps what pausing costs small. A request arriving ends a pause. On an idle machine nothing
waits for a CPU and the engine never pauses: a lone request is not slowed down. Where the kernel does
not report CPU pressure, the engine never pauses.

``RFT_ENGINE_PACING=auto|never`` (default ``auto``; ``rft serve --engine-pacing``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from .choices import pick

ENV = "RFT_ENGINE_PACING"
CHOICES = ("auto", "never")
CONTENDED = 0.1
"""Share of the recent time during which some task waited for a CPU that counts as oversubscribed
(measured on 2 cores: 0.18-0.20 with the engine on small batches at concurrency 32, 0.08-0.12 at 8, 0.01-0.02
with one client, about 0.001 idle)."""
WINDOW_S = 0.02
"""The pressure is read once a window: read every 0.5 ms, this kernel's ``total`` nearly stopped counting
(0.5 -> 0.005 stalled seconds a second with 3 busy processes on 2 cores); every 10 ms or more it is exact."""
PAUSE_SHARE = 0.15
"""At most this share of each window is spent paused (a pause is worth it only while it lets the batch
grow; where it cannot, as with fewer clients than slots, this bounds what pausing costs). Measured on 2
cores in alternating runs: 0.05 left 4 of 14 rounds of the plain shape at concurrency 32 in the small-batch
state (mean batch 7.7-11.8); 0.15 none of 14 (15-26), and one of 4 in a later run. At concurrency 8 (the batch cannot reach half the
slots) it then pauses 8-10 % of the time against 3-4 %: ratios to vLLM of 3.45-3.70 against 3.48-3.81."""


def setting(value: str | None = None) -> str:
    """``value``, else ``$RFT_ENGINE_PACING``, else ``auto``; anything else is refused, naming it."""
    return pick(value, name="pacing", env=ENV, choices=CHOICES)


PRESSURE_FILES = ("/sys/fs/cgroup/cpu.pressure", "/proc/pressure/cpu")
"""Where CPU pressure is read: the cgroup's own (cgroup v2: a pod's processes), else the machine's."""


class PressureClock:
    """Cumulative seconds during which some task (of the cgroup, or of the machine) was runnable but
    waiting for a CPU: the ``some ... total=`` line of the kernel's pressure stall information (None
    where the kernel does not report it)."""

    def __init__(self, paths: tuple[str, ...] | None = None) -> None:
        self._fd: int | None = None
        self.path: str | None = None
        for path in PRESSURE_FILES if paths is None else paths:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            self._fd, self.path = fd, path
            if self.read() is None:
                self.close()
                continue
            break

    @property
    def available(self) -> bool:
        return self._fd is not None

    def read(self) -> float | None:
        """The stalled seconds so far; None where there is no file or its first line does not parse (the
        engine never fails over it: that window then keeps the last reading)."""
        if self._fd is None:
            return None
        try:
            line = os.pread(self._fd, 256, 0).split(b"\n", 1)[0]  # some avg10=.. avg60=.. avg300=.. total=<us>
            return int(line.rsplit(b"total=", 1)[1]) / 1e6
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class ContentionPacer:
    """See the module docstring. Call :meth:`after` from the engine thread after every iteration."""

    def __init__(self, clock: PressureClock | None = None, now: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock if clock is not None else PressureClock()
        self._now = now
        self.contention = 0.0  # the last window's fraction of time some task waited for a CPU
        self.pauses = 0
        self.paused_s = 0.0
        self._window_paused = 0.0
        self._last_admission = -float("inf")
        self._start_t = now()
        start = self.clock.read()
        self._start_stalled = start if start is not None else 0.0

    def after(self, *, running: int, slots: int, waiting: int, iteration_s: float, admitted: int = 0) -> float:
        """Seconds to wait before the next iteration (0 when it should run at once); ``admitted``: the
        sequences that joined in this iteration."""
        if not self.clock.available:
            return 0.0
        now = self._now()
        if admitted:
            self._last_admission = now
        span = now - self._start_t
        if span >= WINDOW_S:  # read at most once a window: reading it far more often corrupts its total
            stalled = self.clock.read()
            if stalled is not None:
                self.contention = (stalled - self._start_stalled) / span
                self._start_t, self._start_stalled = now, stalled
                self._window_paused = 0.0
        if waiting or not running or 2 * running >= slots or self.contention < CONTENDED \
                or now - self._last_admission > WINDOW_S:
            return 0.0
        pause = min(iteration_s, PAUSE_SHARE * WINDOW_S - self._window_paused)
        if pause <= 0:
            return 0.0
        self._window_paused += pause
        self.pauses += 1
        self.paused_s += pause
        return pause

    def close(self) -> None:
        self.clock.close()
