"""``stream: true`` on both completion routes: vLLM's chunk shapes (recorded), and the same tokens, text and
logprobs as the non-streamed answer."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import httpx
import pytest

from tests.serve.support import CONTRACTS, fixture

CASES = ["completions_token_ids_n2", "completions_text", "completions_stop_token", "chat_token_ids",
         "chat_plain_n2"]


def _events(url: str, path: str, body: dict) -> tuple[httpx.Response, list]:
    events = []
    with httpx.stream("POST", url + path, json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[6:]
                events.append(data if data == "[DONE]" else json.loads(data))
            else:
                assert line == "", line
        return r, events


def _kind(e: dict) -> str:
    if not e["choices"]:
        return "usage"
    c = e["choices"][0]
    if "delta" in c and "role" in c["delta"]:
        return "role"
    return "final" if c["finish_reason"] else "token"


def _shapes(events: list) -> dict[str, tuple]:
    """Per chunk kind: top-level keys, choice keys, and which of them are null."""
    out: dict[str, tuple] = {}
    for e in events[:-1]:
        k = _kind(e)
        c = e["choices"][0] if e["choices"] else {}
        first = k == "token" and "prompt_token_ids" in c and c["prompt_token_ids"] is not None
        out.setdefault(k + ("/first" if first else ""), (sorted(e), sorted(c), sorted(x for x, v in c.items() if v is None)))
    return out


@pytest.mark.parametrize("case", CASES)
def test_stream_matches_recorded_vllm_shapes(server, case):
    rec = fixture(f"stream_{case}")
    r, events = _events(server.url, rec["path"], rec["request"])
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert "x-policy-version" in r.headers
    assert events[-1] == "[DONE]" and rec["events"][-1] == "[DONE]"
    ours, theirs = _shapes(events), _shapes(rec["events"])
    assert set(ours) == set(theirs), (ours, theirs)
    for kind in theirs:
        assert ours[kind][:2] == theirs[kind][:2], kind
    n = rec["request"].get("n", 1)
    assert sorted({c["index"] for e in events[:-1] for c in e["choices"]}) == list(range(n))
    assert sum(1 for e in events[:-1] for c in e["choices"] if c["finish_reason"]) == n
    for e in events[:-1]:
        assert e["object"] == rec["events"][0]["object"] and e["id"] == events[0]["id"]


@pytest.mark.parametrize("case", CASES)
def test_stream_concatenates_to_the_plain_answer(server, case):
    rec = fixture(f"stream_{case}")
    body = {**rec["request"], "return_token_ids": True}
    chat = "messages" in body
    _, events = _events(server.url, rec["path"], body)
    plain = httpx.post(server.url + rec["path"], json={k: v for k, v in body.items()
                                                      if k not in ("stream", "stream_options")}, timeout=60).json()
    for choice in plain["choices"]:
        mine = [c for e in events[:-1] for c in e["choices"] if c["index"] == choice["index"]]
        text = "".join(c["delta"].get("content", "") if chat else c["text"] for c in mine)
        assert text == (choice["message"]["content"] if chat else choice["text"])
        assert [t for c in mine if c.get("token_ids") for t in c["token_ids"]] == choice["token_ids"]
        assert mine[-1]["finish_reason"] == choice["finish_reason"]
        assert mine[-1]["stop_reason"] == choice["stop_reason"]
        if choice["logprobs"] is not None:
            if chat:
                got = [x["logprob"] for c in mine if c["logprobs"] for x in c["logprobs"]["content"]]
                want = [x["logprob"] for x in choice["logprobs"]["content"]]
            else:
                got = [x for c in mine if c["logprobs"] for x in c["logprobs"]["token_logprobs"]]
                want = choice["logprobs"]["token_logprobs"]
            assert got == pytest.approx(want, abs=1e-6)
    usage = [e for e in events[:-1] if not e["choices"]]
    if body.get("stream_options", {}).get("include_usage"):
        assert usage[0]["usage"] == {k: plain["usage"][k] for k in ("prompt_tokens", "total_tokens",
                                                                     "completion_tokens")}
    else:
        assert not usage


def test_stream_errors_before_the_stream_are_plain_400(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 300, "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = httpx.post(server.url + "/v1/completions", json={"prompt": [1, 2], "stream_options": {"include_usage": True}})
    assert r.status_code == 400 and "stream=True" in r.json()["error"]["message"]


OPENAI_SCRIPT = textwrap.dedent("""
    import json, sys
    from openai import OpenAI
    c = OpenAI(base_url=sys.argv[1] + "/v1", api_key="none")
    parts = [ch.choices[0].text for ch in c.completions.create(
        model="tiny", prompt=[269, 272], max_tokens=6, temperature=0, stream=True) if ch.choices]
    deltas = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0.7, seed=3,
        stream=True, stream_options={"include_usage": True}) if ch.choices]
    print(json.dumps({"completion": "".join(parts), "chat": "".join(deltas)}))
""")


def test_official_openai_client_streams(server):
    """The ``openai`` package (from the vLLM venv, which has it) streams from both routes."""
    python = os.environ.get("RFT_VLLM_PYTHON")
    if not python or subprocess.run([python, "-c", "import openai"], capture_output=True).returncode:
        pytest.skip("no python with the openai package (RFT_VLLM_PYTHON)")
    out = subprocess.run([python, "-c", OPENAI_SCRIPT, server.url], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    plain = httpx.post(server.url + "/v1/completions", json={"prompt": [269, 272], "max_tokens": 6,
                                                             "temperature": 0}).json()
    chat = httpx.post(server.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0.7, "seed": 3}).json()
    assert got == {"completion": plain["choices"][0]["text"], "chat": chat["choices"][0]["message"]["content"]}


def test_stream_fixtures_are_vendored():
    assert len(list(CONTRACTS.glob("processed_logprobs__stream_*.json"))) == len(CASES)
