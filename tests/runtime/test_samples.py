"""Samples people can read (``spec.tracking.samples``): which steps are written, what a prompt's record
holds (decoded by the tiny model's real tokenizer), texts cut in the middle, secrets masked, the files on
the checkpoint volume, the TensorBoard text, the bounded ``samples.json`` kept across a resumed attempt,
the W&B table (the real SDK, offline), and what ``rft samples`` prints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rft_api.job import validate_spec
from rft_runtime import samples_view
from rft_runtime.coordinator import Group
from rft_runtime.samples_view import (
    MAX_DOC_BYTES,
    SamplesError,
    bound_steps,
    cut_middle,
    format_step,
    mask,
    parse_steps,
    pick_step,
    secret_values,
)
from rft_runtime.trainer.report import RunReport
from rft_runtime.trainer.samples import SampleLog, markdown, pick_groups
from rft_runtime.types import Episode
from tests.support.mlflow_server import running_mlflow
from tests.support.runtime_config import local_config

SECRET = "hf_s3cr3tT0kenValue42"
OTHER = "sk-live-0123456789abcdef"


@pytest.fixture(scope="module")
def tokenizer(tiny_random_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_random_dir)


def make_config(tmp_path: Path, **samples: Any):
    spec = validate_spec({"model": {"base": "builtin:tiny"}, "dataset": {"train": {"builtin": "arithmetic"}},
                          "evaluator": {"builtin": "math"}, "tracking": {"samples": samples},
                          "trainer": {"env": [{"name": "MY_DB_CREDENTIAL",
                                               "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}})
    return local_config("job", spec, inference=["http://127.0.0.1:9"], checkpoints=tmp_path / "ckpt",
                        output=tmp_path / "out")


def open_report(cfg) -> RunReport:
    report = RunReport(cfg, attempt=1, max_steps=30)
    report.open_progress()
    report.open_metrics(0, resumed=False)
    return report


def episode(tok, task_id: str, idx: int, prompt: str, completion: str, reward: float | None, **kw: Any) -> Episode:
    p, r = tok.encode(prompt, add_special_tokens=False), tok.encode(completion, add_special_tokens=False)
    step = {"prompt_ids": p, "response_ids": r, "logprobs": [-0.5] * len(r), "finish_reason": kw.pop("finish", "stop"),
            "truncated": kw.pop("truncated", False), "policy_version": 0}
    return Episode.model_validate({"task_id": task_id, "rollout_idx": idx, "is_correct": reward == 1.0,
                                   "trajectories": [{"name": "default", "steps": [step], "reward": reward}], **kw})


def group(tok, n: int, rewards: list[float | None], completions: list[str] | None = None) -> Group:
    task_id = f"arith-{n}"
    prompt = f"What is {n} + {n}?"
    texts = completions or [f"The answer is {2 * n + i}." for i in range(len(rewards))]
    eps = [episode(tok, task_id, i, prompt, t, r, reward_reason=f"expected {2 * n}, got {2 * n + i}")
           for i, (t, r) in enumerate(zip(texts, rewards))]
    task = {"task_id": task_id, "prompt": prompt, "ground_truth": str(2 * n), "domain": "default", "metadata": {}}
    return Group(key=f"{task_id}@{n}", task=task, purpose="train", episodes=eps, oldest_version=0)


def groups(tok, k: int = 6) -> list[Group]:
    """``k`` groups whose mean rewards are 0, 1/3, 2/3, 1, ... (group i: i % 4 of 3 samples correct)."""
    return [group(tok, i, [1.0 if j < i % 4 else 0.0 for j in range(3)]) for i in range(k)]


# ------------------------------------------------------------------ texts


def test_cut_middle_keeps_both_ends_and_says_how_much_was_cut():
    text = "HEAD" + "x" * 5000 + "TAIL"
    out = cut_middle(text, 200)
    assert len(out) <= 200 and out.startswith("HEAD") and out.endswith("TAIL")
    assert "…[4831 characters cut]…" in out and len(out) == 200
    assert cut_middle("short", 200) == "short"
    again = cut_middle(out, 120)  # cut once more: the marker counts every character cut
    assert again.startswith("HEAD") and again.endswith("TAIL") and len(again) == 120
    assert "…[4911 characters cut]…" in again


def test_secrets_of_the_trainer_are_masked(monkeypatch):
    monkeypatch.setenv("RFT_HF_TOKEN", SECRET)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "pw")  # named: masked whatever its length
    monkeypatch.setenv("OPENAI_API_KEY", OTHER)  # *_KEY, 8 characters or more
    monkeypatch.setenv("SORT_KEY", "abc")  # *_KEY but too short to be a secret
    monkeypatch.setenv("MY_DB_CREDENTIAL", "db-credential-1")  # named by the caller (a secretKeyRef)
    values = secret_values(names=["MY_DB_CREDENTIAL"])
    assert {SECRET, OTHER, "pw", "db-credential-1"} <= set(values) and "abc" not in values
    text = f"token {SECRET} key {OTHER} abc db-credential-1"
    assert mask(text, values) == "token *** key *** abc ***"


# ------------------------------------------------------------------ which steps, which prompts


def test_written_at_the_first_step_every_k_steps_and_the_last(tmp_path):
    log = SampleLog(make_config(tmp_path, everySteps=5), open_report(make_config(tmp_path)))
    assert [s for s in range(1, 13) if log.due(s, last=s == 12)] == [1, 5, 10, 12]
    never = SampleLog(make_config(tmp_path, everySteps=0), open_report(make_config(tmp_path)))
    assert not any(never.due(s, last=True) for s in range(1, 5))


def test_prompts_are_spread_over_the_rewards(tokenizer):
    gs = groups(tokenizer, 8)  # mean rewards 0, 1/3, 2/3, 1, 0, 1/3, 2/3, 1
    picked = pick_groups(gs, 3)
    means = [sum(e.reward for e in g.episodes) / 3 for g in picked]
    assert min(means) == 0.0 and max(means) == 1.0 and len(picked) == 3
    assert [g.key for g in picked] == [g.key for g in gs if g in picked]  # in the step's order
    assert pick_groups(gs, 8) == gs and pick_groups(gs[:2], 4) == gs[:2]
    assert pick_groups(gs, 3) == picked  # deterministic


# ------------------------------------------------------------------ what is written


def test_a_step_written_everywhere(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setenv("RFT_HF_TOKEN", SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", OTHER)
    cfg = make_config(tmp_path, perStep=2, maxChars=200)
    report = open_report(cfg)
    log = SampleLog(cfg, report)
    long = "Let me think. " + "step " * 300 + f"so {SECRET} and {OTHER} give 2."
    g0 = group(tokenizer, 1, [1.0, 0.0], completions=["2", long])
    g0.episodes[1] = g0.episodes[1].model_copy(update={
        "termination_reason": "length", "reward_reason": f"no number; judge said {OTHER}"})
    g0.episodes[1].errors.parse_error = True
    g0.episodes[1].errors.message = "could not parse"
    gs = [g0, group(tokenizer, 2, [0.0, 0.0]), group(tokenizer, 3, [0.0, 0.5])]  # picked: the lowest, the highest

    log.record(1, gs, tokenizer)
    log.record(2, gs, tokenizer)  # everySteps 1: every step
    report.metrics.close()
    assert log.errors == 0

    # the file on the checkpoint volume: one prompt per line, perStep of them
    rows = [json.loads(line) for line in (tmp_path / "ckpt" / "samples" / "step-000001.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and (tmp_path / "ckpt" / "samples" / "step-000002.jsonl").is_file()
    first = next(r for r in rows if r["task_id"] == "arith-1")
    assert first["step"] == 1 and first["prompt"] == "What is 1 + 1?" and first["reference"] == "2"
    assert first["reward_mean"] == 0.5
    ok, bad = first["completions"]
    assert ok == {"index": 0, "text": "2", "reward": 1.0, "correct": True, "reason": "expected 2, got 2",
                  "finish": "stop", "truncated": False, "termination": None, "errors": [], "error": None,
                  "tokens": len(tokenizer.encode("2", add_special_tokens=False))}
    assert bad["correct"] is False and bad["termination"] == "length" and bad["errors"] == ["parse_error"]
    assert bad["error"] == "could not parse" and bad["reason"] == "no number; judge said ***"
    assert len(bad["text"]) <= 200 and bad["text"].startswith("Let me think.") and "characters cut]…" in bad["text"]
    assert bad["text"].endswith("*** give 2.") and SECRET not in bad["text"] and OTHER not in bad["text"]

    # samples.json next to progress.json: both steps
    doc = json.loads((tmp_path / "out" / "samples.json").read_text())
    assert [s["step"] for s in doc["steps"]] == [1, 2] and doc["steps"][0]["samples"] == rows

    # TensorBoard: markdown text under "samples" at each step
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "out" / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    events = acc.Tensors("samples/text_summary")
    assert [e.step for e in events] == [1, 2]
    text = events[0].tensor_proto.string_val[0].decode()
    assert "### prompt 1: task arith-1" in text and "What is 1 + 1?" in text and "reward 1.000" in text
    assert SECRET not in text and "no number; judge said \\*\\*\\*" in text


def test_samples_json_keeps_the_first_and_newest_steps_and_a_resumed_attempt_redoes_later_ones(tmp_path, tokenizer):
    cfg = make_config(tmp_path, perStep=1)
    log = SampleLog(cfg, open_report(cfg))
    gs = groups(tokenizer, 2)
    for step in range(1, 13):
        log.record(step, gs, tokenizer)
    kept = lambda: [s["step"] for s in json.loads((tmp_path / "out" / "samples.json").read_text())["steps"]]  # noqa: E731
    assert kept() == [1, 6, 7, 8, 9, 10, 11, 12]
    assert len(list((tmp_path / "ckpt" / "samples").glob("step-*.jsonl"))) == 12  # every step's file stays

    # the trainer restarts from the checkpoint of step 9: its first step is 10, and steps 10-12 are redone
    again = SampleLog(cfg, open_report(cfg))
    again.record(10, gs, tokenizer)
    assert kept() == [1, 4, 5, 6, 7, 8, 9, 10]


def test_samples_json_stays_under_its_bound():
    big = "y" * 20_000
    def step(n: int) -> dict:
        comps = [{"index": i, "text": big, "reward": 0.5, "reason": big} for i in range(40)]
        return {"step": n, "samples": [{"task_id": f"t{j}", "prompt": big, "completions": comps} for j in range(40)]}

    steps = bound_steps([step(n) for n in range(1, 30)])
    assert len(samples_view.dump_steps(steps).encode()) <= MAX_DOC_BYTES
    assert steps[-1]["step"] == 29  # the newest step is there, its texts cut, some prompts or completions left out
    newest = steps[-1]
    assert newest["samples"] and "characters cut]…" in newest["samples"][0]["completions"][0]["text"]
    assert newest.get("omitted_prompts") or newest["samples"][0].get("omitted_completions")
    small = bound_steps([{"step": n, "samples": [{"task_id": "t", "prompt": "p", "completions": []}]}
                         for n in range(1, 30)])
    assert [s["step"] for s in small] == [1, 23, 24, 25, 26, 27, 28, 29]


def test_nothing_is_written_with_every_steps_0(tmp_path, tokenizer):
    cfg = make_config(tmp_path, everySteps=0)
    log = SampleLog(cfg, open_report(cfg))
    log.record(1, groups(tokenizer, 2), tokenizer, last=True)
    assert not (tmp_path / "ckpt" / "samples").exists() and not (tmp_path / "out" / "samples.json").exists()


def test_a_failing_destination_never_stops_training(tmp_path, tokenizer, caplog):
    cfg = make_config(tmp_path)
    report = open_report(cfg)

    class Broken:
        def write_samples(self, data: str) -> None:
            raise OSError("the API server is down")

    report.progress_sink = Broken()  # type: ignore[assignment]
    log = SampleLog(cfg, report)
    log.record(1, groups(tokenizer, 2), tokenizer)
    log.record(2, groups(tokenizer, 2), tokenizer)
    assert log.errors == 2 and (tmp_path / "ckpt" / "samples" / "step-000002.jsonl").is_file()
    assert sum("the API server is down" in r.getMessage() for r in caplog.records) == 1  # warned once


# ------------------------------------------------------------------ reading them


def test_rft_samples_prints_a_local_run(tmp_path, tokenizer, capsys):
    from rft_runtime.cli import main

    cfg = make_config(tmp_path, perStep=2, everySteps=2)
    log = SampleLog(cfg, open_report(cfg))
    gs = groups(tokenizer, 4)
    for step in range(1, 5):
        log.record(step, gs, tokenizer)
    (tmp_path / "ckpt").rename(tmp_path / "out" / "checkpoints")  # rft run's layout: DIR/checkpoints/samples/

    assert main(["samples", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("step 4: 2 prompts   (steps written: 1, 2, 4)")
    assert "━━ prompt 1/2 · task arith-0 · reference 0 · mean reward 0.000" in out
    assert "  ── completion 0 · reward 0.000 · not correct · stop" in out
    assert "     The answer is 0." in out and "     reason: expected 0, got 0" in out

    assert main(["samples", str(tmp_path / "out"), "--step", "2", "-o", "json"]) == 0
    entry = json.loads(capsys.readouterr().out)
    assert entry["step"] == 2 and len(entry["samples"]) == 2

    assert main(["samples", str(tmp_path / "out"), "--step", "3"]) == 1
    assert "no samples of step 3" in capsys.readouterr().err


def test_format_and_pick_from_samples_json():
    entry = {"step": 7, "samples": [{"task_id": "t1", "prompt": "P" * 2000, "reference": None, "reward_mean": None,
                                     "completions": [{"index": 0, "text": "hi\nthere", "reward": None,
                                                      "correct": None, "finish": "length", "truncated": True,
                                                      "errors": ["timeout"], "error": "took 30s"}]}]}
    text = format_step(entry, steps=[1, 7])
    assert text.splitlines()[0] == "step 7: 1 prompt   (steps kept: 1, 7)"
    assert "━━ prompt 1/1 · task t1 · mean reward n/a" in text and "characters cut]…" in text
    assert "  ── completion 0 · reward n/a · length · errors: timeout" in text
    assert "     hi\n     there" in text and "     error: took 30s" in text
    steps = parse_steps(json.dumps({"steps": [entry, {"step": 1, "samples": []}]}))
    assert [s["step"] for s in steps] == [1, 7] and pick_step(steps, None, "x")["step"] == 7
    with pytest.raises(SamplesError, match=r"step 3 is not kept in x \(steps kept: 1, 7\).*samples/step-000003.jsonl"):
        pick_step(steps, 3, "x")


def test_markdown_fences_hold_any_text():
    rows = [{"task_id": "t_1", "prompt": "```code```", "reference": "4", "reward_mean": 1.0,
             "completions": [{"index": 0, "text": "````", "reward": 1.0, "correct": True, "finish": "stop"}]}]
    md = markdown(3, rows)
    assert "`````\n````\n`````" in md and "````\n```code```\n````" in md and "task t\\_1" in md


# ------------------------------------------------------------------ W&B


def test_wandb_offline_run_gets_a_samples_table(tmp_path, tokenizer):
    from rft_runtime.trainer.tracking import WANDB_SAMPLE_COLUMNS, WandbTracker

    cfg = make_config(tmp_path, perStep=2)
    report = open_report(cfg)
    tracker = WandbTracker("rft-test", "job", tmp_path / "tracking").start({"a": 1})
    report.trackers = [tracker]
    SampleLog(cfg, report).record(1, groups(tokenizer, 3), tokenizer)
    tracker.log_metrics(1, {"reward_mean": 0.5})
    tracker.finish()
    assert tracker.errors == 0
    tables = list((tmp_path / "tracking" / "wandb").rglob("samples_*.table.json"))
    assert len(tables) == 1, list((tmp_path / "tracking" / "wandb").rglob("*"))
    table = json.loads(tables[0].read_text())
    assert table["columns"] == list(WANDB_SAMPLE_COLUMNS) and len(table["data"]) == 6  # 2 prompts x 3 completions
    assert table["data"][0][:3] == ["arith-0", "What is 0 + 0?", "0"]


# ------------------------------------------------------------------ MLflow


@pytest.fixture(scope="module")
def mlflow_proxy(tmp_path_factory: pytest.TempPathFactory):
    """A real ``mlflow server`` serving its runs' artifacts itself, as it does by default: runs get
    ``mlflow-artifacts:`` URIs and the files land under ``--artifacts-destination``."""
    root = tmp_path_factory.mktemp("mlflow")
    with running_mlflow(root, ["--artifacts-destination", str(root / "artifacts")]) as url:
        yield url


def test_mlflow_run_gets_each_written_step_as_an_artifact(mlflow_proxy, tmp_path, tokenizer):
    import httpx

    from rft_runtime.trainer.tracking import MlflowTracker

    cfg = make_config(tmp_path, perStep=2, everySteps=2)
    report = open_report(cfg)
    tracker = MlflowTracker(mlflow_proxy, "ns/samples", "job", tmp_path / "tracking").start({"a": "1"})
    report.trackers = [tracker]
    log = SampleLog(cfg, report)
    for step in range(1, 4):
        log.record(step, groups(tokenizer, 3), tokenizer, last=step == 3)
    tracker.finish()
    assert tracker.errors == 0 and tracker.artifact_uri.startswith("mlflow-artifacts:")
    api = mlflow_proxy + "/api/2.0/mlflow"
    listed = httpx.get(api + "/artifacts/list", params={"run_id": tracker.run_id, "path": "samples"}, timeout=10).json()
    assert sorted(f["path"] for f in listed["files"]) == [f"samples/step-00000{s}.json" for s in (1, 2, 3)]
    got = httpx.get(f"{mlflow_proxy}/get-artifact", params={"run_id": tracker.run_id, "path": "samples/step-000002.json"},
                    timeout=10)
    assert got.status_code == 200, got.text
    rows = got.json()
    on_volume = [json.loads(x) for x in (tmp_path / "ckpt" / "samples" / "step-000002.jsonl").read_text().splitlines()]
    assert rows == on_volume and len(rows) == 2


def test_mlflow_run_whose_artifacts_the_server_does_not_serve_gets_none_and_no_error(mlflow_proxy, tmp_path,
                                                                                      tokenizer):
    """An experiment whose artifact location is a path (or a bucket) the server does not proxy: the trainer
    cannot write there, so samples are not uploaded, and that is not a tracking failure."""
    import httpx

    from rft_runtime.trainer.tracking import MlflowTracker

    r = httpx.post(mlflow_proxy + "/api/2.0/mlflow/experiments/create",
                   json={"name": "ns/direct", "artifact_location": f"file://{tmp_path / 'elsewhere'}"}, timeout=10)
    assert r.status_code == 200, r.text
    cfg = make_config(tmp_path)
    report = open_report(cfg)
    tracker = MlflowTracker(mlflow_proxy, "ns/direct", "job", tmp_path / "tracking").start({})
    report.trackers = [tracker]
    SampleLog(cfg, report).record(1, groups(tokenizer, 2), tokenizer)
    tracker.log_metrics(1, {"reward_mean": 0.5})
    tracker.finish()
    assert tracker.errors == 0 and tracker.artifact_uri.startswith("file://")
    assert tracker.artifact_url("samples/step-000001.json") is None
    assert not (tmp_path / "elsewhere").exists()
