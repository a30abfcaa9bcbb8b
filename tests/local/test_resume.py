"""Resume: k steps, a kill, and the rest from the latest checkpoint equal an uninterrupted run.

Tolerance: the final weights must agree to 1e-6 (absolute, float32). On the CPU the runs are
bit-identical in practice: samples are drawn with per-task seeds from the resumed submission
counter, the data cursor, RNG, optimiser and scheduler states are restored, and every reduction
runs in the same order.
"""

from __future__ import annotations

import signal

import torch
from safetensors.torch import load_file

STEPS = 10  # enough that the kill after step 3 lands before the last step on a fast host
SPEC = {"trainer": {"maxSteps": STEPS}, "checkpoint": {"everySteps": 2, "keepLast": 3}}


def _weights(out):
    return load_file(str(out / "checkpoints" / f"step-{STEPS:06d}" / "weights.safetensors"))


def test_kill_and_resume_equals_uninterrupted(tmp_path, tiny_model, manifest, rft):
    job = manifest("resume", **SPEC)
    a, b = tmp_path / "a", tmp_path / "b"
    assert rft.run(["run", str(job), "--out", str(a), "--no-progress"], tmp_path / "a.log") == 0, \
        (tmp_path / "a.log").read_text()[-3000:]

    p = rft.start(["run", str(job), "--out", str(b), "--no-progress"], tmp_path / "b.log")
    try:
        rft.wait("step 3 of the run to kill", lambda: len(rft.rows(b)) >= 3, 600, proc=p)
    finally:
        rft.kill(p, signal.SIGKILL)  # no clean shutdown: the process group dies at once
    killed_at = len(rft.rows(b))
    assert killed_at < STEPS, "the run finished before it could be killed"
    code = rft.run(["run", str(job), "--out", str(b), "--resume", "--no-progress"], tmp_path / "b2.log")
    assert code == 0, (tmp_path / "b2.log").read_text()[-3000:]

    rows_a, rows_b = rft.rows(a), rft.rows(b)
    assert [r["step"] for r in rows_b] == list(range(1, STEPS + 1))  # redone steps are not duplicated
    assert [r["reward_mean"] for r in rows_b] == [r["reward_mean"] for r in rows_a]
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=0, atol=1e-6, msg=name)

    # A resumed run that would do zero steps is refused with a clear error.
    code = rft.run(["run", str(job), "--out", str(b), "--resume", "--no-progress"], tmp_path / "b3.log")
    assert code == 2 and "nothing to do" in (tmp_path / "b3.log").read_text()
