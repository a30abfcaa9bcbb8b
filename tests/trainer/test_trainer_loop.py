"""The trainer role end to end in one process (no Ray): builtin server + Trainer + RolloutLoop.

A random tiny model and a regex evaluator (reward 1 when a digit appears) give mixed rewards, so
every branch of a step runs: dynamic sampling, overlong shaping, KL in the loss and in the
reward, TIS, evaluation, bounded staleness (prefetch) and LoRA. Each case runs 2 steps.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rft_api.job import validate_spec
from rft_runtime.metrics_sink import read_metrics
from rft_runtime.rollout.loop import RolloutLoop
from rft_runtime.trainer.state import ResumeError
from rft_runtime.trainer.trainer import Trainer
from tests.support.runtime_config import local_config, with_coordinator
from tests.trainer.served_logprobs import builtin_server


def _spec(model_dir: Path, **over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"base": str(model_dir)},
        "dataset": {"train": {"builtin": "arithmetic", "size": 16}, "eval": {"builtin": "arithmetic", "size": 4,
                                                                              "seed": 9}},
        "evaluator": {"builtin": "regex", "config": {"pattern": "[0-9]"}},
        "rollout": {"samplesPerPrompt": 4, "promptsPerStep": 4, "maxTokens": 6, "concurrency": 16},
        "trainer": {"algorithm": "grpo", "learningRate": 1e-3, "maxSteps": 2, "microBatchSize": 4},
        "checkpoint": {"everySteps": 1, "keepLast": 2},
    }
    for k, v in over.items():
        spec[k] = {**spec.get(k, {}), **v} if isinstance(v, dict) else v
    return spec


@pytest.fixture
def serve(tiny_model_dir):
    with builtin_server(tiny_model_dir, "job", max_batch_size=64) as url:
        yield url


def _run(tmp_path: Path, url: str, spec: dict[str, Any], *, resume: bool = True, max_steps: int | None = None):
    cfg = local_config("job", validate_spec(spec), inference=[url], checkpoints=tmp_path / "ckpt",
                       output=tmp_path / "out")
    trainer = Trainer(cfg, resume=resume, max_steps=max_steps).setup()
    stop = threading.Event()
    loop = RolloutLoop(with_coordinator(cfg, trainer.coordinator_url), worker_id="w", should_stop=stop.is_set)
    th = threading.Thread(target=lambda: asyncio.run(loop.run()), daemon=True)
    th.start()
    try:
        rows = []
        while not trainer.finished:
            rows.append(trainer.step())
        trainer.finish()
    finally:
        stop.set()
        trainer.close(tell_workers_s=0)  # the worker is stopped by its flag
        th.join(30)
    return trainer, rows, loop


CASES = {
    "dapo": {"trainer": {"algorithm": "dapo", "dynamicSampling": {"enabled": True, "maxRounds": 2},
                         "overlong": {"bufferTokens": 2}}},
    "kl-loss-tis": {"trainer": {"kl": {"coef": 0.05, "estimator": "k3"}, "oldLogprobs": "recompute",
                                "importanceSampling": {"level": "sequence", "mode": "mask", "cap": 2.0},
                                "epochsPerStep": 2}},
    "kl-reward-inference-logprobs": {"trainer": {"algorithm": "rloo", "kl": {"coef": 0.05, "placement": "reward"},
                                                 "oldLogprobs": "inference"}},
    "eval-staleness": {"rollout": {"maxStaleness": 1}, "evaluation": {"everySteps": 1, "maxTasks": 4}},
    # bounded staleness: the adapter of each version is published in the background
    "lora": {"model": {"lora": {"rank": 4, "alpha": 8}}, "trainer": {"algorithm": "gspo"},
             "checkpoint": {"mergeFinalAdapter": True}, "rollout": {"maxStaleness": 1}},
}


@pytest.mark.parametrize("case", list(CASES))
def test_two_steps(tmp_path, tiny_model_dir, serve, case, monkeypatch):
    from rft_runtime.trainer.learner import Learner

    passes = []  # the trainer's no-gradient passes for old log-probs
    monkeypatch.setattr(Learner, "logprobs", lambda self, batch, f=Learner.logprobs: passes.append(1) or f(self, batch))
    spec = _spec(tiny_model_dir, **CASES[case])
    trainer, rows, loop = _run(tmp_path, serve, spec)
    assert [r["step"] for r in rows] == [1, 2]
    assert trainer.policy_version == 2
    for r in rows:
        for key in ("reward_mean", "reward/regex", "adv_mean", "response_len_mean", "clip_fraction", "approx_kl",
                    "entropy", "grad_norm", "tokens_per_s", "staleness_mean", "time/generate", "time/reward",
                    "time/old_logprob", "time/update", "time/weight_sync", "time/checkpoint",
                    "coord/episodes_accepted", "time/train", "time/publish", "time/idle_train",
                    "time/idle_generate", "overlap/bound", "overlap/achieved"):
            assert key in r, (case, key)
    progress = json.loads((tmp_path / "out" / "progress.json").read_text())
    assert progress["done"] and progress["step"] == 2 and progress["samplesScored"] >= 32
    assert [c["step"] for c in progress["checkpoints"]] == [1, 2]
    # with evaluation, step 0 is the baseline's row
    assert [r["step"] for r in read_metrics(tmp_path / "out" / "metrics.jsonl")] == (
        [0, 1, 2] if case == "eval-staleness" else [1, 2])
    assert loop.stats.tasks_done >= 8 and loop.stats.tasks_failed == 0
    # recomputed old log-probs: from the update's own forward where that gives the same numbers (one pass,
    # neither TIS nor KL in the reward needs them first), else a pass of their own; the mismatch either way
    assert len(passes) == (2 if case == "kl-loss-tis" else 0), passes
    if case != "kl-reward-inference-logprobs":
        assert all(r["logprob_diff_abs_max"] >= r["logprob_diff_abs_mean"] >= 0 for r in rows)
    if case == "dapo":
        assert all("ds_rounds" in r for r in rows)
    if case.startswith("kl"):
        assert rows[-1].get("kl_ref", 0.0) >= 0.0 and "time/ref_logprob" in rows[-1]
    if case == "kl-loss-tis":
        assert all("tis/weight_mean" in r for r in rows)
        # the second epoch of a step runs on the policy its first epoch changed, wherever there was a signal
        # to learn from (a step whose groups all scored alike has no advantage, so no update)
        learned = [r for r in rows if r["adv_abs_mean"] > 0]
        assert learned and all(r["approx_kl"] != 0.0 for r in learned), rows
    if case == "eval-staleness":
        assert "eval_score" in rows[-1] and progress["evalScore"] == rows[-1]["eval_score"]
        ev = progress["evaluation"]
        assert ev["step"] == 2 and ev["baseline"] is not None and [p["step"] for p in ev["curve"]] == [0, 1, 2]
        assert rows[-1]["staleness_max"] <= 1
    # the trained policy outlives the job: under final/ on the checkpoint volume, in Hugging Face layout
    final = tmp_path / "ckpt" / "final"
    assert (final / "tokenizer_config.json").exists()
    if case == "lora":
        assert trainer.publishes_in_background and trainer.served_version == 2 and "time/publish_background" in rows[1]
        assert (tmp_path / "ckpt" / "weights" / "v2" / "adapter_config.json").exists()
        assert (final / "adapter_config.json").exists()
        assert progress["finalModel"] == {"path": "final", "format": "lora", "mergedPath": "final/merged"}
        from transformers import AutoModelForCausalLM

        merged = AutoModelForCausalLM.from_pretrained(final / "merged")  # a plain model: the adapter merged in
        assert not hasattr(merged, "peft_config")
    else:
        assert (final / "config.json").exists() and progress["finalModel"] == {"path": "final", "format": "full"}


def test_bounded_staleness_keeps_the_next_steps_queued(tmp_path, tiny_model_dir, serve):
    """maxStaleness 2: the rollouts of the next two steps run while a step trains (the first step submits
    its own tasks and those of steps 2 and 3 at once); never a step past the last; every task submitted
    once; no episode staler than 2 versions when trained."""
    spec = _spec(tiny_model_dir, rollout={"maxStaleness": 2}, trainer={"maxSteps": 4},
                 checkpoint={"everySteps": 2})
    trainer, rows, _ = _run(tmp_path, serve, spec)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["prefetched_steps"] for r in rows] == [2, 2, 1, 0]
    assert all(r["staleness_max"] <= 2 for r in rows)
    assert rows[-1]["coord/tasks_submitted"] == 4 * 4  # promptsPerStep x maxSteps: nothing submitted twice
    assert trainer.policy_version == 4
    for r in rows:  # the overlap metrics of every step are consistent (their values are timings)
        assert 0 <= r["time/idle_generate"] <= r["time/step"] and r["overlap/bound"] >= 1.0
        assert r["time/rollout_busy"] == pytest.approx(r["time/step"] - r["time/idle_generate"])
        assert r["overlap/achieved"] > 0


def test_resume_continues_and_completes_at_the_final_checkpoint(tmp_path, tiny_model_dir, serve):
    spec = _spec(tiny_model_dir)
    _run(tmp_path, serve, spec)
    trainer, rows, _ = _run(tmp_path, serve, spec, max_steps=3)
    assert trainer.resumed_from == 2 and [r["step"] for r in rows] == [3]
    assert [r["step"] for r in read_metrics(tmp_path / "out" / "metrics.jsonl")] == [1, 2, 3]
    # killed after its final checkpoint: the next attempt finds training complete and finishes
    trainer, rows, _ = _run(tmp_path, serve, spec, max_steps=3)
    assert trainer.resumed_from == 3 and trainer.finished and rows == []
    progress = json.loads((tmp_path / "out" / "progress.json").read_text())
    assert progress["done"] and progress["step"] == 3
    # the reward curve spans the whole job, across attempts, as metrics.jsonl does
    rows = read_metrics(tmp_path / "out" / "metrics.jsonl")
    assert [(p["step"], p.get("mean")) for p in progress["rewardCurve"]] == [(r["step"], r["reward_mean"]) for r in rows]
    assert set(progress["domainRewards"]) == {"math"}  # the builtin arithmetic tasks are of domain "math"
    # a dataset edited under the job cannot be resumed: a terminal error naming it (exit 2 in a pod)
    edited = _spec(tiny_model_dir, dataset={"train": {"builtin": "arithmetic", "size": 17}})
    with pytest.raises(ResumeError, match="dataset="):
        _run(tmp_path, serve, edited, max_steps=4)


def test_the_trainers_coordinator_refuses_forged_and_poisoned_episodes_and_counts_them(tmp_path, tiny_model_dir, serve):
    """The limits come from the policy (its embedding table, rollout.maxPromptTokens, the context) and the
    refusals reach the progress record (then RFTJob status.errors.refusedEpisodes)."""
    import httpx

    from rft_runtime.types import Episode, Step, Trajectory

    spec = validate_spec(_spec(tiny_model_dir, rollout={"maxPromptTokens": 64}))
    cfg = local_config("job", spec, inference=[serve], checkpoints=tmp_path / "ckpt", output=tmp_path / "out")
    trainer = Trainer(cfg).setup()
    try:
        limits = trainer.limits
        assert limits.vocab_size == trainer.model.get_input_embeddings().num_embeddings
        assert limits.max_prompt_tokens == 64 and limits.max_model_len == trainer.model.config.max_position_embeddings
        [key] = trainer._submit(trainer._next_tasks(1))
        url = trainer.coordinator_url
        lease = httpx.post(f"{url}/v1/lease", json={"worker_id": "w", "max_tasks": 1}, timeout=30).json()["tasks"][0]
        assert lease["task_key"] == key

        def episode(response_ids: list[int]) -> dict:
            step = Step(prompt_ids=[1, 2], response_ids=response_ids, response_mask=[1] * len(response_ids),
                        logprobs=[-0.1] * len(response_ids), reward=1.0, policy_version=0, finish_reason="stop")
            return Episode(id=f"{key}:0", task_id=key, rollout_idx=0,
                           trajectories=[Trajectory(steps=[step], reward=1.0)]).model_dump(mode="json")

        # another worker, naming a lease it does not hold: refused
        r = httpx.post(f"{url}/v1/episodes", timeout=30, json={"worker_id": "intruder", "lease_ids": ["forged"],
                                                               "episodes": [episode([5])]})
        assert r.status_code == 409, r.text
        # the lease holder, with a token id outside the policy's vocabulary: refused before the trainer
        r = httpx.post(f"{url}/v1/episodes", timeout=30, json={"worker_id": "w", "lease_ids": [lease["lease_id"]],
                                                               "episodes": [episode([limits.vocab_size + 5])]})
        assert r.status_code == 422 and "vocab" in r.text, r.text
        trainer._report()
        progress = json.loads((tmp_path / "out" / "progress.json").read_text())
        assert progress["errors"]["refusedEpisodes"] == 2
    finally:
        trainer.close(tell_workers_s=0)  # no worker is left to tell


def test_a_waiting_worker_exits_when_the_trainer_stops_unfinished_and_idles_when_it_finishes(
        tmp_path, tiny_model_dir, serve):
    """`rft rollout --when-done wait` (the operator's rollout Deployments), as a process: a trainer that
    stops before the end (its pod deleted) says done but not finished, and the worker exits 0 by itself,
    so that its restart reaches the trainer's next attempt; after a finished run it stays up, idle, until
    SIGTERM."""
    from tests.local.conftest import kill_session, start_rft
    from tests.support.polling import wait_for

    spec = validate_spec(_spec(tiny_model_dir, trainer={"maxSteps": 2}))
    for attempt, finish in (("stopped", False), ("finished", True)):
        cfg = local_config("job", spec, inference=[serve], checkpoints=tmp_path / "ckpt",
                           output=tmp_path / f"out-{attempt}")
        trainer = Trainer(cfg, resume=True).setup()  # the second attempt resumes from the first's step 1
        config = tmp_path / f"config-{attempt}.json"
        config.write_text(with_coordinator(cfg, trainer.coordinator_url).to_json())
        log = tmp_path / f"rollout-{attempt}.log"
        worker = start_rft(["rollout", "--config", str(config), "--worker-id", "w", "--when-done", "wait"], log)
        try:
            try:
                trainer.step()
                if finish:
                    while not trainer.finished:
                        trainer.step()
                    trainer.finish()
            finally:
                trainer.close()
            if finish:
                wait_for("the worker to idle", lambda log=log: "idle until stopped" in log.read_text(), 60, proc=worker)
                assert worker.poll() is None
                worker.send_signal(signal.SIGTERM)
            assert worker.wait(60) == 0, log.read_text()[-3000:]
        finally:
            kill_session(worker)
        text = log.read_text()
        if finish:
            assert "'ended': 'done'" in text and "stopped by a signal" in text, text[-3000:]
        else:
            assert "'ended': 'trainer stopped'" in text, text[-3000:]
            assert "idle until stopped" not in text and "stopped by a signal" not in text


def test_publication_in_the_background_keeps_episodes_within_the_staleness_bound(tmp_path, tiny_model_dir, serve,
                                                                                   monkeypatch):
    """maxStaleness 1: each version is published in a thread while the next step trains; the tasks
    submitted meanwhile wait for it (``min_version``). Publications made slow here (0.4 s, longer than
    sampling a step's tasks) would otherwise let those tasks be sampled from the version before, two
    versions older than the policy their step trains."""
    from rft_runtime.trainer.publisher import WeightPublisher

    def slow_load(self, path, version, load=WeightPublisher.load):
        if version > 0:
            time.sleep(0.4)
        return load(self, path, version)

    monkeypatch.setattr(WeightPublisher, "load", slow_load)
    spec = _spec(tiny_model_dir, rollout={"maxStaleness": 1}, trainer={"maxSteps": 5}, checkpoint={"everySteps": 5})
    trainer, rows, _ = _run(tmp_path, serve, spec)
    assert trainer.publishes_in_background
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert all(r["staleness_max"] <= 1 for r in rows), [r["staleness_max"] for r in rows]
    assert rows[-1]["coord/groups_dropped_stale"] == 0
    # the previous step's publication ran while this one trained (and waited for it), and is reported by it
    assert "time/publish_background" not in rows[0]
    assert all(r["time/publish_background"] >= 0.4 for r in rows[1:])
    # finish() waited for the last one: every version served in order, the last one pointed to
    assert trainer.policy_version == trainer.served_version == 5
    current = json.loads((tmp_path / "ckpt" / "weights" / "current.json").read_text())
    assert current["policy_version"] == 5


def test_rewards_out_of_scale_skip_their_steps_and_end_the_run_with_the_checkpoints_intact(
        tmp_path, tiny_model_dir, serve, monkeypatch):
    """Every step's rewards × 1e300 (an evaluator gone wrong with a range that admits it): each
    advantage overflows float32, no step changes the weights, and at trainer.maxNonFiniteSteps in a
    row the run ends; the checkpoints hold finite weights, the base model's."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from rft_runtime.trainer import trainer as trainer_module
    from rft_runtime.trainer.finite import NonFiniteTraining
    from rft_runtime.trainer.state import WEIGHTS_FILE

    real = trainer_module.shaped_rewards
    def huge(*a: Any, **kw: Any) -> torch.Tensor:
        r = real(*a, **kw)
        return r + 1e300 * torch.arange(len(r), dtype=r.dtype)

    monkeypatch.setattr(trainer_module, "shaped_rewards", huge)
    spec = _spec(tiny_model_dir, trainer={"algorithm": "rloo", "maxNonFiniteSteps": 2, "maxSteps": 4})
    with pytest.raises(NonFiniteTraining, match=r"2 steps in a row \(up to step 2\).*step 1\) is intact"):
        _run(tmp_path, serve, spec)
    rows = read_metrics(tmp_path / "out" / "metrics.jsonl")
    assert [(r["step"], r["nonfinite_skipped"]) for r in rows] == [(1, 1.0)]
    saved = load_file(str(tmp_path / "ckpt" / "step-000001" / WEIGHTS_FILE))
    base = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).named_parameters())
    assert saved and all(torch.isfinite(t).all() for t in saved.values())
    assert all(torch.equal(t, base[k].detach()) for k, t in saved.items() if k in base) and set(saved) & set(base)


