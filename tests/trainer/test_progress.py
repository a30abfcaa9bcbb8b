"""The trainer's progress sinks write the one record model (rft_api.progress) that the operator parses."""

from __future__ import annotations

import json

import pytest

from rft_api.progress import (
    PROGRESS_KEY,
    CurvePoint,
    EvalPoint,
    FinalModel,
    OutputPush,
    Progress,
    ProgressCheckpoint,
    ProgressErrors,
    ProgressEvaluation,
    parse,
    parse_text,
)
from rft_runtime.progress import MAX_MESSAGE, ConfigMapProgressSink, FileProgressSink, clip_message, finite


def _full_record() -> Progress:
    return Progress(
        attempt=2, step=12, total_steps=30, policy_version=12, reward_mean=0.4, reward_std=0.2, eval_score=0.35,
        samples_scored=1536, errors=ProgressErrors(timeouts=1, runtime_errors=2, parse_errors=3, dropped_episodes=4,
                                                   reissued_leases=5, refused_episodes=6),
        checkpoints=[ProgressCheckpoint(step=10, path="/ckpt/step-000010", time="2025-01-01T00:00:00Z")], done=True,
        message="finished", update_time="2025-01-01T00:01:00Z",
        reward_curve=[CurvePoint(step=11, mean=0.3, std=0.1), CurvePoint(step=12, mean=0.4, std=0.2)],
        domain_rewards={"math": 0.4}, final_model=FinalModel(path="final", format="full"),
        evaluation=ProgressEvaluation(baseline=0.1, step=12, score=0.35, pass_at_k=0.5, best_step=10, best_score=0.4,
                                      best_checkpoint="/ckpt/step-000010", stop_reason="patience",
                                      curve=[EvalPoint(step=0, score=0.1), EvalPoint(step=10, score=0.4)]),
        output=OutputPush(uri="s3://models/run/final", files=9, bytes=1000))


def test_written_record_parses_back_field_for_field():
    rec = _full_record()
    text = rec.to_data()[PROGRESS_KEY]
    assert parse_text(text) == rec
    assert set(json.loads(text)) == {f.alias or n for n, f in Progress.model_fields.items()}


def test_nonfinite_numbers_and_long_messages_are_made_writable():
    assert finite(float("nan")) is None and finite(float("inf")) is None and finite(0.5) == 0.5
    rec = Progress(step=1, reward_mean=finite(float("nan")), message=clip_message("x" * 5000))
    d = json.loads(rec.to_data()[PROGRESS_KEY])
    assert "rewardMean" not in d and len(d["message"]) == MAX_MESSAGE


def test_file_sink_roundtrip(tmp_path):
    sink = FileProgressSink(tmp_path)
    assert sink.read() is None
    sink.write(_full_record())
    assert sink.read() == _full_record()
    assert parse({PROGRESS_KEY: (tmp_path / PROGRESS_KEY).read_text()}).step == 12


class _FakeCoreV1:
    """Records patches of ConfigMaps (the Kubernetes client's method names)."""

    def __init__(self):
        self.patches = []

    def patch_namespaced_config_map(self, name, namespace, body, **kwargs):
        self.patches.append((name, namespace, body))


def test_configmap_sink_patches_only_the_progress_configmap():
    api = _FakeCoreV1()
    ConfigMapProgressSink("tiny-progress", "ns", api=api).write(_full_record())
    ((name, ns, body),) = api.patches
    assert (name, ns) == ("tiny-progress", "ns") and list(body) == ["data"]
    assert parse(body["data"]).checkpoints[0].step == 10


def test_configmap_sink_calls_have_a_deadline(monkeypatch):
    """An API server that accepts the connection and never answers (a brown-out) costs the trainer
    the deadline, not forever."""
    import socket
    import time

    from kubernetes import client

    from rft_runtime import progress as progress_mod

    monkeypatch.setattr(progress_mod, "API_TIMEOUT_S", (1.0, 1.0))
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    try:
        cfg = client.Configuration()
        cfg.host = f"http://127.0.0.1:{srv.getsockname()[1]}"
        cfg.retries = False
        sink = ConfigMapProgressSink("tiny", "ns", api=client.CoreV1Api(client.ApiClient(cfg)))
        for call in (lambda: sink.write(_full_record()), sink.read):
            t0 = time.monotonic()
            with pytest.raises(Exception):
                call()
            assert time.monotonic() - t0 < 5
    finally:
        srv.close()
