"""The progress record: tolerant of missing and unknown keys, strict about garbage, documented."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rft_api.progress import Progress, ProgressError, parse, parse_text

DOC = Path(__file__).resolve().parents[2] / "docs" / "progress.md"


def test_missing_configmap_data_or_key_is_no_record() -> None:
    assert parse(None) is None and parse({}) is None and parse({"other": "x"}) is None
    assert parse({"progress.json": "  "}) is None


def test_missing_keys_default_and_unknown_keys_are_ignored() -> None:
    p = parse({"progress.json": json.dumps({"step": 3, "futureField": {"x": 1}})})
    assert p.step == 3 and p.policy_version == 0 and p.reward_mean is None and p.checkpoints == []
    assert p.errors.timeouts == 0 and p.done is False


def test_full_record_round_trips() -> None:
    record = {
        "attempt": 1, "step": 20, "totalSteps": 30, "policyVersion": 20, "rewardMean": 0.75, "rewardStd": 0.2,
        "evalScore": 0.6, "samplesScored": 2560,
        "errors": {"timeouts": 1, "runtimeErrors": 2, "parseErrors": 3, "droppedEpisodes": 4, "reissuedLeases": 5,
                   "refusedEpisodes": 6},
        "checkpoints": [{"step": 10, "path": "/checkpoints/step-10", "time": "2025-01-01T00:00:00Z"}],
        "done": False, "message": "resumed from step 10", "updateTime": "2025-01-01T00:01:00Z",
        "rewardCurve": [{"step": 19, "mean": 0.7, "std": 0.25}, {"step": 20, "mean": 0.75, "std": 0.2}],
        "domainRewards": {"math": 0.8, "code": 0.7}, "evalDomainScores": {"math": 0.65, "code": 0.55},
        "finalModel": {"path": "final", "format": "lora", "mergedPath": "final/merged"}}
    p = parse_text(json.dumps(record))
    assert json.loads(p.to_data()["progress.json"]) == record
    assert parse(p.to_data()) == p


@pytest.mark.parametrize("text,where", [
    ("not json", "not a JSON object"),
    ("[1, 2]", "not a JSON object"),
    ('{"step": "abc"}', "step:"),
    ('{"step": -1}', "step:"),
    ('{"step": 1.5}', "step:"),
    ('{"step": true}', "step:"),
    ('{"rewardMean": NaN}', "rewardMean:"),
    ('{"rewardMean": "high"}', "rewardMean:"),
    ('{"errors": {"timeouts": -2}}', "errors.timeouts:"),
    ('{"checkpoints": [{"step": 1}]}', "checkpoints[0].path:"),
    ('{"checkpoints": {"step": 1}}', "checkpoints:"),
    ('{"done": "yes"}', "done:"),
    ('{"rewardCurve": [{"step": 1, "mean": Infinity}]}', "rewardCurve[0].mean:"),
    ('{"domainRewards": {"math": "high"}}', "domainRewards.math:"),
])
def test_garbage_is_refused_naming_the_field(text: str, where: str) -> None:
    with pytest.raises(ProgressError) as e:
        parse_text(text)
    assert where in str(e.value) and str(e.value).startswith("progress.json")


def test_non_string_value_is_refused() -> None:
    with pytest.raises(ProgressError, match="expected a string"):
        parse({"progress.json": 5})


def test_every_field_is_documented() -> None:
    doc = DOC.read_text()
    for field in Progress.model_fields.values():
        assert f"`{field.alias}`" in doc, f"docs/progress.md does not document {field.alias}"
    for field in Progress.model_fields["errors"].annotation.model_fields.values():
        assert f"`{field.alias}`" in doc, f"docs/progress.md does not document errors.{field.alias}"


def test_reward_curve_keeps_every_step_up_to_its_bound_then_thins_evenly() -> None:
    from rft_api.progress import MAX_CURVE_POINTS, reward_curve

    rows = [{"step": s, "reward_mean": s / 1200, "reward_std": None} for s in range(1, 1201)]
    assert [p.step for p in reward_curve(rows[:MAX_CURVE_POINTS])] == list(range(1, MAX_CURVE_POINTS + 1))
    pts = reward_curve(rows)
    steps = [p.step for p in pts]
    assert len(pts) == MAX_CURVE_POINTS and steps[0] == 1 and steps[-1] == 1200 and steps == sorted(set(steps))
    assert max(b - a for a, b in zip(steps, steps[1:])) <= 3  # evenly spaced
    assert reward_curve([{"step": 1, "reward_mean": float("nan")}])[0].mean is None


def test_final_model_reaches_status_with_the_claim_that_holds_it() -> None:
    from rft_api.progress import FinalModel, Progress
    from rft_operator.status import compute_status
    from tests.operator.support import make_job, observed, trainer_obs

    job = make_job()
    p = Progress(step=30, total_steps=30, done=True, final_model=FinalModel(path="final", format="full"))
    s = compute_status(job, observed(inference=1, rollout=1, trainer=trainer_obs(complete=True), progress=p))
    assert s.phase == "Succeeded"
    assert s.final_model is not None and (s.final_model.claim, s.final_model.path, s.final_model.format) == \
        ("tiny-arith-checkpoints", "final", "full")
    shared = make_job(checkpoint={"existingClaim": "team-ckpt"})
    s = compute_status(shared, observed(progress=p))
    assert s.final_model.claim == "team-ckpt"
    assert compute_status(job.model_copy(update={"status": s}), observed(progress=None)).final_model == s.final_model
