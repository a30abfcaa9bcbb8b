"""Converts SmolLM2-135M-Instruct from GGUF to a Hugging Face model directory, and checks the result.

Run by hack/smollm2.sh in a venv that adds ``gguf`` to the project's dependency venv (transformers reads
GGUF through it). transformers de-quantises the GGUF file's tensors to float32 but will not
``save_pretrained`` a model it loaded from GGUF, so the model is rebuilt from the config (without the
GGUF quantisation entry) and the de-quantised state dict loaded into it, strictly. The file's tokenizer
is converted by transformers too; two things are restored to what the original Hugging Face checkpoint
has (and what llama.cpp does for the file's ``tokenizer.ggml.pre = smollm``):

* the pre-tokenizer: every digit is its own piece before the GPT-2 byte-level split (transformers knows no
  split for ``smollm`` and keeps the plain GPT-2 one, which splits ``"and  2"`` differently);
* ``model_max_length``: the context length (8192), and ``rms_norm_eps`` 1e-5 (the file holds it as a
  float32, 9.9999997e-06).

Written: ``config.json``, ``generation_config.json``, ``model.safetensors`` (float32, the embedding tied
to the head), the tokenizer files with ``chat_template.jinja``, and ``rft_build.json`` (where it came
from). The build fails (exit 1, nothing renamed into place by the caller) unless the config is the
expected Llama, the saved weights equal the de-quantised ones and stay tied, the tokenizer round-trips
text and renders the chat template, and greedy generation of the GGUF-loaded and of the saved model gives
the same tokens on two prompts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF de-quantisation bar (the log gets timings)

import torch  # noqa: E402

EXPECTED = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 30,
            "vocab_size": 49152, "hidden_size": 576, "tie_word_embeddings": True}
PARAMS = (134_000_000, 135_000_000)  # 134,515,008 with the embedding counted once
GREEDY_PROMPTS = (
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a concise math tutor."},
     {"role": "user", "content": "Tom has 3 apples and buys 5 more. How many apples does he have?"}],
)
GREEDY_TOKENS = 24
ROUND_TRIP = ("Janet's ducks lay 16 eggs per day; she sells them for $2 each.\n#### 18",
              "  indented\tcode(x) -> 1234567890 and  2 spaces", "Café, naïve, 日本語, emoji 😀",
              "<|im_start|>user\nhi<|im_end|>\n")
BUILD_INFO_FILE = "rft_build.json"


class ConversionError(RuntimeError):
    """The converted model is not what it must be."""


def log(msg: str) -> None:
    print(f"[smollm2] {msg}", file=sys.stderr, flush=True)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_gguf(gguf: Path) -> tuple[Any, Any]:
    """The model (float32, de-quantised) and tokenizer transformers builds from the GGUF file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return model.eval(), tokenizer


def rebuild(gguf_model: Any) -> Any:
    """A plain Llama model with the GGUF model's weights (the config without its GGUF quantisation)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    fields = gguf_model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version"):
        fields.pop(key, None)
    fields["rms_norm_eps"] = float(f"{fields['rms_norm_eps']:.7g}")  # 1e-5, stored as float32 in the file
    fields["architectures"] = ["LlamaForCausalLM"]
    fields["dtype"] = "float32"
    config = LlamaConfig(**fields)
    with torch.no_grad():
        model = LlamaForCausalLM(config)
        model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.tie_weights()
    return model.eval()


def fix_tokenizer(tokenizer: Any, max_length: int) -> Any:
    """The original checkpoint's pre-tokenizer (single digits, then GPT-2 byte level) and length."""
    from tokenizers import pre_tokenizers

    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    tokenizer.model_max_length = max_length
    for key in ("is_local", "local_files_only", "name_or_path", "vocab_file"):  # how it was loaded, not what it is
        tokenizer.init_kwargs.pop(key, None)
    return tokenizer


def save(model: Any, tokenizer: Any, out: Path, info: dict[str, Any]) -> None:
    from transformers import GenerationConfig

    cfg = model.config
    model.generation_config = GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id,
                                               pad_token_id=cfg.pad_token_id)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / BUILD_INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def check(condition: bool, what: str) -> None:
    if not condition:
        raise ConversionError(what)


