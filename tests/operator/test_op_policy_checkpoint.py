"""policies.checkpoint: the retained-checkpoint view."""
from __future__ import annotations

from rft_api.progress import Progress
from rft_api.status import CheckpointRecord
from rft_operator.policies import checkpoint


def prog(*steps: int) -> Progress:
    return Progress.model_validate({"checkpoints": [{"step": s, "path": f"/checkpoints/step-{s}"} for s in steps]})


def test_sorted_unique_and_trimmed_to_keep_last() -> None:
    view = checkpoint.retained(prog(30, 10, 20, 20), keep_last=2)
    assert [(c.step, c.path) for c in view] == [(20, "/checkpoints/step-20"), (30, "/checkpoints/step-30")]
    assert checkpoint.latest(view).step == 30


def test_without_progress_the_previous_view_stays() -> None:
    prev = [CheckpointRecord(step=5, path="/c/5")]
    assert checkpoint.retained(None, 3, prev) == prev
    assert checkpoint.latest([], prev[0]) == prev[0]
    assert checkpoint.latest([]) is None


def test_empty_list_shows_nothing_retained_but_keeps_last_checkpoint() -> None:
    prev = CheckpointRecord(step=5, path="/c/5")
    assert checkpoint.retained(prog(), 3, [prev]) == []
    assert checkpoint.latest([], prev) == prev
