"""`rft run` of examples/07-eval-protocol.yaml: an Eval Protocol evaluation test, unchanged, is the
reward, and the tiny model learns from it."""

from __future__ import annotations

from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "07-eval-protocol.yaml"
WINDOW = 3
MIN_GAIN = 0.05


def test_the_eval_protocol_example_learns(tmp_path, tiny_model, rft):
    out = tmp_path / "out"
    code = rft.run(["run", str(EXAMPLE), "--out", str(out), "--no-progress"], tmp_path / "rft.log")
    log = (tmp_path / "rft.log").read_text()
    assert code == 0, log[-4000:]
    rows = rft.rows(out)
    assert [r["step"] for r in rows] == list(range(1, 21)), log[-2000:]
    rewards = [r["reward_mean"] for r in rows]
    # the evaluation test is the only evaluator: its per-evaluator reward is the reward
    assert all(r["reward/test_arithmetic"] == pytest.approx(r["reward_mean"]) for r in rows)
    first, last = sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW
    assert last >= first + MIN_GAIN, f"reward did not rise: {rewards}"
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-000020"
    assert "model cost map" not in log  # LiteLLM (under eval_protocol) did not try the internet
