"""RewardService (bounded concurrency) and the reward HTTP server (in process and as `main`)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from rft_api.job import validate_spec
from rft_runtime.rewards import CompositeEvaluator, CustomEvaluator, Item, RewardService, Sample, Slot
from rft_runtime.rewards.server import make_app
from tests.support.ports import free_port
from tests.support.runtime_config import local_config


class InFlight:
    """An async evaluator that records how many calls overlap; the reward echoes the sample text."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    async def __call__(self, sample: Sample, item: Item) -> float:
        self.now += 1
        self.peak = max(self.peak, self.now)
        await asyncio.sleep(0.05)
        self.now -= 1
        return float(sample.text)


async def test_score_batch_bounds_concurrency_and_keeps_order() -> None:
    probe = InFlight()
    service = RewardService(CompositeEvaluator([Slot("echo", CustomEvaluator(probe, "echo"))]), concurrency=3)
    results = await service.score_batch([({"text": str(i)}, {"ground_truth": None}) for i in range(10)])
    await service.aclose()
    assert [r.reward for r in results] == [float(i) for i in range(10)]
    assert probe.peak == 3


async def test_score_batch_rejects_bad_samples_by_field() -> None:
    service = RewardService.from_config({"builtin": "math"})
    with pytest.raises(ValueError, match="completion_ids"):
        await service.score_batch([({"text": "1", "completion_ids": "abc"}, {})])
    await service.aclose()


def _metric(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items()):
                return sample.value
    raise AssertionError(f"metric {name} {labels} not found")


async def test_http_server_in_process() -> None:
    service = RewardService.from_config({
        "evaluators": [
            {"builtin": "math", "weight": 1.0},
            {"builtin": "regex", "name": "format", "weight": 0.0, "config": {"pattern": r"\\boxed\{"}},
        ],
        "timeoutSeconds": 10,
    }, concurrency=4)
    runner = web.AppRunner(make_app(service), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            health = (await client.get(f"{base}/health")).json()
            assert health == {"status": "ok", "evaluators": ["math", "format"]}
            body = {"samples": [
                {"id": "t1:0", "sample": {"text": r"so \boxed{12}", "completion_ids": [5, 6]},
                 "item": {"ground_truth": "12", "domain": "math"}},
                {"id": "t1:1", "sample": {"text": "maybe 13"}, "item": {"ground_truth": "12"}},
                {"id": "t1:2", "sample": {"text": "no idea"}, "item": {"ground_truth": "12"}},
                {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "#### 12"}],
                 "ground_truth": "12", "execution_metadata": {"extra": {
                     "prompt_ids": [1, 2], "completion_ids": [[3, 4]], "finish_reasons": ["stop"], "truncated": [False]}}},
            ]}
            resp = await client.post(f"{base}/v1/score", json=body)
            assert resp.status_code == 200
            results = resp.json()["results"]
            assert [r["id"] for r in results] == ["t1:0", "t1:1", "t1:2", None]
            assert [r["reward"] for r in results] == [1.0, 0.0, 0.0, 1.0]
            assert results[0]["metrics"]["format"] == 1.0 and results[3]["metrics"]["format"] == 0.0
            assert results[2]["error"] == "parse_error" and results[0]["error"] is None
            assert set(results[0]) == {"id", "reward", "reason", "metrics", "error"}

            bad = await client.post(f"{base}/v1/score", json={"samples": [body["samples"][0], {"sample": {"messages": 3}}]})
            assert bad.status_code == 400 and "samples[1]" in bad.json()["error"] and "messages" in bad.json()["error"]
            garbage = await client.post(f"{base}/v1/score", content=b"{not json", headers={"content-type": "application/json"})
            assert garbage.status_code == 400

            metrics = (await client.get(f"{base}/metrics")).text
            assert _metric(metrics, "rft_reward_samples_total") == 4.0
            assert _metric(metrics, "rft_reward_errors_total", {"kind": "parse_error", "evaluator": "any"}) == 1.0
            assert _metric(metrics, "rft_reward_errors_total", {"kind": "parse_error", "evaluator": "math"}) == 1.0
            assert _metric(metrics, "rft_reward_errors_total", {"kind": "timeout", "evaluator": "any"}) == 0.0
            assert _metric(metrics, "rft_reward_score_seconds_count") == 4.0
    finally:
        await runner.cleanup()


def _runtime_config(tmp_path: Path, evaluator: dict, concurrency: int = 2) -> Path:
    """The runtime config ``rft reward --config`` reads (the one every role reads)."""
    spec = validate_spec({"model": {"base": "builtin:tiny"}, "dataset": {"train": {"builtin": "arithmetic"}},
                          "evaluator": evaluator, "rollout": {"concurrency": concurrency}})
    path = tmp_path / "config.json"
    path.write_text(local_config("reward", spec, inference=["http://127.0.0.1:9"], checkpoints=tmp_path / "ckpt",
                                 output=tmp_path / "out").to_json())
    return path


def test_main_serves_until_sigterm(tmp_path: Path) -> None:
    config = _runtime_config(tmp_path, {"evaluators": [
        {"builtin": "string_check", "config": {"operation": "ilike", "reference": "%paris%"}},
        {"builtin": "code_sandbox", "weight": 2, "config": {"timeoutSeconds": 5}}], "timeoutSeconds": 20})
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rft_runtime.rewards.server", "--config", str(config),
                             "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "reward server did not start"
            time.sleep(0.2)
        code = "```python\nprint('Paris')\n```"
        resp = httpx.post(f"{base}/v1/score", timeout=60, json={"samples": [
            {"sample": {"text": code}, "item": {"ground_truth": "assert True"}},
            {"sample": {"text": "```python\nwhile True: pass\n```"}, "item": {"ground_truth": "assert True"}},
        ]})
        assert resp.status_code == 200
        first, second = resp.json()["results"]
        assert first["reward"] == pytest.approx(1.0) and first["metrics"] == {
            "string_check": 1.0, "code_sandbox": 1.0, "code_sandbox/tests_passed": 1.0, "code_sandbox/tests_total": 1.0}
        assert second["error"] == "timeout" and second["reward"] == 0.0
        assert second["metrics"]["code_sandbox/error_timeout"] == 1.0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        out = proc.stdout.read().decode() if proc.stdout else ""
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()
    assert rc == 0
    assert json.loads(out.splitlines()[0])["event"] == "listening"


def test_main_refuses_a_bad_config(tmp_path: Path) -> None:
    config = _runtime_config(tmp_path, {"builtin": "math"})
    config.write_text(config.read_text().replace('"builtin": "math"', '"builtin": "regexp"'))
    proc = subprocess.run([sys.executable, "-m", "rft_runtime.rewards.server", "--config", str(config)],
                          capture_output=True, timeout=60, env=dict(os.environ))
    assert proc.returncode == 2
    assert "spec.evaluator.builtin" in proc.stderr.decode()