def check_config(out: Path, model: Any) -> int:
    """The saved config is the expected Llama; returns the parameter count (tied weights once)."""
    raw = json.loads((out / "config.json").read_text())
    for key, want in EXPECTED.items():
        check(raw.get(key) == want, f"config.json: {key} is {raw.get(key)!r}, expected {want!r}")
    check("quantization_config" not in raw, "config.json still holds the GGUF quantization_config")
    params = sum(p.numel() for p in model.parameters())
    check(PARAMS[0] <= params <= PARAMS[1], f"{params} parameters, expected {PARAMS[0]}..{PARAMS[1]}")
    check(model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(),
          "the saved model's head is not tied to its embedding")
    return params


def check_weights(gguf_model: Any, saved: Any) -> None:
    want, got = gguf_model.state_dict(), saved.state_dict()
    check(set(want) == set(got), f"parameter names differ: {sorted(set(want) ^ set(got))[:5]}")
    for name, tensor in want.items():
        check(got[name].dtype == torch.float32, f"{name} is {got[name].dtype}, expected float32")
        check(torch.equal(tensor, got[name]), f"{name} differs from the de-quantised GGUF tensor")


def check_tokenizer(tokenizer: Any) -> None:
    for text in ROUND_TRIP:
        ids = tokenizer.encode(text, add_special_tokens=False)
        check(tokenizer.decode(ids) == text, f"tokenizer does not round-trip {text!r}")
    check(tokenizer.encode("1234", add_special_tokens=False) == [tokenizer.convert_tokens_to_ids(c) for c in "1234"],
          "digits are not single tokens")
    check(len(tokenizer) == EXPECTED["vocab_size"], f"tokenizer has {len(tokenizer)} tokens")
    check(tokenizer.eos_token == "<|im_end|>" and tokenizer.bos_token == "<|im_start|>", "special tokens")
    ids = chat_ids(tokenizer, list(GREEDY_PROMPTS[0]))
    text = tokenizer.decode(ids)
    check(text.startswith("<|im_start|>system\n") and text.endswith("<|im_end|>\n<|im_start|>assistant\n"),
          f"unexpected chat rendering {text!r}")


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(out, list):  # transformers >= 5 returns a BatchEncoding
        out = out["input_ids"]
    return [int(t) for t in out]


def greedy(model: Any, ids: list[int], eos: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             do_sample=False, max_new_tokens=GREEDY_TOKENS, eos_token_id=eos, pad_token_id=eos)
    return [int(t) for t in out[0, len(ids):]]


def check_generation(gguf_model: Any, saved: Any, tokenizer: Any) -> list[str]:
    answers = []
    for messages in GREEDY_PROMPTS:
        ids = chat_ids(tokenizer, list(messages))
        want, got = greedy(gguf_model, ids, tokenizer.eos_token_id), greedy(saved, ids, tokenizer.eos_token_id)
        check(want == got, f"greedy tokens differ: GGUF {want} vs saved {got}")
        answers.append(tokenizer.decode(got, skip_special_tokens=True))
    return answers


def convert(gguf: Path, out: Path, source: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the build log gets the timings below, not 272-step bars
    t0 = time.monotonic()
    gguf_model, tokenizer = load_gguf(gguf)
    log(f"GGUF loaded and de-quantised in {time.monotonic() - t0:.1f} s")
    model = rebuild(gguf_model)
    tokenizer = fix_tokenizer(tokenizer, int(model.config.max_position_embeddings))
    info = {"kind": "smollm2-135m-instruct", "source": source, "gguf_file": gguf.name, "gguf_sha256": sha256(gguf),
            "converter": {"gguf": version("gguf"), "transformers": version("transformers"), "torch": version("torch")}}
    save(model, tokenizer, out, info)
    del model
    saved = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, local_files_only=True).eval()
    saved_tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    params = check_config(out, saved)
    check_weights(gguf_model, saved)
    check_tokenizer(saved_tok)
    answers = check_generation(gguf_model, saved, saved_tok)
    size = sum(f.stat().st_size for f in out.iterdir())
    log(f"{params} parameters, tied embedding, {size / 1e6:.0f} MB; greedy answers identical: {answers}")
    log(f"converted and checked in {time.monotonic() - t0:.1f} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, required=True, help="the GGUF file")
    ap.add_argument("--out", type=Path, required=True, help="the model directory to write (must not exist)")
    ap.add_argument("--source", default="", help="where the GGUF file came from (recorded in rft_build.json)")
    args = ap.parse_args(argv)
    if args.out.exists():
        ap.error(f"--out {args.out} exists")
    try:
        convert(args.gguf, args.out, args.source)
    except ConversionError as e:
        log(f"conversion check failed: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
