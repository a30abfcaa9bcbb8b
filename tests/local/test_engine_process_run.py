"""`rft run --engine-process`: each inference actor runs its engine in a child process (spawned from a
Ray worker), which logs to the actor's log, serves every policy version, and ends with its run, with the
engine options of ``spec.inference.extraArgs`` and the variables of ``spec.inference.env``; and the
rollout actor, which imports no torch when no user code runs in it."""

from __future__ import annotations

import os
import re


def test_rft_run_with_the_engine_in_a_process_of_its_own(tmp_path, tiny_model, manifest, rft):
    job = manifest("engine-process", trainer={"maxSteps": 3},
                   inference={"extraArgs": ["--kv-cache-dtype", "bfloat16", "--max-batch-size", "24"],
                              "env": [{"name": "RFT_ENGINE_KERNELS", "value": "torch"}]})
    out = tmp_path / "out"
    code = rft.run(["run", str(job), "--out", str(out), "--no-progress", "--engine-process"], tmp_path / "run.log")
    assert code == 0, (tmp_path / "run.log").read_text()[-3000:]
    assert [r["step"] for r in rft.rows(out)] == [1, 2, 3]
    text = (out / "logs" / "inference-0.log").read_text()
    started = re.findall(r"\[engine\]: engine process (\d+) \(parent \d+\)", text)
    assert len(started) == 1, text[-3000:]
    pid = int(started[0])
    assert "serving policy version 3 (full weights)" in text
    # extraArgs reached the engine (its batch and cache), env its process (torch's kernels, not the native ones)
    assert "engine: 24 sequences at once, KV cache bfloat16" in text and "; torch kernels)" in text, text[-3000:]
    # the run kills its actors; the engine process goes with its actor (killed, or at its pipe's end)
    rft.wait("the engine process to end", lambda: not os.path.exists(f"/proc/{pid}"), 30)
    # the rollout actor runs none of the job's code (a builtin evaluator): it never imported torch
    rollout = (out / "logs" / "rollout-0.log").read_text()
    assert "loaded (torch not imported)" in rollout, rollout[-3000:]
