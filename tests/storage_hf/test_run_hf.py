"""`rft run` of a job whose model and dataset are hf:// repositories on a real hub-compatible server
(olah serving local repositories): the model at a tag and GSM8K as parquet under config ``main``, with
train and test splits of one repository fetched once; the job trains and evaluates on them."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.local.conftest import read_rows, run_rft
from tests.support.shared import shared_dir

pytestmark = pytest.mark.timeout(900)


def _parquet(rows: list[dict]) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


def test_a_job_from_hf_model_and_dataset_repositories_trains_and_evaluates(hub_server, tmp_path, monkeypatch):
    from rft_runtime.model import resolve_builtin_model

    model = resolve_builtin_model("builtin:tiny")
    files = {f.relative_to(model).as_posix(): f.read_bytes() for f in model.rglob("*") if f.is_file()}
    hub_server.add_model_repo("rft-tests/tiny", files)
    hub_server.tag("rft-tests/tiny", "v1")
    rows = [json.loads(x) for x in (shared_dir() / "datasets" / "gsm8k" / "test.jsonl").read_text().splitlines()]
    hub_server.add_dataset_repo("rft-tests/gsm8k", {
        "README.md": b"# a GSM8K sample\n",
        "main/train-00000-of-00001.parquet": _parquet(rows[:40]),
        "main/test-00000-of-00001.parquet": _parquet(rows[40:48]),
    })
    fields = {"prompt": "question", "groundTruth": "answer"}
    doc = {"apiVersion": "rft.dev/v1alpha1", "kind": "RFTJob", "metadata": {"name": "from-hf"}, "spec": {
        "model": {"base": "hf://rft-tests/tiny@v1"},
        "dataset": {"train": {"uri": "hf://datasets/rft-tests/gsm8k", "config": "main", "split": "train",
                              "size": 8, "fields": fields},
                    "eval": {"uri": "hf://datasets/rft-tests/gsm8k", "config": "main", "split": "test", "fields": fields}},
        "evaluation": {"everySteps": 2, "maxTasks": 8},
        "evaluator": {"builtin": "math"},
        "rollout": {"samplesPerPrompt": 4, "promptsPerStep": 4, "maxTokens": 8},
        "inference": {"engine": "builtin"},
        "trainer": {"algorithm": "grpo", "learningRate": 1e-3, "maxSteps": 2},
        "checkpoint": {"everySteps": 2},
        "storage": {"huggingFace": {"endpoint": hub_server.endpoint}},
    }}
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(doc, sort_keys=False))
    monkeypatch.setenv("RFT_INPUTS_CACHE", str(tmp_path / "inputs"))
    out, log = tmp_path / "out", tmp_path / "rft.log"
    code = run_rft(["run", str(manifest), "--out", str(out), "--no-progress"], log)
    assert code == 0, log.read_text()[-4000:]
    rows_out = read_rows(out)
    assert [r["step"] for r in rows_out] == [0, 1, 2]  # step 0: the baseline evaluation
    assert "eval_score" in rows_out[-1]  # the test split of the same repository, evaluated
    for name in ("main/train-00000-of-00001.parquet", "main/test-00000-of-00001.parquet"):
        assert hub_server.download_count("rft-tests/gsm8k", name, "dataset") == 1
    assert hub_server.download_count("rft-tests/tiny", "config.json") == 1
    assert (Path(out) / "checkpoints" / "final" / "config.json").is_file()
