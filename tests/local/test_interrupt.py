"""Ctrl-C: SIGINT stops `rft run` cleanly with a checkpoint that `--resume` continues."""

from __future__ import annotations

import os
import signal

# Steps take well under a second: enough of them that the signal lands before the last one, whatever
# the host's speed (with 5, a fast run finished its last step before the 0.5 s poll saw step 2).
STEPS = 30
SPEC = {"trainer": {"maxSteps": STEPS}, "checkpoint": {"everySteps": 25}}


def test_sigint_leaves_a_checkpoint_that_resume_continues(tmp_path, tiny_model, manifest, rft):
    job = manifest("interrupt", **SPEC)
    out = tmp_path / "out"
    p = rft.start(["run", str(job), "--out", str(out)], tmp_path / "run.log")
    try:
        rft.wait("step 2", lambda: len(rft.rows(out)) >= 2, 600, proc=p)
        os.kill(p.pid, signal.SIGINT)  # the CLI process only, as a terminal's Ctrl-C reaches the driver
        code = p.wait(300)
    finally:
        rft.kill(p)
    log = (tmp_path / "run.log").read_text()
    assert code == 130, log[-3000:]
    assert "continue with" in log and "interrupted" in log
    done = len(rft.rows(out))
    assert 2 <= done < STEPS
    # The interrupted run checkpointed its last completed step (the periodic one would be step 25).
    assert (out / "checkpoints" / "latest").read_text().strip() == f"step-{done:06d}"

    code = rft.run(["run", str(job), "--out", str(out), "--resume", "--no-progress"], tmp_path / "resume.log")
    assert code == 0, (tmp_path / "resume.log").read_text()[-3000:]
    assert [r["step"] for r in rft.rows(out)] == list(range(1, STEPS + 1))
    assert (out / "checkpoints" / "latest").read_text().strip() == f"step-{STEPS:06d}"


def test_fresh_run_refuses_an_output_with_checkpoints(tmp_path, manifest, rft):
    job = manifest("refuse")
    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "latest").write_text("step-000002\n")
    code = rft.run(["run", str(job), "--out", str(out), "--no-progress"], tmp_path / "log")
    assert code == 2 and "--resume" in (tmp_path / "log").read_text()
    code = rft.run(["run", str(job), "--out", str(tmp_path / "empty"), "--resume", "--no-progress"],
                   tmp_path / "log2")
    assert code == 2 and "no checkpoint" in (tmp_path / "log2").read_text()
