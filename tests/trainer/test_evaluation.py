"""Held-out evaluation: the baseline before training, the best score and its kept checkpoint, and the
early stop (``evaluation.stopWhen``), as :class:`Evaluation` decides them and as a real trainer run
(builtin server, tiny model, rollout loop) carries them out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rft_api.job import validate_spec
from rft_api.progress import parse_text
from rft_runtime.coordinator import Group
from rft_runtime.metrics_sink import read_metrics
from rft_runtime.trainer.checkpoint import CheckpointManager
from rft_runtime.trainer.evaluation import EvalState, Evaluation, pass_at_k
from rft_runtime.types import Episode, Trajectory
from tests.support.runtime_config import local_config
from tests.trainer.test_trainer_loop import _run, _spec


def _evaluation(tmp_path: Path, **ev: Any) -> Evaluation:
    spec = validate_spec(_spec(Path("/nonexistent"), evaluation={"everySteps": 1, **ev}))
    return Evaluation(local_config("job", spec, inference=["http://127.0.0.1:1"], checkpoints=tmp_path / "c",
                                   output=tmp_path / "o"))


def test_best_and_patience(tmp_path):
    ev = _evaluation(tmp_path, stopWhen={"patience": 2, "minDelta": 0.05})
    assert ev._observe(0, 0.2, None) is False  # the baseline is the first best, but not a checkpoint's
    assert ev.state.baseline == 0.2 and ev.state.best_step == 0
    assert ev._observe(1, 0.24, None) is False and ev.state.since_best == 1  # within minDelta: no improvement
    assert ev._observe(2, 0.5, 0.75) is True and ev.state.best_step == 2 and ev.state.since_best == 0
    assert ev.stop_reason is None
    ev._observe(3, 0.5, None)
    ev._observe(4, 0.1, None)
    assert ev.stop_reason == "patience" and ev.state.best_score == 0.5
    assert [s for s, _ in ev.state.curve] == [0, 1, 2, 3, 4]
    assert ev.metrics() == {"eval_score": 0.1, "eval_best_score": 0.5}
    rec = ev.record()
    assert rec is not None and rec.stop_reason == "patience" and rec.best_step == 2 and rec.baseline == 0.2


def test_target_is_not_met_by_the_baseline(tmp_path):
    ev = _evaluation(tmp_path, stopWhen={"scoreAtLeast": 0.5})
    ev._observe(0, 0.9, None)  # training has not begun: the target stops nothing yet
    assert ev.stop_reason is None
    ev._observe(1, 0.5, None)
    assert ev.stop_reason == "scoreAtLeast"


def test_state_round_trip_and_old_checkpoints(tmp_path):
    ev = _evaluation(tmp_path)
    ev._observe(0, 0.1, None)
    ev._observe(1, 0.3, None)
    again = _evaluation(tmp_path)
    again.load_state_dict(json.loads(json.dumps(ev.state_dict())))
    assert again.state == ev.state and not again.wants_baseline()
    old = _evaluation(tmp_path)
    old.load_state_dict({}, eval_score=0.4)  # a checkpoint written before the evaluation state existed
    assert old.state == EvalState(score=0.4)


def test_pass_at_k():
    def group(*rewards: float | None) -> Group:
        return Group(key="t", task={}, purpose="eval", oldest_version=0, episodes=[
            Episode(task_id="t", rollout_idx=i, trajectories=[Trajectory(reward=r)]) for i, r in enumerate(rewards)])

    assert pass_at_k([group(0.0, 1.0), group(0.0, 0.0), group(None, None)], 1.0) == 0.5
    assert pass_at_k([], 1.0) is None


def test_best_checkpoint_outlives_retention(tmp_path):
    m = CheckpointManager(tmp_path, keep_last=1)
    for step in (1, 2):
        m.save(step, lambda d: (d / "w").write_text("x"))
    m.set_best(2)
    for step in (3, 4, 5):
        m.save(step, lambda d: (d / "w").write_text("x"))
    assert [c.step for c in m.committed()] == [2, 5] and m.best_step() == 2
    m.set_best(5)
    m.save(6, lambda d: (d / "w").write_text("x"))
    assert [c.step for c in m.committed()] == [5, 6]  # the old best goes once it is no longer the best
    with pytest.raises(Exception, match="no complete checkpoint of step 3"):
        m.set_best(3)


@pytest.fixture
def serve(tiny_model_dir):
    from tests.trainer.served_logprobs import builtin_server

    with builtin_server(tiny_model_dir, "job", max_batch_size=64) as url:
        yield url


def test_early_stop_on_a_target(tmp_path, tiny_model_dir, serve):
    """A greedy evaluation with a target any score meets: the baseline first (step 0), one step, its
    evaluation, then the run ends as a finished one (final checkpoint, final model, done)."""
    spec = _spec(tiny_model_dir, trainer={"maxSteps": 4},
                 checkpoint={"everySteps": 10, "keepLast": 1},
                 evaluation={"everySteps": 1, "maxTasks": 4, "temperature": 0, "stopWhen": {"scoreAtLeast": 0.0}})
    trainer, rows, _ = _run(tmp_path, serve, spec)
    assert [r["step"] for r in rows] == [1] and trainer.step_count == 1
    metrics = read_metrics(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in metrics] == [0, 1] and "eval_score" in metrics[0] and "eval_pass_at_k" in metrics[0]
    progress = parse_text((tmp_path / "out" / "progress.json").read_text())
    assert progress.done and progress.evaluation is not None
    assert progress.evaluation.stop_reason == "scoreAtLeast" and progress.evaluation.step == 1
    assert progress.evaluation.baseline is not None
    assert [c.step for c in progress.checkpoints] == [1]  # the stop's checkpoint
    assert (tmp_path / "ckpt" / "final" / "tokenizer_config.json").exists()
