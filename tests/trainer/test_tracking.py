"""Experiment tracking against a real MLflow tracking server (``mlflow server`` from PyPI, on loopback,
its store a SQLite file, as MLflow 3 recommends; hack/mlflow-venv.sh builds its venv once): the tracker's run, parameters and metric
history as MLflow itself reports them, a resumed run, credentials, a server that is down, and a whole
``rft run`` whose reward curve lands in MLflow; and Weights & Biases offline runs written by the real
``wandb`` SDK, read back record by record from its ``.wandb`` files."""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rft_runtime.trainer.tracking import MlflowTracker, WandbTracker, auth_headers, flatten
from tests.local.conftest import read_rows, run_rft, write_manifest
from tests.support.mlflow_server import running_mlflow
from tests.support.ports import free_port

API = "/api/2.0/mlflow"


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("mlflow")
    with running_mlflow(root, ["--default-artifact-root", f"file://{root / 'artifacts'}"]) as url:
        yield url


def _run(url: str, run_id: str) -> dict:
    return httpx.get(url + API + "/runs/get", params={"run_id": run_id}, timeout=10).json()["run"]


def _history(url: str, run_id: str, key: str) -> list[tuple[int, float]]:
    r = httpx.get(url + API + "/metrics/get-history", params={"run_id": run_id, "metric_key": key}, timeout=10)
    return sorted((int(m["step"]), float(m["value"])) for m in r.json().get("metrics", []))


def _finished(tracker: MlflowTracker, status: str = "FINISHED") -> None:
    tracker.finish(status)
    assert tracker.errors == 0, tracker.errors


def test_a_run_with_its_spec_and_metrics_and_a_resumed_attempt(mlflow_server, tmp_path):
    state = tmp_path / "tracking"
    spec = {"trainer": {"learningRate": 0.002, "maxSteps": 3}, "rollout": {"samplesPerPrompt": 4},
            "evaluator": {"builtin": "math"}, "trainer.tags": ["a", "b"]}
    t = MlflowTracker(mlflow_server, "ns/job", "job", state, tags={"rft.job": "job"}).start(flatten(spec))
    for step in (1, 2):
        t.log_metrics(step, {"reward_mean": 0.1 * step, "time/generate": 1.5, "skip": float("nan"), "flag": True,
                             "note": "text"})
    _finished(t, "KILLED")  # a trainer stopped (suspend) after step 2
    run = _run(mlflow_server, t.run_id)
    assert run["info"]["status"] == "KILLED" and run["info"]["run_name"] == "job"
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    assert params["trainer.learningRate"] == "0.002" and params["trainer.tags"] == '["a", "b"]'
    assert params["evaluator.builtin"] == "math"
    assert {"key": "rft.job", "value": "job"} in run["data"]["tags"]
    keys = {m["key"] for m in run["data"]["metrics"]}
    assert keys == {"reward_mean", "time/generate"}  # NaN, booleans and text are not metrics

    # The next attempt (same checkpoint volume) logs into the same run.
    again = MlflowTracker(mlflow_server, "ns/job", "job", state).start(flatten(spec))
    again.log_metrics(3, {"reward_mean": 0.3})
    _finished(again)
    assert again.run_id == t.run_id
    assert _run(mlflow_server, t.run_id)["info"]["status"] == "FINISHED"
    assert _history(mlflow_server, t.run_id, "reward_mean") == [(1, 0.1), (2, 0.2), (3, 0.3)]
    exp = httpx.get(mlflow_server + API + "/experiments/get-by-name", params={"experiment_name": "ns/job"},
                    timeout=10).json()["experiment"]
    runs = httpx.post(mlflow_server + API + "/runs/search", json={"experiment_ids": [exp["experiment_id"]]},
                      timeout=10).json()["runs"]
    assert [r["info"]["run_id"] for r in runs] == [t.run_id]


def test_a_tracker_that_is_down_never_stops_training_and_warns_once(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="rft_runtime.trainer.tracking")
    t = MlflowTracker(f"http://127.0.0.1:{free_port()}", "e", "r", tmp_path, timeout_s=1).start({"a": "1"})
    for step in range(1, 6):
        t.log_metrics(step, {"reward_mean": 0.5})
    t.finish("FINISHED")
    assert t.errors >= 1 and t.run_id is None
    warnings = [r for r in caplog.records if "MLflow tracking" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]


def test_credentials_are_read_as_mlflow_reads_them():
    assert auth_headers({"MLFLOW_TRACKING_TOKEN": "t0k"}) == {"Authorization": "Bearer t0k"}
    assert auth_headers({"MLFLOW_TRACKING_USERNAME": "u", "MLFLOW_TRACKING_PASSWORD": "p"}) == {
        "Authorization": "Basic dTpw"}
    assert auth_headers({}) == {}


