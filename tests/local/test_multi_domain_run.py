"""`rft run` of examples/08-multi-domain.yaml: three domains mixed 0.5/0.3/0.2, each scored only by
its own evaluator (math rule twice, the code sandbox), with per-domain metrics every step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "08-multi-domain.yaml"


def test_the_multi_domain_example_mixes_routes_and_reports_per_domain(tmp_path, tiny_model, rft):
    spec = next(d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d["kind"] == "RFTJob")["spec"]
    n, max_steps = spec["rollout"]["samplesPerPrompt"], spec["trainer"]["maxSteps"]
    out = tmp_path / "out"
    code = rft.run(["run", str(EXAMPLE), "--out", str(out), "--no-progress"], tmp_path / "rft.log")
    log = (tmp_path / "rft.log").read_text()
    assert code == 0, log[-4000:]
    rows = rft.rows(out)
    assert [r["step"] for r in rows] == list(range(0, max_steps + 1))  # step 0: the baseline evaluation
    for r in rows[1:]:
        # every step holds each domain's share: 5/3/2 prompts of n samples each
        assert [r[f"domain/{d}/samples"] for d in ("arithmetic", "words", "code")] == [5 * n, 3 * n, 2 * n]
        # each evaluator scored its own domain only: its mean is that domain's reward mean
        for d in ("arithmetic", "words", "code"):
            assert r[f"reward/{d}"] == pytest.approx(r[f"domain/{d}/mean"]), (d, r)
            assert 0.0 <= r[f"domain/{d}/truncated_frac"] <= 1.0 and r[f"domain/{d}/response_len_mean"] > 0
        overall = (5 * r["domain/arithmetic/mean"] + 3 * r["domain/words/mean"] + 2 * r["domain/code/mean"]) / 10
        assert r["reward_mean"] == pytest.approx(overall)  # the logged rewards are the evaluators' own
        # code's rewards were clipped to [0, 1] and halved before the advantages
        assert r["domain/code/shaped_mean"] == pytest.approx(0.5 * r["domain/code/mean"])
        assert "domain/arithmetic/shaped_mean" in r and "domain/words/shaped_mean" not in r
    # validation per domain: every 4 steps, each domain's held-out score, the overall one their mean by sample
    evaluated = [r for r in rows if "eval_score" in r and r["step"] % 4 == 0]
    assert [r["step"] for r in evaluated] == [0, 4, 8]
    for r in evaluated:
        per = [r[f"eval_score/{d}"] for d in ("arithmetic", "words", "code")]
        assert r["eval_score"] == pytest.approx((2 * per[0] + per[1] + per[2]) / 4)
    # arithmetic's running moments went into the last checkpoint: every arithmetic sample of the job
    latest = (out / "checkpoints" / "latest").read_text().strip()
    state = json.loads((out / "checkpoints" / latest / "trainer_state.json").read_text())
    assert state["reward_moments"]["arithmetic"]["count"] == 5 * n * max_steps
