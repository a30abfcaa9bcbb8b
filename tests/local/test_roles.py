"""The role entry points as separate processes, the way the operator's pods run them:
`rft serve` (inference), `rft trainer --config` and `rft rollout --config`; with
`evaluator.remote` the rollout worker scores through `rft reward`."""

from __future__ import annotations

import json
import signal
import subprocess

import httpx
import pytest
import yaml

from rft_api.job import validate_spec
from tests.support import metrics_text
from tests.support.ports import free_port
from tests.support.processes import maps_torch
from tests.support.runtime_config import local_config
from tests.support.servers import wait_healthy


@pytest.mark.parametrize("remote", [False, True], ids=["in-process-scoring", "reward-role-rollout-waits-when-done"])
def test_roles_as_processes(tmp_path, tiny_model, manifest, rft, remote):
    """The roles as separate processes train 6 steps (the checks after the first run while the trainer
    is still up). The reward-role variant's rollout worker runs as
    the operator's Deployment runs it (``--when-done wait``): told "done", it stays up idle (a
    Deployment would restart a worker that exits) and exits 0 on SIGTERM."""
    job = yaml.safe_load(manifest("roles", trainer={"maxSteps": 6}, checkpoint={"everySteps": 4}).read_text())
    if remote:
        job["spec"]["evaluator"]["remote"] = True
    spec = validate_spec(job["spec"])
    p_inf, p_coord, p_rew = free_port(), free_port(), free_port()
    procs: list[subprocess.Popen] = []

    def start(args: list[str], name: str) -> subprocess.Popen:
        p = rft.start(args, tmp_path / f"{name}.log")
        procs.append(p)
        return p

    try:
        serve = start(["serve", "--model", str(tiny_model), "--host", "127.0.0.1", "--port", str(p_inf),
                       "--served-model-name", "roles", "--threads", "1"], "serve")
        reward_url = f"http://127.0.0.1:{p_rew}" if remote else None
        cfg = local_config("roles", spec, inference=[f"http://127.0.0.1:{p_inf}"], reward=reward_url,
                           coordinator_port=p_coord, checkpoints=tmp_path / "ckpt", output=tmp_path / "out")
        (tmp_path / "config.json").write_text(cfg.to_json())
        if remote:  # the reward role reads the same runtime config as every other role
            reward = start(["reward", "--config", str(tmp_path / "config.json"), "--host", "127.0.0.1",
                            "--port", str(p_rew)], "reward")
            wait_healthy(reward_url + "/health", 180, proc=reward, log=tmp_path / "reward.log")
        wait_healthy(f"http://127.0.0.1:{p_inf}/get_policy_version", 180, proc=serve, log=tmp_path / "serve.log")
        trainer = start(["trainer", "--config", str(tmp_path / "config.json")], "trainer")
        wait_healthy(f"http://127.0.0.1:{p_coord}/health", 180, proc=trainer, log=tmp_path / "trainer.log")
        rollout = start(["rollout", "--config", str(tmp_path / "config.json"), "--worker-id", "r0",
                         *(["--when-done", "wait"] if remote else [])], "rollout")
        rft.wait("the first step", lambda: len(rft.rows(tmp_path / "out")) >= 1, 600, proc=trainer)
        # No user code runs in this rollout worker (a builtin evaluator): it holds its tokenizer
        # without torch, as the inference front end does; the trainer has torch.
        assert not maps_torch(rollout.pid) and not maps_torch(serve.pid) and maps_torch(trainer.pid)
        assert "loaded (torch not imported)" in (tmp_path / "rollout.log").read_text()
        metrics = httpx.get(f"http://127.0.0.1:{p_coord}/metrics").text  # the trainer's Prometheus endpoint
        assert metrics_text.samples(metrics, "rft_trainer_reward_mean", rft_role="trainer")
        assert metrics_text.samples(metrics, "rft_trainer_step_phase_seconds", phase="update")
        assert trainer.wait(600) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
        if remote:
            rft.wait("the rollout worker to idle after done",
                     lambda: "idle until stopped" in (tmp_path / "rollout.log").read_text(), 60, proc=rollout)
            assert rollout.poll() is None, "a --when-done wait worker stays up after done"
            rollout.send_signal(signal.SIGTERM)
        assert rollout.wait(60) == 0, (tmp_path / "rollout.log").read_text()[-3000:]
        if remote:
            assert "rollout stopped by a signal" in (tmp_path / "rollout.log").read_text()
            scored = httpx.get(reward_url + "/metrics").text
            # every sample went through the reward role
            assert metrics_text.value(scored, "rft_reward_samples_total", rft_role="reward") >= 6 * 8 * 8
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            rft.kill(p)
    progress = json.loads((tmp_path / "out" / "progress.json").read_text())
    assert progress["done"] and progress["step"] == 6 and progress["policyVersion"] == 6
    assert [c["step"] for c in progress["checkpoints"]] == [4, 6]
    rows = rft.rows(tmp_path / "out")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6] and all("reward/math" in r for r in rows)
    assert all(r["time/reward"] > 0 for r in rows)


def test_trainer_rejects_a_bad_config(tmp_path, rft):
    (tmp_path / "config.json").write_text(json.dumps({"job": {"name": "x"}}))
    code = rft.run(["trainer", "--config", str(tmp_path / "config.json")], tmp_path / "log")
    assert code == 2 and "spec" in (tmp_path / "log").read_text()
