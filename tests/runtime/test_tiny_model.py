"""The tiny model: HF format, tokenizer, chat template, determinism, warm start, builtin specs, CLI."""

from __future__ import annotations

import hashlib
import json
import os
import random
import unicodedata
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rft_runtime.data import Task, load_builtin
from rft_runtime.model import (
    TinyModelConfig,
    build_tokenizer,
    encode_sft_example,
    make_tiny_model,
    make_tiny_model_cli,
    resolve_builtin_model,
)
from rft_runtime.model.tokenizer import BYTE_OFFSET, VOCAB_SIZE
from rft_runtime.model.warm_start import warm_start
from tests.runtime.model_accuracy import accuracy

EXPECTED_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                  "tokenizer_config.json", "chat_template.jinja"}


def _digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(d).iterdir()) if p.is_file()}


def _contracts_dir() -> Path:
    env = os.environ.get("RFT_VLLM_CONTRACTS")
    return Path(env) if env else Path(__file__).resolve().parents[1] / "contracts" / "vllm"


def test_checkpoint_loads_with_transformers(tiny_random_dir):
    assert EXPECTED_FILES <= set(os.listdir(tiny_random_dir))
    tok = AutoTokenizer.from_pretrained(tiny_random_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_random_dir)
    cfg = model.config
    assert cfg.model_type == "qwen2" and cfg.architectures == ["Qwen2ForCausalLM"]
    assert cfg.vocab_size == len(tok) == VOCAB_SIZE < 400
    assert cfg.max_position_embeddings >= 512 and cfg.tie_word_embeddings
    assert (cfg.eos_token_id, cfg.pad_token_id, tok.eos_token_id, tok.pad_token_id) == (2, 0, 2, 0)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 2?"}], add_generation_prompt=True,
                                  tokenize=True, return_dict=True)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), VOCAB_SIZE) and torch.isfinite(logits).all()


def test_config_has_the_fields_vllm_accepted():
    ref = _contracts_dir() / "tiny-qwen2" / "config.json"
    if not ref.exists():
        pytest.skip(f"vLLM reference checkpoint not found at {ref}")
    reference = json.loads(ref.read_text())
    ours = TinyModelConfig().to_qwen2().to_dict()
    missing = sorted(set(reference) - set(ours) - {"transformers_version"})
    assert not missing, f"fields of the vLLM-accepted config we do not set: {missing}"
    for key in ("model_type", "architectures", "dtype", "eos_token_id", "pad_token_id", "bos_token_id",
                "tie_word_embeddings", "hidden_act", "use_sliding_window", "rope_parameters"):
        assert ours[key] == reference[key], key