def test_rft_run_logs_its_reward_curve_to_mlflow_and_wandb(mlflow_server, tmp_path):
    steps = 3
    path = write_manifest(tmp_path / "job.yaml", "tracked", trainer={"maxSteps": steps},
                          tracking={"mlflow": {"uri": mlflow_server, "experiment": "rft-run-test"},
                                    "wandb": {"project": "rft-run-test"}})
    out = tmp_path / "out"
    assert run_rft(["run", str(path), "--out", str(out), "--no-progress"], tmp_path / "rft.log") == 0, \
        (tmp_path / "rft.log").read_text()[-3000:]
    rows = read_rows(out)
    exp = httpx.get(mlflow_server + API + "/experiments/get-by-name", params={"experiment_name": "rft-run-test"},
                    timeout=10).json()["experiment"]
    (run,) = httpx.post(mlflow_server + API + "/runs/search", json={"experiment_ids": [exp["experiment_id"]]},
                        timeout=10).json()["runs"]
    assert run["info"]["status"] == "FINISHED" and run["info"]["run_name"] == "tracked"
    curve = _history(mlflow_server, run["info"]["run_id"], "reward_mean")
    assert [s for s, _ in curve] == list(range(1, steps + 1))
    assert [v for _, v in curve] == pytest.approx([r["reward_mean"] for r in rows])
    assert all(r["tracking_errors"] == 0 for r in rows)
    # the same curve in the W&B offline run on the checkpoint volume
    (run_file,) = (out / "checkpoints" / "tracking" / "wandb").glob("wandb/offline-run-*/run-*.wandb")
    records = wandb_records(run_file)
    history = {int(h["_step"]): h for h in records["history"]}
    assert sorted(history) == list(range(1, steps + 1))
    assert [history[s]["reward_mean"] for s in sorted(history)] == pytest.approx([r["reward_mean"] for r in rows])
    assert records["config"]["trainer"]["maxSteps"] == steps


# ------------------------------------------------------------------------------------------- W&B
def wandb_records(path: Path) -> dict:
    """The run, config and history records of a ``.wandb`` file (the SDK's log format: a 7-byte header,
    then 32 KiB blocks of records, each ``crc32 (4) | length (2) | type (1) | data``, type 1 a whole
    record, 2/3/4 its first/middle/last fragment; each record a ``wandb_internal_pb2.Record``)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos = path.read_bytes(), 32768, 7
    assert data[:4] == b":W&B", data[:8]
    raw: list[bytes] = []
    part = b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            break
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            raw.append(chunk)
        elif kind == 2:
            part = chunk
        elif kind == 3:
            part += chunk
        elif kind == 4:
            raw.append(part + chunk)
    out: dict = {"run": [], "config": {}, "history": []}
    for r in raw:
        rec = pb.Record()
        rec.ParseFromString(r)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out["run"].append(rec.run)
            for item in rec.run.config.update:
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "config":
            for item in rec.config.update:
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "history":
            out["history"].append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                                   for i in rec.history.item})
    return out


def test_wandb_offline_run_holds_the_spec_and_every_step_across_attempts(tmp_path):
    spec = {"trainer": {"learningRate": 0.002, "maxSteps": 3}, "evaluator": {"builtin": "math"}}
    first = WandbTracker("proj", "job", tmp_path, tags={"rft.job": "job"}).start(spec)
    for step in (1, 2):
        first.log_metrics(step, {"reward_mean": 0.1 * step, "time/generate": 1.5, "skip": float("inf"), "flag": True})
    first.finish("KILLED")
    again = WandbTracker("proj", "job", tmp_path).start(spec)
    again.log_metrics(3, {"reward_mean": 0.3})
    again.finish("FINISHED")
    assert first.errors == again.errors == 0
    runs = sorted((tmp_path / "wandb").glob("wandb/offline-run-*/run-*.wandb"))
    assert len(runs) == 2 and len({p.name for p in runs}) == 1, runs  # one run id, written by two attempts
    recs = [wandb_records(p) for p in runs]
    assert recs[0]["config"]["trainer"] == {"learningRate": 0.002, "maxSteps": 3}
    assert recs[0]["run"][0].display_name == "job" and recs[0]["run"][0].project == "proj"
    steps = {int(h["_step"]): h for r in recs for h in r["history"]}
    assert sorted(steps) == [1, 2, 3] and steps[3]["reward_mean"] == pytest.approx(0.3)
    assert "skip" not in steps[1] and "flag" not in steps[1] and steps[1]["time/generate"] == 1.5
