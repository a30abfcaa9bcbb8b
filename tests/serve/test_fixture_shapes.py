"""Our server answers each recorded vLLM request with the same response structure and types."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.serve.support import CHAT_PROMPT, fixture

# Dict-valued paths whose keys are data (token strings or token ids), not field names.
MAP_PATHS = {"choices[].logprobs.top_logprobs[]", "choices[].prompt_logprobs[]", "prompt_logprobs[]"}
OUR_EXTRA_TOP_LEVEL = {"policy_version"}

GENERATION_CASES = [
    "completions_echo", "completions_length_truncated", "completions_n2", "completions_prompt_logprobs",
    "completions_stop_eos", "completions_text_prompt", "completions_tokens_in_logprobs",
    "chat_completions_token_ids",
]
ERROR_CASES = ["error_bad_token_id", "error_context_overflow", "error_unknown_model"]


def skeleton(x, path: str = ""):
    """The JSON value's structure: field names and value types, lists as the set of their element shapes."""
    if isinstance(x, dict):
        if path in MAP_PATHS:
            return ["map", sorted({json.dumps(skeleton(v, path + "{}"), sort_keys=True) for v in x.values()})]
        return {k: skeleton(v, f"{path}.{k}" if path else k) for k, v in x.items()}
    if isinstance(x, list):
        return ["list", sorted({json.dumps(skeleton(v, path + "[]"), sort_keys=True) for v in x})]
    return {type(None): "null", bool: "bool", int: "int", float: "float", str: "str"}[type(x)]


def _send(server, fx: dict) -> httpx.Response:
    with httpx.Client(base_url=server.url, timeout=120) as c:
        if fx["method"] == "GET":
            return c.get(fx["path"])
        return c.post(fx["path"], json=fx["request"])


@pytest.mark.parametrize("case", GENERATION_CASES)
def test_generation_shape_matches_vllm(server, case):
    fx = fixture(case)
    r = _send(server, fx)
    assert r.status_code == fx["status"] == 200
    ours, theirs = r.json(), fx["response"]
    assert set(ours) - set(theirs) == OUR_EXTRA_TOP_LEVEL
    assert isinstance(ours["policy_version"], int)
    assert r.headers["x-policy-version"] == str(ours["policy_version"])
    ours_core = {k: v for k, v in ours.items() if k not in OUR_EXTRA_TOP_LEVEL}
    assert skeleton(ours_core) == skeleton(theirs)
    # values that do not depend on sampling
    for key in ("object", "model"):
        assert ours[key] == theirs[key]
    assert [c["index"] for c in ours["choices"]] == [c["index"] for c in theirs["choices"]]
    assert ours["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]
    req = fx["request"]
    total = 0
    for ch, vch in zip(ours["choices"], theirs["choices"]):
        ids = ch["token_ids"]
        total += len(ids)
        assert 1 <= len(ids) <= req["max_tokens"]
        if ch["finish_reason"] == "length":
            assert len(ids) == req["max_tokens"]
        else:
            assert ch["finish_reason"] == "stop" and ids[-1] in (2, *req.get("stop_token_ids", []))
        if "prompt_token_ids" in vch:
            assert ch["prompt_token_ids"] == vch["prompt_token_ids"]
        lp = ch["logprobs"]
        if case.startswith("chat"):
            assert len(lp["content"]) == len(ids)
            assert all(len(e["top_logprobs"]) == req["top_logprobs"] for e in lp["content"])
            continue
        n_tok = len(ids) + (len(ch["prompt_token_ids"]) if req.get("echo") else 0)
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == n_tok
        for i in range(1, n_tok):  # offsets accumulate the token strings' lengths
            assert lp["text_offset"][i] == lp["text_offset"][i - 1] + len(lp["tokens"][i - 1])
        if req.get("return_tokens_as_token_ids"):
            assert lp["tokens"][-len(ids):] == [f"token_id:{t}" for t in ids]
        for top in lp["top_logprobs"]:
            assert top is None or 1 <= len(top) <= req["logprobs"] + 1
        if vch.get("prompt_logprobs") is not None:
            assert len(ch["prompt_logprobs"]) == len(vch["prompt_logprobs"])
            for mine, vllm in zip(ch["prompt_logprobs"][1:], vch["prompt_logprobs"][1:]):
                assert list(mine) == list(vllm)  # keyed by the prompt token id
                (tid, entry), = mine.items()
                assert entry["decoded_token"] == vllm[tid]["decoded_token"]
    assert ours["usage"]["completion_tokens"] == total
    if case == "chat_completions_token_ids":
        assert ours["prompt_token_ids"] == CHAT_PROMPT


def test_greedy_text_prompt_reproduces_vllm_tokens(server):
    """Temperature 0 is deterministic: our tokens and text equal vLLM's recorded ones."""
    fx = fixture("completions_text_prompt")
    ours = _send(server, fx).json()["choices"][0]
    theirs = fx["response"]["choices"][0]
    assert ours["token_ids"] == theirs["token_ids"]
    assert ours["text"] == theirs["text"]
    assert ours["logprobs"]["tokens"] == theirs["logprobs"]["tokens"]
    assert ours["logprobs"]["text_offset"] == theirs["logprobs"]["text_offset"]


@pytest.mark.parametrize("case", ERROR_CASES)
def test_error_bodies_match_vllm(server, case):
    fx = fixture(case)
    r = _send(server, fx)
    assert r.status_code == fx["status"]
    assert r.json() == fx["response"]


def test_tokenize_chat_matches_vllm(server):
    fx = fixture("tokenize_chat")
    r = _send(server, fx)
    assert r.status_code == 200
    assert r.json() == fx["response"]


def test_models_shape_matches_vllm(server):
    fx = fixture("models")
    ours = _send(server, fx).json()
    assert skeleton(ours) == skeleton(fx["response"])
    card = ours["data"][0]
    assert card["id"] == "tiny" and card["max_model_len"] == 256


def test_health_matches_vllm(server):
    fx = fixture("health")
    r = _send(server, fx)
    assert r.status_code == 200 and r.text == fx["response"]


def test_unknown_route_is_404_like_vllm(server):
    fx = fixture("load_lora_adapter_without_lora")
    r = _send(server, fx)
    assert r.status_code == 404 and r.json() == fx["response"]
