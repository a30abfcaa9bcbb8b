"""`rft run` of examples/11-agent.yaml: an unmodified tool-calling agent (its own `openai.AsyncOpenAI`
client, pointed at the rollout's recording gateway) is the rollout, and the job trains on what it
sampled."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "11-agent.yaml"
AGENT = ROOT / "examples" / "bundles" / "openai_agent.py"


def test_the_example_ships_the_agent_file_unchanged():
    config_map, job = yaml.safe_load_all(EXAMPLE.read_text())
    assert config_map["data"]["openai_agent.py"] == AGENT.read_text()
    assert job["spec"]["evaluator"]["file"]["rollout"] == "rollout"


def test_the_agent_example_trains(tmp_path, tiny_model, rft):
    out = tmp_path / "out"
    code = rft.run(["run", str(EXAMPLE), "--out", str(out), "--no-progress"], tmp_path / "rft.log")
    log = (tmp_path / "rft.log").read_text()
    assert code == 0, log[-4000:]
    rows = rft.rows(out)
    assert [r["step"] for r in rows] == list(range(1, 7)), log[-2000:]
    for r in rows:
        # every episode the agent drove was accepted and scored, none with an error
        assert r["coord/episodes_accepted"] == 16 * r["step"] and r["errors/runtime_error"] == 0
        # the trainer's log-probs of the recorded tokens equal the engine's: the gateway kept what was sampled
        assert r["logprob_diff_abs_max"] < 1e-3
    assert any(r["grad_norm"] > 0 for r in rows)
    first = json.loads(next((out / "checkpoints" / "samples").glob("step-*.jsonl")).read_text().splitlines()[0])
    assert "Use the calculator tool" in first["prompt"] and not any(c["errors"] for c in first["completions"])
