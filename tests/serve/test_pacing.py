"""The engine's pacing (:mod:`rft_runtime.serve.pacing`): when a small batch waits for the processes
feeding it. The pressure is read from a real file in the kernel's format, written by the test."""

from __future__ import annotations

from pathlib import Path

import pytest

from rft_runtime.serve import pacing
from rft_runtime.serve.engine import Engine
from rft_runtime.serve.model import load_model
from tests.serve.support import TINY


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _write(path: Path, stalled_s: float) -> None:
    us = int(round(stalled_s * 1e6))
    path.write_text(f"some avg10=0.00 avg60=0.00 avg300=0.00 total={us}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")


def _pacer(tmp_path: Path) -> tuple[pacing.ContentionPacer, Path, _Clock]:
    f = tmp_path / "cpu.pressure"
    _write(f, 0.0)
    now = _Clock()
    return pacing.ContentionPacer(pacing.PressureClock((str(tmp_path / "missing"), str(f))), now=now), f, now


def _window(f: Path, now: _Clock, stalled_share: float, total: list[float]) -> None:
    """One window passes, with some task waiting for a CPU ``stalled_share`` of it."""
    span = pacing.WINDOW_S * 1.001
    now.t += span
    total[0] += stalled_share * span
    _write(f, total[0])


def test_pauses_a_small_batch_only_under_cpu_pressure(tmp_path):
    p, f, now = _pacer(tmp_path)
    assert p.clock.path == str(f)  # the first file that exists
    total = [0.0]
    _window(f, now, 0.05, total)  # little pressure: never a pause
    assert p.after(admitted=1, running=2, slots=32, waiting=0, iteration_s=0.0005) == 0.0
    assert p.contention == pytest.approx(0.05, rel=1e-3)
    _window(f, now, 0.3, total)  # oversubscribed
    assert p.after(admitted=1, running=2, slots=32, waiting=0, iteration_s=0.0005) == pytest.approx(0.0005)
    assert p.after(admitted=1, running=2, slots=32, waiting=0, iteration_s=0.01) == pytest.approx(0.0005)  # the budget's rest
    assert p.after(admitted=1, running=2, slots=32, waiting=0, iteration_s=0.0005) == 0.0  # the window's budget is spent
    # a batch at half its slots or more, requests waiting for admission, an empty batch: no pause
    _window(f, now, 0.3, total)
    assert p.after(admitted=1, running=16, slots=32, waiting=0, iteration_s=0.0005) == 0.0
    assert p.after(admitted=1, running=2, slots=32, waiting=1, iteration_s=0.0005) == 0.0
    assert p.after(admitted=1, running=0, slots=32, waiting=0, iteration_s=0.0005) == 0.0
    # nothing joined for a window: the batch is not being fed, a pause would not fill it
    now.t += pacing.WINDOW_S * 0.6
    assert p.after(admitted=0, running=3, slots=32, waiting=0, iteration_s=0.0005) == pytest.approx(0.0005)
    now.t += pacing.WINDOW_S * 0.6
    total[0] += 0.3 * pacing.WINDOW_S * 1.2  # still oversubscribed
    _write(f, total[0])
    assert p.after(admitted=0, running=3, slots=32, waiting=0, iteration_s=0.0005) == 0.0
    assert p.contention == pytest.approx(0.3, rel=0.01)  # the pressure was read: no admission is why
    _window(f, now, 0.3, total)
    # a pause lasts the last iteration's time, at most what is left of the window's budget (5 % of 20 ms)
    assert p.after(admitted=1, running=3, slots=32, waiting=0, iteration_s=0.0002) == pytest.approx(0.0002)
    assert p.after(admitted=1, running=3, slots=32, waiting=0, iteration_s=0.0005) == pytest.approx(0.0005)
    assert p.after(admitted=1, running=3, slots=32, waiting=0, iteration_s=0.0005) == pytest.approx(0.0003)
    assert p.after(admitted=1, running=3, slots=32, waiting=0, iteration_s=0.0005) == 0.0
    assert p.pauses == 6 and p.paused_s == pytest.approx(0.0025)
    # within a window the pressure is not read again (reading it far more often corrupts its total)
    before = p.contention
    _write(f, total[0] + 1.0)
    now.t += pacing.WINDOW_S / 4
    p.after(admitted=1, running=3, slots=32, waiting=0, iteration_s=0.0001)
    assert p.contention == before


def test_no_pressure_file_means_no_pause(tmp_path):
    p = pacing.ContentionPacer(pacing.PressureClock((str(tmp_path / "none"),)))
    assert not p.clock.available
    assert p.after(admitted=1, running=1, slots=32, waiting=0, iteration_s=0.001) == 0.0


def test_the_kernels_pressure_file_parses():
    clock = pacing.PressureClock()
    if not clock.available:
        pytest.skip("this kernel reports no CPU pressure")
    a = clock.read()
    assert a is not None and a >= 0 and clock.read() >= a
    clock.close()


def test_setting_is_checked(monkeypatch):
    assert pacing.setting("never") == "never" and pacing.setting() in pacing.CHOICES
    with pytest.raises(ValueError, match="pacing must be one of auto, never; got 'sometimes'"):
        pacing.setting("sometimes")
    monkeypatch.setenv(pacing.ENV, "off")
    with pytest.raises(ValueError, match=r"\$RFT_ENGINE_PACING must be one of auto, never; got 'off'"):
        Engine(load_model(TINY, device="cpu"))
