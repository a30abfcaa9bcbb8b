"""The trainer's memory plan: numbers a reader can check by hand, the docs' table, `rft plan` on examples."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from rft_runtime.cli import main as rft
from rft_runtime.trainer.memory_plan import (
    GIB,
    REFERENCE_MODELS,
    PlanError,
    TrainerShape,
    builtin_config,
    doc_table,
    plan,
    shape_from_config,
)

ROOT = Path(__file__).resolve().parents[2]

SMOLLM2 = {"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
           "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152, "head_dim": 64,
           "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False}


def test_smollm2_parameter_count_by_hand() -> None:
    m = shape_from_config(SMOLLM2)
    # embeddings 49152*576; per layer q,o 576*576, k,v 576*192, MLP 3*576*1536, 2 norms; final norm
    per_layer = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536 + 2 * 576
    assert m.layer_parameters() == per_layer == 3_540_096
    assert m.parameters() == 49152 * 576 + 30 * per_layer + 576 == 134_515_008


def test_untied_output_layer_counts_twice() -> None:
    assert (shape_from_config({**SMOLLM2, "tie_word_embeddings": False}).parameters()
            == 134_515_008 + 49152 * 576)


def test_reference_models() -> None:
    assert shape_from_config(REFERENCE_MODELS["Llama-2-7B"]).parameters() == 6_738_415_616
    assert shape_from_config(REFERENCE_MODELS["Qwen2.5-0.5B"]).parameters() == 494_032_768  # qkv biases
    assert shape_from_config(REFERENCE_MODELS["Llama-2-70B"]).parameters() == 68_976_648_192


def test_builtin_tiny_matches_the_built_model(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from rft_runtime.model import make_tiny_model

    tiny_model_dir = make_tiny_model(tmp_path / "model", seed=0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert shape_from_config(builtin_config("tiny")).parameters() == sum(p.numel() for p in model.parameters())
    assert shape_from_config(json.loads((tiny_model_dir / "config.json").read_text())).parameters() == \
        sum(p.numel() for p in model.parameters())


def test_full_fine_tuning_7b_on_8_gpus_by_hand() -> None:
    m = shape_from_config(REFERENCE_MODELS["Llama-2-7B"])
    p = m.parameters()
    t = TrainerShape(world_size=8, micro_batch=1, prompt_tokens=100, response_tokens=28)
    mp = plan(m, t, 80 * 10**9)
    assert mp.parts["parameters"] == -(-p * 4 // 8)  # float32 master weights, sharded
    assert mp.parts["gradients"] == -(-p * 4 // 8)
    assert mp.parts["optimizer"] == -(-p * 8 // 8)  # AdamW: two float32 moments
    assert mp.parts["gathered"] == (m.root_parameters() + 2 * m.layer_parameters()) * 2  # bf16 compute
    # activations: layers * tokens * 2 B * (4h + 2q + 2kv + 4i)
    assert mp.parts["activations"] == 32 * 128 * 2 * (4 * 4096 + 2 * 4096 + 2 * 4096 + 4 * 11008)
    assert mp.parts["logits"] == 1 * 28 * 32000 * (2 + 12)
    assert mp.fits is True
    assert mp.device_bytes == sum(mp.parts.values())


def test_checkpointing_keeps_layer_inputs_and_one_layer() -> None:
    m = shape_from_config(REFERENCE_MODELS["Llama-2-7B"])
    off = plan(m, TrainerShape(world_size=8, micro_batch=2, prompt_tokens=256, response_tokens=256))
    on = plan(m, TrainerShape(world_size=8, micro_batch=2, prompt_tokens=256, response_tokens=256,
                              gradient_checkpointing=True))
    tokens, layer = 2 * 512, 2 * (4 * 4096 + 2 * 4096 + 2 * 4096 + 4 * 11008)
    assert on.parts["activations"] == 32 * tokens * 4096 * 4 + tokens * layer
    assert off.parts["activations"] == 32 * tokens * layer
    assert {k: v for k, v in on.parts.items() if k != "activations"} == \
        {k: v for k, v in off.parts.items() if k != "activations"}


def test_world_size_one_keeps_whole_state_and_bf16_dtype_halves_it() -> None:
    m = shape_from_config(SMOLLM2)
    p = m.parameters()
    one = plan(m, TrainerShape(world_size=1, micro_batch=1, prompt_tokens=8, response_tokens=8))
    assert one.parts["parameters"] == 4 * p and one.parts["gathered"] == 2 * p  # autocast's bf16 copy
    bf16 = plan(m, TrainerShape(world_size=1, micro_batch=1, prompt_tokens=8, response_tokens=8, dtype="bfloat16"))
    assert bf16.parts["parameters"] == 2 * p and bf16.parts["gathered"] == 0
    assert bf16.parts["optimizer"] == 4 * p  # torch keeps AdamW's moments in the parameter's dtype
    cpu = plan(m, TrainerShape(world_size=1, micro_batch=1, prompt_tokens=8, response_tokens=8, gpu=False))
    assert cpu.parts["gathered"] == 0  # float32 compute on the CPU


def test_cpu_offload_moves_parameters_gradients_and_optimizer_to_the_host() -> None:
    m = shape_from_config(REFERENCE_MODELS["Llama-2-70B"])
    t = dict(world_size=8, micro_batch=8, prompt_tokens=512, response_tokens=512, gradient_checkpointing=True)
    on, off = plan(m, TrainerShape(**t, cpu_offload=True), 80 * 10**9), plan(m, TrainerShape(**t), 80 * 10**9)
    assert on.parts == off.parts and on.on_host == ("parameters", "gradients", "optimizer")
    assert on.host_bytes == off.parts["parameters"] + off.parts["gradients"] + off.parts["optimizer"]
    assert on.device_bytes == off.device_bytes - on.host_bytes
    assert off.fits is False and on.fits is True
    # one process offloaded is FSDP2 too: the root and two layers gathered, not autocast's copy of all
    one = plan(shape_from_config(SMOLLM2), TrainerShape(world_size=1, micro_batch=1, prompt_tokens=8,
                                                        response_tokens=8, cpu_offload=True))
    s = shape_from_config(SMOLLM2)
    assert one.parts["gathered"] == (s.root_parameters() + 2 * s.layer_parameters()) * 2
    # on a CPU trainer the device is the host: nothing moves
    cpu = plan(s, TrainerShape(world_size=1, micro_batch=1, prompt_tokens=8, response_tokens=8, gpu=False,
                               cpu_offload=True))
    assert cpu.on_host == () and cpu.host_bytes == 0 and cpu.device_bytes == sum(cpu.parts.values())


def test_lora_trains_only_the_adapter() -> None:
    m = shape_from_config(SMOLLM2)
    t = TrainerShape(world_size=1, micro_batch=1, prompt_tokens=8, response_tokens=8, lora_rank=16,
                     lora_targets=("q_proj", "v_proj"))
    mp = plan(m, t)
    adapter = 30 * 16 * ((576 + 576) + (576 + 192))
    assert mp.trainable == adapter
    assert mp.parts["gradients"] == 4 * adapter and mp.parts["optimizer"] == 8 * adapter
    assert mp.fits is None
    with pytest.raises(PlanError, match="targetModules"):
        plan(m, TrainerShape(world_size=1, micro_batch=1, prompt_tokens=8, response_tokens=8, lora_rank=4,
                             lora_targets=("lm_head",)))


def test_70b_does_not_fit_one_node_without_checkpointing() -> None:
    m = shape_from_config(REFERENCE_MODELS["Llama-2-70B"])
    mp = plan(m, TrainerShape(world_size=8, micro_batch=8, prompt_tokens=512, response_tokens=512), 80 * 10**9)
    assert mp.fits is False and mp.device_bytes > 80 * 10**9


def test_docs_table_is_the_functions_output() -> None:
    text = (ROOT / "docs/how-to/memory.md").read_text()
    start, end = "<!-- memory-table:start -->\n", "<!-- memory-table:end -->"
    assert text[text.index(start) + len(start): text.index(end)] == doc_table()


def test_rft_plan_on_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert rft(["plan", str(ROOT / "examples/01-tiny-arith.yaml"), "--device-memory", "8GiB"]) == 0
    out = capsys.readouterr().out
    assert "140,032 parameters" in out and "fits: yes" in out
    # a hub model not on this machine: its config.json is passed
    assert rft(["plan", str(ROOT / "examples/10-gpu-cluster.yaml")]) == 2
    assert "--config" in capsys.readouterr().err


def test_rft_plan_with_config_and_device_memory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(REFERENCE_MODELS["Llama-2-70B"]))
    job = ROOT / "examples/10-gpu-cluster.yaml"
    # full fine-tuning of a 70B in bfloat16 over one node of 8 GPUs: 8 bytes a parameter / 8 ranks
    assert rft(["plan", str(job), "--config", str(cfg), "--device-memory", "80GB"]) == 1
    out = capsys.readouterr().out
    assert "68,976,648,192 parameters" in out and "(full)" in out and "fits: NO" in out
    # with a LoRA adapter and gradient checkpointing: the frozen bfloat16 weights, sharded, a small adapter,
    # and each layer's input kept (without checkpointing the activations alone are 304 GiB)
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["model"]["lora"] = {"rank": 32}
    doc["spec"]["trainer"]["gradientCheckpointing"] = True
    doc["spec"]["inference"]["weightSync"] = "lora"
    lora_job = tmp_path / "lora.yaml"
    lora_job.write_text(yaml.safe_dump(doc))
    assert rft(["plan", str(lora_job), "--config", str(cfg), "--device-memory", "80GB"]) == 0
    out = capsys.readouterr().out
    assert "LoRA rank 32" in out and "gradient checkpointing on" in out and "fits: yes" in out
    assert rft(["plan", str(job), "--config", str(cfg), "--device-memory", "lots"]) == 2
    assert "--device-memory" in capsys.readouterr().err
    assert GIB == 2**30


def test_the_spec_shape_reads_the_trainer_fields():
    from rft_api.job import parse_manifest
    from rft_runtime.trainer.memory_plan import trainer_shape

    doc = {"apiVersion": "rft.dev/v1alpha1", "kind": "RFTJob", "metadata": {"name": "x"},
           "spec": {"model": {"base": "builtin:tiny", "dtype": "bfloat16", "lora": {"rank": 8}},
                    "dataset": {"train": {"builtin": "arithmetic", "size": 16}}, "evaluator": {"builtin": "math"},
                    "rollout": {"maxTokens": 64, "maxPromptTokens": 100},
                    "trainer": {"gradientCheckpointing": True, "cpuOffload": True, "microBatchSize": 3, "nodes": 2,
                                "processesPerNode": 4, "resources": {"limits": {"nvidia.com/gpu": 4}}}}}
    t = trainer_shape(parse_manifest(doc).spec)
    assert t == TrainerShape(world_size=8, micro_batch=3, prompt_tokens=100, response_tokens=64, dtype="bfloat16",
                             gpu=True, lora_rank=8, lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"),
                             gradient_checkpointing=True, cpu_offload=True)


def test_a_cpu_trainer_is_planned_against_its_memory_limit_per_process(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    doc = yaml.safe_load((ROOT / "examples/01-tiny-arith.yaml").read_text())
    doc["spec"]["trainer"].update({"processesPerNode": 2, "resources": {"limits": {"memory": "8Gi"}}})
    job = tmp_path / "cpu.yaml"
    job.write_text(yaml.safe_dump(doc))
    assert rft(["plan", str(job)]) == 0
    out = capsys.readouterr().out
    assert "world size 2, CPU" in out and "of 4.00 GiB per device" in out
