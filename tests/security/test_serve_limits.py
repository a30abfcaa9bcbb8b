"""Attacks on the builtin inference server (a real server over the tiny model on loopback): a
stalling chat template, request-supplied templates, oversized bodies and ``n × max_tokens`` abuse.
Each test fails if the attack freezes the server, gets through, or is answered outside vLLM's error
shape (the recorded fixtures in tests/contracts/vllm)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from rft_runtime.coordinator.server import AppThread
from rft_runtime.serve.engine import Engine
from rft_runtime.serve.model import load_model
from rft_runtime.serve.server import create_app
from tests.serve.support import CHAT_PROMPT, TINY, fixture

# ~5 s of pure template loops on one core (no calls inside the inner loop): a stall, not a hang.
STALL = "{% for a in range(800) %}{% for b in range(100000) %}{% endfor %}{% endfor %}stalled"
SHORT_STALL = "{% for a in range(200) %}{% for b in range(100000) %}{% endfor %}{% endfor %}stalled"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "what is 2 + 3?"}], "max_tokens": 4,
        "temperature": 0.0}


@pytest.fixture(scope="module")
def engine_model():
    return load_model(TINY, device="cpu")


def _serve(lm, **limits) -> AppThread:
    app = create_app(Engine(lm, max_batch_size=8), "tiny", stop_engine_on_cleanup=True, **limits)
    return AppThread(app).start()


@pytest.fixture(scope="module")
def trusting(engine_model):
    """Trusts request templates; the render limit is long enough for STALL to finish rendering."""
    server = _serve(engine_model, trust_request_chat_template=True, render_timeout_s=120)
    yield f"http://127.0.0.1:{server.port}"
    server.stop()


@pytest.fixture(scope="module")
def impatient(engine_model):
    """Trusts request templates, with a short render limit."""
    server = _serve(engine_model, trust_request_chat_template=True, render_timeout_s=0.2)
    yield f"http://127.0.0.1:{server.port}"
    server.stop()


@pytest.fixture(scope="module")
def default(engine_model):
    server = _serve(engine_model)
    yield f"http://127.0.0.1:{server.port}"
    server.stop()


def assert_vllm_error(resp: httpx.Response, param: str | None) -> dict:
    """A 400 with exactly the keys of vLLM's recorded error body."""
    recorded = fixture("error_context_overflow")["response"]
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert body.keys() == recorded.keys() and body["error"].keys() == recorded["error"].keys()
    assert body["error"]["type"] == "BadRequestError" and body["error"]["code"] == 400
    assert body["error"]["param"] == param, body
    return body["error"]


async def test_a_stalling_template_does_not_freeze_other_requests(trusting):
    """Two honest requests sent while a template renders for seconds both complete before that
    rendering does (on the event loop they would wait for it)."""
    finished: list[str] = []
    async with httpx.AsyncClient(base_url=trusting, timeout=120) as h:
        async def request(label: str, path: str, body: dict) -> httpx.Response:
            r = await h.post(path, json=body)
            finished.append(label)
            return r

        stalled = asyncio.ensure_future(request("attack", "/v1/chat/completions",
                                                {**CHAT, "chat_template_kwargs": {"chat_template": STALL}}))
        await asyncio.sleep(0.3)  # the stalling render is under way
        completion, chat = await asyncio.gather(
            request("completion", "/v1/completions",
                    {"model": "tiny", "prompt": CHAT_PROMPT, "max_tokens": 2, "temperature": 0.0}),
            request("chat", "/v1/chat/completions", {**CHAT, "max_tokens": 2}))
        assert completion.status_code == 200 and chat.status_code == 200, (completion.text, chat.text)
        assert "attack" not in finished  # both completed while the malicious render was still in flight
        attack = await stalled
        assert attack.status_code == 200 and finished[-1] == "attack"  # it rendered, in its own time


async def test_a_rendering_over_the_time_limit_is_a_clear_400(impatient):
    async with httpx.AsyncClient(base_url=impatient, timeout=60) as h:
        r = await h.post("/v1/chat/completions", json={**CHAT, "chat_template": SHORT_STALL})
        err = assert_vllm_error(r, "messages")
        assert "took longer than 0.2 s" in err["message"]


@pytest.mark.parametrize("where", ["kwargs", "top-level"])
async def test_request_supplied_chat_templates_are_refused_by_default(default, where):
    body = ({**CHAT, "chat_template_kwargs": {"chat_template": STALL}} if where == "kwargs"
            else {**CHAT, "chat_template": STALL})
    async with httpx.AsyncClient(base_url=default, timeout=60) as h:
        err = assert_vllm_error(await h.post("/v1/chat/completions", json=body), "chat_template")
        assert "--trust-request-chat-template" in err["message"]
        assert (await h.post("/v1/chat/completions", json=CHAT)).status_code == 200  # the model's own template


async def test_an_oversized_template_is_refused_even_when_trusted(trusting):
    async with httpx.AsyncClient(base_url=trusting, timeout=60) as h:
        r = await h.post("/v1/chat/completions", json={**CHAT, "chat_template": "x" * (64 * 1024 + 1)})
        assert_vllm_error(r, "chat_template")


async def test_an_oversized_body_is_a_clear_400(default):
    big = json.dumps({"model": "tiny", "prompt": "a" * (2 << 20), "max_tokens": 1})
    async with httpx.AsyncClient(base_url=default, timeout=60) as h:
        r = await h.post("/v1/completions", content=big, headers={"Content-Type": "application/json"})
        err = assert_vllm_error(r, None)
        assert "too large" in err["message"]
        assert (await h.post("/v1/completions", json={"model": "tiny", "prompt": CHAT_PROMPT,
                                                       "max_tokens": 2})).status_code == 200


async def test_n_times_max_tokens_abuse_is_refused(default):
    async with httpx.AsyncClient(base_url=default, timeout=60) as h:
        r = await h.post("/v1/completions", json={"model": "tiny", "prompt": CHAT_PROMPT, "n": 256,
                                                  "max_tokens": 200})
        err = assert_vllm_error(r, "n")
        assert "51200" in err["message"] and "limit per request is 16384" in err["message"]
        many = await h.post("/v1/completions", json={"model": "tiny", "prompt": [CHAT_PROMPT] * 5, "n": 256,
                                                     "max_tokens": 1})
        assert_vllm_error(many, "n")
        ok = await h.post("/v1/completions", json={"model": "tiny", "prompt": CHAT_PROMPT, "n": 4, "max_tokens": 2})
        assert ok.status_code == 200 and len(ok.json()["choices"]) == 4
