"""The engine's pacing (:mod:`rft_runtime.serve.pacing`): when a small batch waits for the processes
feeding it. The pressure is read from a real file in the kernel's format, written by the test."""

from __future__ import annotations

import os
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
    budget = pacing.PAUSE_SHARE * pacing.WINDOW_S  # the most a window spends paused
    it = budget / 2  # an iteration's time
    total = [0.0]
    _window(f, now, 0.05, total)  # little pressure: never a pause
    assert p.after(admitted=1, running=2, slots=32, waiting=0, iteration_s=it) == 0.0
    assert p.contention == pytest.approx(0.05, rel=1e-3)
    _window(f, now, 0.3, total)  # oversubscribed
    assert p.after(admitted=1, running=2, slots=32, waiting=0, iteration_s=it) == pytest.approx(it)
    assert p.after(admitted=1, running=2, slots=32, waiting=0, iteration_s=10 * it) == pytest.approx(budget - it)  # the budget's rest
    assert p.after(admitted=1, running=2, slots=32, waiting=0, iteration_s=it) == 0.0  # the window's budget is spent
    # a batch at half its slots or more, requests waiting for admission, an empty batch: no pause
    _window(f, now, 0.3, total)
    assert p.after(admitted=1, running=16, slots=32, waiting=0, iteration_s=it) == 0.0
    assert p.after(admitted=1, running=2, slots=32, waiting=1, iteration_s=it) == 0.0
    assert p.after(admitted=1, running=0, slots=32, waiting=0, iteration_s=it) == 0.0
    # nothing joined for a window: the batch is not being fed, a pause would not fill it
    now.t += pacing.WINDOW_S * 0.6
    assert p.after(admitted=0, running=3, slots=32, waiting=0, iteration_s=it) == pytest.approx(it)
    now.t += pacing.WINDOW_S * 0.6
    total[0] += 0.3 * pacing.WINDOW_S * 1.2  # still oversubscribed
    _write(f, total[0])
    assert p.after(admitted=0, running=3, slots=32, waiting=0, iteration_s=it) == 0.0
    assert p.contention == pytest.approx(0.3, rel=0.01)  # the pressure was read: no admission is why
    _window(f, now, 0.3, total)
    # a pause lasts the last iteration's time, at most what is left of the window's budget
    assert p.after(admitted=1, running=3, slots=32, waiting=0, iteration_s=0.2 * budget) == pytest.approx(0.2 * budget)
    assert p.after(admitted=1, running=3, slots=32, waiting=0, iteration_s=0.5 * budget) == pytest.approx(0.5 * budget)
    assert p.after(admitted=1, running=3, slots=32, waiting=0, iteration_s=0.5 * budget) == pytest.approx(0.3 * budget)
    assert p.after(admitted=1, running=3, slots=32, waiting=0, iteration_s=0.5 * budget) == 0.0
    assert p.pauses == 6 and p.paused_s == pytest.approx(2.5 * budget)
    # within a window the pressure is not read again (reading it far more often corrupts its total)
    before = p.contention
    _write(f, total[0] + 1.0)
    now.t += pacing.WINDOW_S / 4
    p.after(admitted=1, running=3, slots=32, waiting=0, iteration_s=0.1 * budget)
    assert p.contention == before


def test_no_pressure_file_means_no_pause(tmp_path):
    p = pacing.ContentionPacer(pacing.PressureClock((str(tmp_path / "none"),)))
    assert not p.clock.available
    assert p.after(admitted=1, running=1, slots=32, waiting=0, iteration_s=0.001) == 0.0
    bad = tmp_path / "garbled"
    bad.write_text("not the kernel's format\n")
    assert not pacing.PressureClock((str(bad),)).available  # a file that does not parse is not used


def test_a_reading_that_does_not_parse_keeps_the_last(tmp_path):
    """A read caught mid-write (or garbled) is no reading: the engine goes on, the pressure of the
    window before stands."""
    p, f, now = _pacer(tmp_path)
    total = [0.0]
    _window(f, now, 0.3, total)
    assert p.after(admitted=1, running=2, slots=32, waiting=0, iteration_s=0.0001) > 0
    f.write_text("")
    now.t += pacing.WINDOW_S * 1.001
    assert p.clock.read() is None
    assert p.after(admitted=1, running=2, slots=32, waiting=0, iteration_s=0.0001) > 0
    assert p.contention == pytest.approx(0.3, rel=1e-3)


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


async def test_the_engine_pauses_under_pressure_and_counts_it(tmp_path, monkeypatch):
    """An engine whose machine reports CPU pressure (a file in the kernel's format, kept at 50 % by a
    writer thread) pauses after admitting a small batch, and its metrics count the pauses; the request
    still gets every token. Without pressure it never pauses."""
    import asyncio
    import threading
    import time

    from rft_runtime.serve.metrics import ServeMetrics
    from rft_runtime.serve.protocol import SamplingParams
    from tests.support import metrics_text

    f = tmp_path / "cpu.pressure"
    share = {"value": 0.5}
    stop = threading.Event()

    def writer() -> None:  # in place, at a fixed width: the engine may read at any moment, as the kernel's file
        stalled = 0.0
        last = time.perf_counter()
        fd = os.open(f, os.O_WRONLY)
        try:
            while not stop.is_set():
                now = time.perf_counter()
                stalled += share["value"] * (now - last)
                last = now
                os.pwrite(fd, f"some avg10=0.00 avg60=0.00 avg300=0.00 total={int(stalled * 1e6):015d}\n".encode(), 0)
                time.sleep(0.002)
        finally:
            os.close(fd)

    _write(f, 0.0)
    monkeypatch.setattr(pacing, "PRESSURE_FILES", (str(f),))
    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    lm = load_model(TINY, device="cpu")
    try:
        for pressure, paused in ((0.5, True), (0.0, False)):
            share["value"] = pressure
            metrics = ServeMetrics()
            engine = Engine(lm, max_batch_size=32, metrics=metrics, pacing="auto")
            engine.start()
            try:
                await asyncio.sleep(5 * pacing.WINDOW_S)  # the pacer reads a whole window before the first step
                params = SamplingParams(max_tokens=16, ignore_eos=True)
                result = await engine.generate([[269, 272], [275, 280]], [params, params])
            finally:
                engine.stop()
            assert [len(s.output) for s in result.sequences] == [16, 16]
            text = metrics.render().decode()
            pauses = metrics_text.value(text, "rft_serve_engine_pauses_total")
            seconds = metrics_text.value(text, "rft_serve_engine_paused_seconds_total")
            if paused:
                assert pauses >= 1 and 0 < seconds <= pauses * pacing.PAUSE_SHARE * pacing.WINDOW_S * 1.5 + 0.01
                assert engine.pacer is not None and engine.pacer.pauses >= pauses
            else:
                assert pauses == 0 and seconds == 0
    finally:
        stop.set()
        thread.join()
