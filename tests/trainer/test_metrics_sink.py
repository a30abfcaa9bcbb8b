"""Per-step metrics to JSONL, TensorBoard event files and Prometheus gauges."""

from __future__ import annotations

from prometheus_client import generate_latest

from rft_runtime.metrics_sink import MetricsSink, prometheus_name, prometheus_series, read_metrics


def test_jsonl_tensorboard_prometheus(tmp_path):
    sink = MetricsSink(tmp_path)
    sink.log(1, {"reward_mean": 0.25, "time/update": 1.5, "note": "x", "bad": float("nan"), "domain/math/mean": 0.75})
    sink.log(2, {"reward_mean": 0.5})
    sink.close()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert rows == [{"step": 1, "reward_mean": 0.25, "time/update": 1.5, "note": "x", "bad": None,
                     "domain/math/mean": 0.75},
                    {"step": 2, "reward_mean": 0.5}]
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("reward_mean")] == [0.25, 0.5]
    text = generate_latest(sink.registry).decode()
    own = 'rft_job="local",rft_namespace="local",rft_role="trainer"'  # every series carries the role's labels
    assert f"rft_trainer_reward_mean{{{own}}} 0.5" in text
    assert 'rft_trainer_step_phase_seconds{phase="update",rft_job="local",rft_namespace="local",rft_role="trainer"} 1.5' in text
    assert 'rft_trainer_domain_reward_mean{domain="math",rft_job="local",rft_namespace="local",rft_role="trainer"} 0.75' in text


def test_truncate_after_for_resume(tmp_path):
    sink = MetricsSink(tmp_path, tensorboard=False)
    for s in range(1, 6):
        sink.log(s, {"reward_mean": s / 10})
    assert sink.truncate_after(3) == 2
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]


def test_prometheus_names():
    assert prometheus_name("reward_mean") == "rft_trainer_reward_mean"
    assert prometheus_series("time/old_logprob") == ("rft_trainer_step_phase_seconds", ("phase",), ("old_logprob",))
    assert prometheus_series("reward/math") == ("rft_trainer_evaluator_reward", ("evaluator",), ("math",))
    assert prometheus_series("errors/timeout") == ("rft_trainer_episode_errors", ("kind",), ("timeout",))
    assert prometheus_series("domain/code/std") == ("rft_trainer_domain_reward_std", ("domain",), ("code",))
