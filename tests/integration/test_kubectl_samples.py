"""``kubectl rft samples`` against the local cluster: the trainer's progress sink patches ``samples.json``
into the job's ``<job>-progress`` ConfigMap (next to ``progress.json``, which it leaves alone), and the
plugin, found by kubectl, prints the newest step or a kept one, as text or JSON."""
from __future__ import annotations

import json

import pytest

from rft_api.progress import PROGRESS_KEY, SAMPLES_KEY, Progress
from rft_runtime.progress import ConfigMapProgressSink
from rft_runtime.samples_view import bound_steps, dump_steps
from tests.integration.test_kubectl_plugin import kubectl_rft
from tests.operator.cluster_support import api, crd, create_job, job_manifest  # noqa: F401

pytestmark = pytest.mark.cluster


def step_entry(step: int) -> dict:
    return {"step": step, "time": "2025-01-01T00:00:00Z", "samples": [{
        "step": step, "task_id": "arith-3", "domain": "default", "prompt": "What is 3 + 4?", "reference": "7",
        "reward_mean": 0.5, "completions": [
            {"index": 0, "text": "The answer is 7.", "reward": 1.0, "correct": True, "reason": "matched 7",
             "finish": "stop", "truncated": False, "termination": None, "errors": [], "error": None, "tokens": 6},
            {"index": 1, "text": "Eight.", "reward": 0.0, "correct": False, "reason": "no number found",
             "finish": "stop", "truncated": False, "termination": None, "errors": ["parse_error"],
             "error": None, "tokens": 3}]}]}


def test_samples_from_the_progress_configmap(cluster, crd, api, kube, namespace) -> None:  # noqa: F811
    from kubernetes import client

    core = client.CoreV1Api(kube)
    progress = Progress(step=5, total_steps=10).to_data()
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "arith-progress"}, "data": progress})
    sink = ConfigMapProgressSink("arith-progress", namespace, api=core)

    r = kubectl_rft(cluster, namespace, "samples", "arith", check=False)
    assert r.returncode == 1 and "arith has no samples yet" not in r.stderr  # the key is absent, and so is the job
    assert "RFTJob arith not found" in r.stderr
    create_job(api, namespace, job_manifest("fresh"))
    r = kubectl_rft(cluster, namespace, "samples", "fresh", check=False)
    assert r.returncode == 1 and "fresh has no samples yet" in r.stderr and "everySteps" in r.stderr

    sink.write_samples(dump_steps(bound_steps([step_entry(s) for s in (1, 2, 4, 5)])))
    data = core.read_namespaced_config_map("arith-progress", namespace).data
    assert data[PROGRESS_KEY] == progress[PROGRESS_KEY]  # the record is left as the trainer wrote it
    assert sink.read_samples() == data[SAMPLES_KEY]

    out = kubectl_rft(cluster, namespace, "samples", "arith").stdout
    lines = out.splitlines()
    assert lines[0] == "step 5: 1 prompt   (steps kept: 1, 2, 4, 5)"
    assert "━━ prompt 1/1 · task arith-3 · reference 7 · mean reward 0.500" in out
    assert "     What is 3 + 4?" not in out and "   What is 3 + 4?" in out
    assert "  ── completion 0 · reward 1.000 · correct · stop" in out and "     The answer is 7." in out
    assert "     reason: matched 7" in out
    assert "  ── completion 1 · reward 0.000 · not correct · stop · errors: parse_error" in out

    entry = json.loads(kubectl_rft(cluster, namespace, "samples", "arith", "--step", "2", "-o", "json").stdout)
    assert entry["step"] == 2 and entry["samples"][0]["completions"][1]["text"] == "Eight."

    r = kubectl_rft(cluster, namespace, "samples", "arith", "--step", "3", check=False)
    assert r.returncode == 1
    assert "step 3 is not kept in ConfigMap arith-progress (steps kept: 1, 2, 4, 5)" in r.stderr
    assert "on the checkpoint claim under samples/step-000003.jsonl" in r.stderr
