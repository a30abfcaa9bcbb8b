"""``rft trainer`` with ``trainer.processesPerNode: 2``: the pod entry point starts its second local
rank, the two ranks train together against a real builtin inference server and a real rollout loop,
SIGTERM to the pod's process (rank 0) stops the group after the step with a collective checkpoint
(the other rank ignores the signal and exits when rank 0 says so), and a second run resumes it to
the end."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from rft_api.job import validate_spec
from rft_runtime.metrics_sink import read_metrics
from rft_runtime.rollout.loop import RolloutLoop
from tests.support.ports import free_port
from tests.support.runtime_config import local_config, with_coordinator
from tests.trainer.served_logprobs import builtin_server

STEPS = 6


def _rollouts(cfg, should_stop) -> threading.Thread:
    loop = RolloutLoop(cfg, worker_id="w", should_stop=should_stop)
    th = threading.Thread(target=lambda: asyncio.run(loop.run()), daemon=True)
    th.start()
    return th


def _start(config: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "rft_runtime.cli", "trainer", "--config", str(config)],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT, env=env)


def test_two_local_ranks_stop_on_sigterm_and_resume(tmp_path, tiny_model_dir):
    spec = validate_spec({
        "model": {"base": str(tiny_model_dir)},
        "dataset": {"train": {"builtin": "arithmetic", "size": 8}},
        "evaluator": {"builtin": "regex", "config": {"pattern": "[0-9]"}},
        "rollout": {"samplesPerPrompt": 2, "promptsPerStep": 3, "maxTokens": 4, "concurrency": 8},
        "trainer": {"algorithm": "grpo", "learningRate": 1e-3, "maxSteps": STEPS, "microBatchSize": 2,
                    "processesPerNode": 2},
        "checkpoint": {"everySteps": 10},
    })
    port = free_port()
    out = tmp_path / "out"
    with builtin_server(tiny_model_dir, "job", max_batch_size=16) as url:
        cfg = local_config("job", spec, inference=[url], checkpoints=tmp_path / "ckpt", output=out,
                           coordinator_port=port)
        cfg = cfg.model_copy(update={"ports": cfg.ports.model_copy(update={"rendezvous": free_port()})})
        config = tmp_path / "config.json"
        config.write_text(cfg.to_json())
        log = tmp_path / "trainer.log"
        rollout_cfg = with_coordinator(cfg, f"http://127.0.0.1:{port}")
        stop = threading.Event()
        # the first rollout loop stops once a step is recorded: the trainer then waits for rollouts it cannot
        # get, so the signal finds it before its last step however fast the steps run (fed all along, a
        # loaded CI run once went through all its steps in 0.5 s, before the signal arrived)
        threads = [_rollouts(rollout_cfg, lambda: stop.is_set() or bool(read_metrics(out / "metrics.jsonl")))]
        try:
            p = _start(config, log)
            deadline = time.monotonic() + 300
            while not read_metrics(out / "metrics.jsonl"):
                assert p.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
            p.send_signal(signal.SIGTERM)  # to the pod's process only, as the kubelet does
            assert p.wait(120) == 128 + signal.SIGTERM, log.read_text()[-3000:]
            done = len(read_metrics(out / "metrics.jsonl"))
            assert 1 <= done < STEPS
            ckpt = tmp_path / "ckpt" / f"step-{done:06d}"
            assert sorted(x.name for x in (ckpt / "dcp").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]

            threads.append(_rollouts(rollout_cfg, stop.is_set))  # the first loop has stopped
            p = _start(config, log)  # the restarted group resumes and finishes
            assert p.wait(300) == 0, log.read_text()[-3000:]
        finally:
            stop.set()
            if p.poll() is None:
                p.kill()
            for th in threads:
                th.join(30)
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(1, STEPS + 1))
    assert f"resumed from {tmp_path / 'ckpt'}" in log.read_text()