def test_chat_template_renders_qwen_style_with_assistant_mask():
    tok = build_tokenizer()
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 1 + 2?"},
            {"role": "assistant", "content": "3"}]
    text = tok.apply_chat_template(msgs, tokenize=False)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n"
                    "<|im_start|>assistant\n3<|im_end|>\n")
    prompt = tok.apply_chat_template(msgs[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n") and text.startswith(prompt)
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert tok.apply_chat_template(parts, tokenize=False) == "<|im_start|>user\nab<|im_end|>\n"
    enc = tok.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    masked = [i for i, m in zip(enc["input_ids"], enc["assistant_masks"]) if m]
    assert masked == [BYTE_OFFSET + ord("3"), 2]  # the answer and its <|im_end|>


def test_tokenizer_round_trips_utf8_and_loads_back_identically(tiny_random_dir):
    built = build_tokenizer()
    loaded = AutoTokenizer.from_pretrained(tiny_random_dir)
    assert loaded.backend_tokenizer.to_str() == built.backend_tokenizer.to_str()
    rng = random.Random(0)
    ranges = [(0x20, 0x7E), (0x0A, 0x0D), (0xA0, 0x2FF), (0x370, 0x52F), (0x4E00, 0x9FFF), (0x1F300, 0x1FAFF)]
    samples = ["", " leading and trailing  ", "tabs\tand\r\nnewlines\n", "e\u0301 combining", "🤖 emoji ok"]
    for _ in range(200):
        samples.append("".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(rng.randint(1, 40))))
    for s in samples:
        expected = unicodedata.normalize("NFC", s)
        for tok in (built, loaded):
            ids = tok.encode(s, add_special_tokens=False)
            assert ids == [BYTE_OFFSET + b for b in expected.encode("utf-8")]
            assert tok.decode(ids) == expected
    ids = built.encode("<|im_start|>user\nhi<|im_end|><|endoftext|>", add_special_tokens=False)
    assert ids[0] == 1 and ids[-2:] == [2, 0]


def test_same_seed_builds_identical_files_and_other_seeds_differ(tmp_path):
    a = _digests(make_tiny_model(tmp_path / "a", seed=3))
    b = _digests(make_tiny_model(tmp_path / "b", seed=3))
    c = _digests(make_tiny_model(tmp_path / "c", seed=4))
    assert a == b
    assert a["model.safetensors"] != c["model.safetensors"]
    assert a["tokenizer.json"] == c["tokenizer.json"]


def test_sizes_are_validated():
    with pytest.raises(ValueError, match="divisible by 'heads'"):
        TinyModelConfig(hidden=60, heads=8)
    with pytest.raises(ValueError, match="divisible by 'kv_heads'"):
        TinyModelConfig(heads=4, kv_heads=3)


def test_sft_example_trains_only_on_the_answer():
    tok = build_tokenizer()
    task = Task(task_id="t", prompt="What is 10 + 7?", ground_truth="17")
    ids, mask = encode_sft_example(tok, task)
    assert [i for i, m in zip(ids, mask) if m] == [BYTE_OFFSET + ord("1"), BYTE_OFFSET + ord("7"), 2]


def test_warm_start_is_deterministic_and_changes_weights(tiny_random_dir, tmp_path):
    r1 = warm_start(tiny_random_dir, "arithmetic", 3, 0, tmp_path / "w1", num_tasks=64)
    r2 = warm_start(tiny_random_dir, "arithmetic", 3, 0, tmp_path / "w2", num_tasks=64)
    d0, d1, d2 = _digests(tiny_random_dir), _digests(r1.out_dir), _digests(r2.out_dir)
    assert d1 == d2
    assert d1["model.safetensors"] != d0["model.safetensors"]
    assert d1["tokenizer.json"] == d0["tokenizer.json"]
    assert r1.steps == 3 and r1.final_loss == r2.final_loss
    info = json.loads((r1.out_dir / "rft_build.json").read_text())
    assert info["warm_start"]["steps"] == 3 and info["seed"] == 0


def test_builtin_tiny_is_warm_started_to_partial_accuracy(builtin_tiny_dir, tiny_model_cache):
    """Held-out arithmetic at temperature 1 and 16 tokens: better than random, far from solved."""
    torch.set_num_threads(2)
    random_dir = resolve_builtin_model("builtin:tiny-random", tiny_model_cache)
    held_out = load_builtin("arithmetic", 300, seed=12345)
    warm = accuracy(builtin_tiny_dir, held_out, temperature=1.0, max_tokens=16, seed=0)
    base = accuracy(random_dir, held_out, temperature=1.0, max_tokens=16, seed=0)
    assert warm.accuracy >= base.accuracy + 0.08, (warm, base)
    assert 0.08 <= warm.accuracy <= 0.6, warm
    assert accuracy(builtin_tiny_dir, held_out[:100], temperature=0.0).correct > 0


def test_resolve_builtin_model_caches_and_names_known_specs(builtin_tiny_dir, tiny_model_cache):
    before = _digests(builtin_tiny_dir)
    mtime = (builtin_tiny_dir / "model.safetensors").stat().st_mtime_ns
    again = resolve_builtin_model("builtin:tiny", tiny_model_cache)
    assert again == builtin_tiny_dir and _digests(again) == before
    assert (again / "model.safetensors").stat().st_mtime_ns == mtime
    assert not [p for p in tiny_model_cache.iterdir() if ".tmp-" in p.name]  # no temp leftovers
    with pytest.raises(ValueError, match="known: builtin:tiny, builtin:tiny-random, builtin:tiny-vllm"):
        resolve_builtin_model("builtin:huge", tiny_model_cache)
    with pytest.raises(ValueError, match="not a builtin spec"):
        resolve_builtin_model("Qwen/Qwen2-0.5B", tiny_model_cache)


def test_builtin_models_are_the_apis_and_tiny_vllm_has_a_head_size_vllm_serves(tiny_model_cache):
    from rft_api.constants import BUILTIN_MODELS as API_MODELS
    from rft_runtime.model import BUILTIN_MODELS

    # every model the API accepts is built by the runtime (tiny-random is for tests only)
    assert set(API_MODELS) == {f"builtin:{n}" for n in BUILTIN_MODELS if n != "tiny-random"}
    d = resolve_builtin_model("builtin:tiny-vllm", tiny_model_cache, warm_start_steps=2)
    cfg = json.loads((d / "config.json").read_text())
    # vLLM's CPU attention serves head sizes 32, 64, ...; it refuses builtin:tiny's 16
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 32
    assert d != resolve_builtin_model("builtin:tiny", tiny_model_cache, warm_start_steps=2)


def test_make_tiny_model_cli(tmp_path, capsys):
    assert make_tiny_model_cli([str(tmp_path / "m"), "--seed", "5", "--warm-start-steps", "2"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["path"] == str(tmp_path / "m") and out["seed"] == 5 and out["warm_start"]["steps"] == 2
    assert EXPECTED_FILES <= set(os.listdir(tmp_path / "m"))
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "m").config.vocab_size == VOCAB_SIZE
    assert make_tiny_model_cli([str(tmp_path / "n"), "--warm-start-steps", "1", "--dataset", "nope"]) == 2
    assert "known: arithmetic, gsm8k_synth" in capsys.readouterr().err


def test_model_export_writes_a_loadable_directory(tmp_path, tiny_random_dir):
    tiny_dir = tiny_random_dir
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rft_runtime.model.export import export_model, model_cli

    out = export_model(str(tiny_dir), tmp_path / "exported")
    assert (out / "model.safetensors").read_bytes() == (tiny_dir / "model.safetensors").read_bytes()
    AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert model_cli(["export", "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
