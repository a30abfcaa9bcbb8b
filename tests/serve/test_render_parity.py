"""Given vLLM's own tokens and logprobs, our renderer reproduces vLLM's recorded JSON exactly.

This pins the parts of the response that do not depend on sampling: token strings (including partial
UTF-8 characters), text, text offsets, top-logprob maps, prompt logprobs and chat logprob entries.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from rft_runtime.serve.batch import Sequence
from rft_runtime.serve.codec import TextCodec
from rft_runtime.serve.protocol import SamplingParams
from rft_runtime.serve.render import chat_logprobs, completion_logprobs, output_text, prompt_logprobs_body
from tests.serve.support import TINY, fixture

COMPLETION_CASES = ["completions_echo", "completions_length_truncated", "completions_n2", "completions_prompt_logprobs",
                    "completions_stop_eos", "completions_text_prompt", "completions_tokens_in_logprobs"]


@pytest.fixture(scope="module")
def codec() -> TextCodec:
    return TextCodec(AutoTokenizer.from_pretrained(TINY, local_files_only=True), 348)


def _id_of(label: str, codec: TextCodec, ctx: list[int], candidates: list[int]) -> int:
    if label.startswith("token_id:"):
        return int(label.split(":", 1)[1])
    for c in candidates:  # labels are token strings: find the id that renders so
        if codec.piece(ctx, c) == label:
            return c
    raise AssertionError(f"no id renders as {label!r}")


def _sequence_from_vllm(choice: dict, request: dict, codec: TextCodec) -> Sequence:
    prompt, output = choice["prompt_token_ids"], choice["token_ids"]
    lp = choice["logprobs"]
    n_prompt = len(prompt) if request.get("echo") else 0
    k = request["logprobs"]
    seq = Sequence(prompt=prompt, params=SamplingParams(logprobs=k, prompt_logprobs=request.get("prompt_logprobs")))
    for i, tid in enumerate(output):
        seq.output.append(tid)
        seq.logprobs.append(lp["token_logprobs"][n_prompt + i])
        labels = list(lp["top_logprobs"][n_prompt + i].items())
        ctx = prompt + output[:i]
        seq.top.append([(_id_of(lab, codec, ctx, [tid]), v) for lab, v in labels[1:]] if k else [])
    if choice.get("prompt_logprobs") is not None:
        seq.prompt_logprobs = [None] + [{int(t): (e["logprob"], e["rank"]) for t, e in entry.items()}
                                        for entry in choice["prompt_logprobs"][1:]]
    seq.finish_reason, seq.stop_reason = choice["finish_reason"], choice["stop_reason"]
    return seq


@pytest.mark.parametrize("mode", ["processed_logprobs", "raw_logprobs"])
@pytest.mark.parametrize("case", COMPLETION_CASES)
def test_completion_rendering_matches_vllm(codec, case, mode):
    fx = fixture(case, mode)
    req = fx["request"]
    for choice in fx["response"]["choices"]:
        seq = _sequence_from_vllm(choice, req, codec)
        ours = completion_logprobs(codec, seq, req["logprobs"], bool(req.get("echo")),
                                   bool(req.get("return_tokens_as_token_ids")))
        assert ours == choice["logprobs"]
        assert output_text(codec, seq) == choice["text"]
        assert prompt_logprobs_body(codec, seq) == choice["prompt_logprobs"]


def test_chat_rendering_matches_vllm(codec):
    fx = fixture("chat_completions_token_ids")
    resp = fx["response"]
    choice = resp["choices"][0]
    seq = Sequence(prompt=resp["prompt_token_ids"], params=SamplingParams(logprobs=1))
    for tid, entry in zip(choice["token_ids"], choice["logprobs"]["content"]):
        seq.output.append(tid)
        seq.logprobs.append(entry["logprob"])
        seq.top.append([])
    seq.finish_reason = choice["finish_reason"]
    assert chat_logprobs(codec, seq, fx["request"]["top_logprobs"], False) == choice["logprobs"]
    assert output_text(codec, seq) == choice["message"]["content"]


def test_partial_utf8_tokens_render_like_vllm(codec):
    """Token 150 opens a two-byte character that token 252 completes: vLLM shows "" then the character."""
    assert codec.pieces([201], [150, 252]) == ["", "\u05db"]
    assert codec.piece([], 169) == ""
