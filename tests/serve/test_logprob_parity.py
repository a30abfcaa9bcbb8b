"""Returned logprobs equal a transformers recomputation of the sampled completion (processed logprobs).

Reference: one full forward over prompt + completion, ``log_softmax(logits / T)`` (float32), with the
request's top-k / top-p filter applied for sampling rows. Tolerance: ATOL = 1e-4 (observed ~1e-6).
"""

from __future__ import annotations

import math

import httpx
import pytest
import torch

from tests.serve.support import CHAT_PROMPT, fixture, recompute_logprobs

ATOL = 1e-4
PROMPTS = [CHAT_PROMPT, [269, 272], [5, 17, 99, 230, 4, 8, 8, 15, 201, 67, 80]]


def _post(server, path: str, body: dict) -> dict:
    with httpx.Client(base_url=server.url, timeout=120) as c:
        r = c.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _reference_filter(row: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """A plain per-position top-k / top-p: keep the largest logits (ties with the k-th kept), then the
    smallest prefix of them, largest first, whose probability reaches top_p."""
    keep = torch.ones_like(row, dtype=torch.bool)
    if top_k > 0:
        kth = sorted(row.tolist(), reverse=True)[top_k - 1]
        keep &= row >= kth
    if top_p < 1.0:
        masked = torch.where(keep, row, torch.tensor(float("-inf")))
        probs = torch.softmax(masked, dim=-1)
        order = sorted(range(len(row)), key=lambda i: -probs[i].item())
        total, nucleus = 0.0, set()
        for i in order:
            nucleus.add(i)
            total += probs[i].item()
            if total >= top_p:
                break
        keep &= torch.tensor([i in nucleus for i in range(len(row))])
    return torch.where(keep, row, torch.tensor(float("-inf")))


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.3])
def test_sampled_logprobs_match_recompute(server, ref_model, temperature):
    body = {"model": "tiny", "prompt": PROMPTS, "n": 2, "max_tokens": 24, "temperature": temperature,
            "seed": 11, "logprobs": 3, "return_token_ids": True, "return_tokens_as_token_ids": True}
    resp = _post(server, "/v1/completions", body)
    assert len(resp["choices"]) == len(PROMPTS) * 2
    worst = 0.0
    for ch in resp["choices"]:
        prompt, out = ch["prompt_token_ids"], ch["token_ids"]
        assert prompt == PROMPTS[ch["index"] // 2]
        ref = recompute_logprobs(ref_model, prompt, out, temperature)
        got = torch.tensor(ch["logprobs"]["token_logprobs"])
        want = ref[torch.arange(len(out)), torch.tensor(out)]
        worst = max(worst, float((got - want).abs().max()))
        for i, top in enumerate(ch["logprobs"]["top_logprobs"]):
            vals, idx = ref[i].topk(3)
            expected = {out[i]: want[i].item()}
            for t, v in zip(idx.tolist(), vals.tolist()):
                expected.setdefault(t, v)
            assert [f"token_id:{t}" for t in expected] == list(top)  # chosen first, then the top 3
            worst = max(worst, max(abs(top[f"token_id:{t}"] - v) for t, v in expected.items()))
    assert worst <= ATOL, f"max |logprob - recomputed| = {worst:.2e}"


def test_greedy_logprobs_are_log_softmax_of_logits(server, ref_model):
    body = {"prompt": PROMPTS[2], "max_tokens": 16, "temperature": 0, "logprobs": 1, "return_token_ids": True,
            "ignore_eos": True}
    ch = _post(server, "/v1/completions", body)["choices"][0]
    ref = recompute_logprobs(ref_model, PROMPTS[2], ch["token_ids"], 0.0)
    assert ch["token_ids"] == ref.argmax(dim=-1).tolist()
    got = torch.tensor(ch["logprobs"]["token_logprobs"])
    assert torch.allclose(got, ref.max(dim=-1).values, atol=ATOL, rtol=0)


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (0, 0.6), (20, 0.5)])
def test_filtered_sampling_logprobs_match_reference(server, ref_model, top_k, top_p):
    temperature = 0.8
    body = {"prompt": PROMPTS[0], "n": 3, "max_tokens": 16, "temperature": temperature, "top_k": top_k,
            "top_p": top_p, "seed": 5, "logprobs": 0, "return_token_ids": True, "ignore_eos": True}
    for ch in _post(server, "/v1/completions", body)["choices"]:
        out = ch["token_ids"]
        ids = torch.tensor([PROMPTS[0] + out])
        with torch.no_grad():
            logits = ref_model(input_ids=ids).logits[0].float() / temperature
        start = len(PROMPTS[0]) - 1
        for i, tok in enumerate(out):
            filtered = _reference_filter(logits[start + i], top_k, top_p)
            assert math.isfinite(filtered[tok].item()), "sampled a filtered-out token"
            want = torch.log_softmax(filtered, dim=-1)[tok].item()
            assert abs(ch["logprobs"]["token_logprobs"][i] - want) <= ATOL


def test_chat_logprobs_match_recompute(server, ref_model):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "what is 2 + 3?"}], "max_tokens": 12,
            "temperature": 0.9, "seed": 3, "logprobs": True, "top_logprobs": 2, "return_token_ids": True}
    resp = _post(server, "/v1/chat/completions", body)
    assert resp["prompt_token_ids"] == CHAT_PROMPT
    ch = resp["choices"][0]
    ref = recompute_logprobs(ref_model, CHAT_PROMPT, ch["token_ids"], 0.9)
    got = torch.tensor([e["logprob"] for e in ch["logprobs"]["content"]])
    want = ref[torch.arange(len(ch["token_ids"])), torch.tensor(ch["token_ids"])]
    assert torch.allclose(got, want, atol=ATOL, rtol=0)


def test_prompt_logprobs_are_raw_with_ranks(server, ref_model):
    """prompt_logprobs ignore the temperature (as vLLM's, identical in both of its logprobs modes)."""
    body = {"prompt": PROMPTS[0], "max_tokens": 1, "temperature": 0.5, "prompt_logprobs": 2, "seed": 1}
    ch = _post(server, "/v1/completions", body)["choices"][0]
    plp = ch["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(PROMPTS[0])
    with torch.no_grad():
        lp = torch.log_softmax(ref_model(input_ids=torch.tensor([PROMPTS[0]])).logits[0].float(), dim=-1)
    for t in range(1, len(PROMPTS[0])):
        tok = PROMPTS[0][t]
        entry = plp[t][str(tok)]
        assert abs(entry["logprob"] - lp[t - 1, tok].item()) <= ATOL
        assert entry["rank"] == int((lp[t - 1] > lp[t - 1, tok]).sum()) + 1
        assert 1 <= len(plp[t]) <= 3


def test_raw_prompt_logprobs_match_vllm_recording(server):
    """Scoring vLLM's sampled tokens as a prompt reproduces vLLM's raw logprobs for them. vLLM ran the
    float32 checkpoint with reduced-precision CPU kernels, so agreement is ~3e-3, not float32 level."""
    fx = fixture("completions_stop_eos", "raw_logprobs")
    ch = fx["response"]["choices"][0]
    prompt, out = ch["prompt_token_ids"], ch["token_ids"]
    body = {"prompt": prompt + out, "max_tokens": 1, "prompt_logprobs": 0}
    plp = _post(server, "/v1/completions", body)["choices"][0]["prompt_logprobs"]
    ours = [plp[len(prompt) + i][str(t)]["logprob"] for i, t in enumerate(out)]
    diff = max(abs(a - b) for a, b in zip(ours, ch["logprobs"]["token_logprobs"]))
    assert diff <= 1e-2, diff