def test_a_deleted_checkpoint_volume_is_checkpoint_lost_not_step_zero(tmp_path, tiny_model_dir, serve):
    """The progress record outlives the checkpoint volume: a trainer that finds the checkpoints it lists
    gone stops (CheckpointLost, exit 2 in a pod) instead of training again from step 0."""
    import shutil

    from rft_runtime.trainer.checkpoint import CheckpointLost
    from rft_runtime.trainer.terminal import terminal_reason

    spec = _spec(tiny_model_dir)
    _run(tmp_path, serve, spec)
    shutil.rmtree(tmp_path / "ckpt")
    with pytest.raises(CheckpointLost, match=r"holds no checkpoint, yet the job's progress record \(step 2\) lists "
                                             r"checkpoints of steps 1, 2") as err:
        _run(tmp_path, serve, spec, max_steps=3)
    assert terminal_reason(err.value) == "CheckpointLost"


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_checkpoint_volume_is_terminal_and_named(tmp_path, tiny_model_dir, serve):
    """A checkpoint volume too small for one checkpoint: the save fails with ENOSPC, which the trainer
    reports as CheckpointVolumeFull (exit 2) rather than crash and restart into the same full volume."""
    import subprocess

    from rft_runtime.trainer.terminal import terminal_line, terminal_reason

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(ckpt)], check=True)
    try:
        with pytest.raises(Exception) as err:
            _run(tmp_path, serve, _spec(tiny_model_dir))
    finally:
        subprocess.run(["umount", "-l", str(ckpt)], check=True)
    assert terminal_reason(err.value) == "CheckpointVolumeFull", repr(err.value)
    assert terminal_line("CheckpointVolumeFull", err.value).startswith(
        "rft trainer: CheckpointVolumeFull: the checkpoint volume is full (")
