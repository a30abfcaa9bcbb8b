"""The Grafana dashboard the chart ships reads only metrics that live roles export, with the labels
rft_job, rft_namespace and rft_role on every series.

Live roles, each a real HTTP server on loopback: the trainer (two steps with a KL penalty, its
coordinator serving ``/metrics``) rolling out against the builtin inference server, the reward
server scoring samples, and the operator's metrics server after a reconcile. Their ``/metrics`` are
scraped; every metric name in every dashboard query must be among what they exposed.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from rft_api.job import validate_spec
from rft_operator.metrics import Metrics
from rft_runtime.rewards.server import make_app
from rft_runtime.rewards.service import RewardService
from rft_runtime.rollout.loop import RolloutLoop
from rft_runtime.trainer.trainer import Trainer
from tests.support import metrics_text
from tests.support.runtime_config import local_config, with_coordinator
from tests.trainer.served_logprobs import builtin_server

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "rft-operator" / "files" / "dashboards" / "rft-jobs.json"
METRIC = re.compile(r"\brft_[a-z0-9_]+\b")
LABELS = {"rft_job": "math-grpo", "rft_namespace": "team-a"}
TELEMETRY_LABELS = {"rft_job", "rft_namespace", "rft_role"}


def dashboard_metrics() -> dict[str, set[str]]:
    """Metric name → titles of the panels whose queries read it."""
    out: dict[str, set[str]] = {}
    doc = json.loads(DASHBOARD.read_text())
    queries = [(p["title"], t["expr"]) for p in doc["panels"] for t in p["targets"]]
    queries += [("variable " + v["name"], v["query"]) for v in doc["templating"]["list"] if v["type"] == "query"]
    for title, expr in queries:
        for name in METRIC.findall(expr):
            if name not in TELEMETRY_LABELS:  # rft_job, rft_namespace, rft_role are labels, not metrics
                out.setdefault(name, set()).add(title)
    return out


def _trainer_and_inference(tmp_path: Path, model_dir: Path, monkeypatch) -> list[str]:
    """Two trainer steps against the builtin server; the /metrics of both (scraped while live)."""
    spec = validate_spec({
        "model": {"base": str(model_dir)},
        "dataset": {"train": {"builtin": "arithmetic", "size": 16}},
        "evaluator": {"builtin": "regex", "config": {"pattern": "[0-9]"}},
        "rollout": {"samplesPerPrompt": 4, "promptsPerStep": 4, "maxTokens": 6, "concurrency": 16},
        "trainer": {"algorithm": "grpo", "learningRate": 1e-3, "maxSteps": 2, "microBatchSize": 4,
                    "kl": {"coef": 0.05, "estimator": "k3"}},
    })
    texts = []
    monkeypatch.setenv("RFT_METRIC_ROLE", "inference")
    with builtin_server(model_dir, "job", max_batch_size=64) as url:
        monkeypatch.setenv("RFT_METRIC_ROLE", "trainer")
        cfg = local_config("job", spec, inference=[url], checkpoints=tmp_path / "ckpt", output=tmp_path / "out")
        trainer = Trainer(cfg).setup()
        stop = threading.Event()
        loop = RolloutLoop(with_coordinator(cfg, trainer.coordinator_url), worker_id="w", should_stop=stop.is_set)
        th = threading.Thread(target=lambda: asyncio.run(loop.run()), daemon=True)
        th.start()
        try:
            while not trainer.finished:
                trainer.step()
            texts.append(httpx.get(f"{trainer.coordinator_url}/metrics", timeout=30).text)
            texts.append(httpx.get(f"{url}/metrics", timeout=30).text)
            trainer.finish()
        finally:
            stop.set()
            trainer.close(tell_workers_s=0)  # the worker is stopped by its flag
            th.join(30)
    return texts


async def _reward(monkeypatch) -> str:
    monkeypatch.setenv("RFT_METRIC_ROLE", "reward")
    service = RewardService.from_config({"evaluators": [{"builtin": "math"}], "timeoutSeconds": 10})
    runner = web.AppRunner(make_app(service), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            body = {"samples": [{"sample": {"text": r"\boxed{4}"}, "item": {"ground_truth": "4"}},
                                {"sample": {"text": "no idea"}, "item": {"ground_truth": "4"}}]}
            assert (await client.post(f"http://127.0.0.1:{port}/v1/score", json=body)).status_code == 200
            return (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    finally:
        await runner.cleanup()


def _operator(monkeypatch) -> str:
    monkeypatch.setenv("RFT_METRIC_ROLE", "operator")
    m = Metrics()
    port = m.serve(0, "127.0.0.1")
    try:
        m.reconciles.labels(result="ok").inc()
        m.errors.labels(kind="transient").inc()
        m.duration.observe(0.05)
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        m.close()


@pytest.fixture
def live_metrics(tmp_path, tiny_model_dir, monkeypatch) -> dict[str, str]:
    """Role → the /metrics text it served, every role in a pod of job math-grpo in team-a."""
    monkeypatch.setenv("RFT_METRIC_JOB", LABELS["rft_job"])
    monkeypatch.setenv("RFT_METRIC_NAMESPACE", LABELS["rft_namespace"])
    trainer, inference = _trainer_and_inference(tmp_path, tiny_model_dir, monkeypatch)
    return {"trainer": trainer, "inference": inference, "reward": asyncio.run(_reward(monkeypatch)),
            "operator": _operator(monkeypatch)}


def test_every_dashboard_metric_is_exported_by_a_live_role(live_metrics) -> None:
    exported: set[str] = set()
    for role, text in live_metrics.items():
        for family_sample in metrics_text.names(text):
            exported.add(family_sample)
        # every series of every role carries rft_job, rft_namespace and its rft_role, and none of the
        # target labels Prometheus sets itself (a scrape would rename or drop them)
        for name in metrics_text.names(text):
            if name.startswith("rft_"):
                for labels, _ in metrics_text.samples(text, name):
                    assert not {"job", "namespace", "pod", "instance"} & set(labels), (role, name, labels)
                    assert labels.get("rft_role") == role and all(labels.get(k) == v for k, v in LABELS.items()), \
                        (role, name, labels)
    wanted = dashboard_metrics()
    missing = {name: sorted(titles) for name, titles in wanted.items() if name not in exported}
    assert not missing, f"dashboard queries read metrics no live role exports: {missing}"
    # the dashboard covers every role and the panels the chart documents
    assert {n.split("_")[1] for n in wanted} == {"trainer", "serve", "reward", "operator"}
    titles = {p["title"] for p in json.loads(DASHBOARD.read_text())["panels"]}
    for needed in ("Reward mean by domain", "Reward spread by domain", "Step time split", "Tokens per second",
                   "KL and clip fraction", "Staleness (policy versions behind)", "Errors",
                   "Inference batch size and queue", "Inference engine: CUDA graphs and pacing",
                   "Operator reconcile latency", "Operator reconcile errors"):
        assert needed in titles


def test_no_dashboard_query_reads_a_label_prometheus_sets_itself() -> None:
    """The roles' labels are rft_job, rft_namespace, rft_role: a query on job, namespace or role would read
    Prometheus's target labels (the scrape job's name, the pod's namespace) instead."""
    doc = json.loads(DASHBOARD.read_text())
    texts = [t["expr"] for p in doc["panels"] for t in p["targets"]] + [t.get("legendFormat", "") for p in doc["panels"]
                                                                        for t in p["targets"]]
    texts += [v["query"] for v in doc["templating"]["list"] if v["type"] == "query"]
    bare = re.compile(r"(?<![a-z_])(job|namespace|role)\s*(=~|!=|=|\}\})|by \([^)]*(?<![a-z_])(job|namespace|role)\b|"
                      r", (job|namespace|role)\)")
    assert not [t for t in texts if bare.search(t)], [t for t in texts if bare.search(t)][:3]
