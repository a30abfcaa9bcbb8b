"""HTTP behaviour beyond the fixtures: validation errors, health, tokenizer routes, metrics, the CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rft_runtime.serve.engine import Engine
from rft_runtime.serve.model import load_model
from tests.serve.support import CHAT_PROMPT, TINY, ServerThread, fixture
from tests.support import metrics_text
from tests.support.ports import free_port
from tests.support.processes import maps_torch
from tests.support.servers import wait_healthy


def _post(server, path: str, body) -> httpx.Response:
    kw = {"json": body} if not isinstance(body, (bytes, str)) else {"content": body}
    return httpx.post(f"{server.url}{path}", timeout=120, **kw)


@pytest.mark.parametrize("body,param", [
    ({"prompt": [1, 2], "temperature": -1}, "temperature"),
    ({"prompt": [1, 2], "top_p": 0}, "top_p"),
    ({"prompt": [1, 2], "top_p": 1.5}, "top_p"),
    ({"prompt": [1, 2], "top_k": -2}, "top_k"),
    ({"prompt": [1, 2], "n": 0}, "n"),
    ({"prompt": [1, 2], "max_tokens": 0}, "max_tokens"),
    ({"prompt": [1, 2], "max_tokens": "5"}, "max_tokens"),
    ({"prompt": [1, 2], "logprobs": 21}, "logprobs"),
    ({"prompt": [1, 2], "prompt_logprobs": -1}, "prompt_logprobs"),
    ({"prompt": [1, 2], "seed": 1.5}, "seed"),
    ({"prompt": [1, 2], "stop_token_ids": [400]}, "stop_token_ids"),
    ({"prompt": [1, 2], "stop": [""]}, "stop"),
    ({"prompt": [1, 2], "echo": "yes"}, "echo"),
    ({"prompt": [1, 2], "stream": "yes"}, "stream"),
    ({"prompt": [1, 2], "min_tokens": 3}, "min_tokens"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[1, 2], "text"]}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"max_tokens": 3}, "prompt"),
    ({"prompt": list(range(1, 300))}, "prompt"),
    ({"prompt": CHAT_PROMPT, "max_tokens": 240}, "max_tokens"),
    ({"prompt": [1, 2], "model": 3}, "model"),
])
def test_invalid_completion_params_name_the_field(server, body, param):
    r = _post(server, "/v1/completions", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "BadRequestError" and err["code"] == 400
    assert err["message"]


@pytest.mark.parametrize("body,param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"content": "hi"}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x" * 300}]}, "messages"),
])
def test_invalid_chat_params_name_the_field(server, body, param):
    r = _post(server, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_invalid_json_is_400(server):
    r = _post(server, "/v1/completions", b"{not json")
    assert r.status_code == 400 and "Invalid JSON" in r.json()["error"]["message"]


def test_text_prompts_echo_and_usage(server):
    body = {"prompt": ["what is", "2 + 3"], "n": 2, "max_tokens": 3, "temperature": 0, "echo": True,
            "return_token_ids": True}
    resp = _post(server, "/v1/completions", body).json()
    assert [c["index"] for c in resp["choices"]] == [0, 1, 2, 3]
    assert resp["choices"][0]["text"] == "what is 19 19 19"  # echo prepends a text prompt
    assert resp["choices"][0]["prompt_token_ids"] == [269, 272]
    assert resp["choices"][2]["text"].startswith("2 + 3")
    usage = resp["usage"]
    prompt_tokens = 2 + len(resp["choices"][2]["prompt_token_ids"])
    assert usage["prompt_tokens"] == prompt_tokens  # each prompt counted once, not n times
    assert usage["completion_tokens"] == 12 and usage["total_tokens"] == prompt_tokens + 12


def test_stop_token_ids_and_stop_strings(server):
    base = {"prompt": "what is", "max_tokens": 3, "temperature": 0, "return_token_ids": True}
    ch = _post(server, "/v1/completions", {**base, "stop_token_ids": [285]}).json()["choices"][0]
    assert (ch["finish_reason"], ch["stop_reason"], ch["token_ids"], ch["text"]) == ("stop", 285, [285], "")
    ch = _post(server, "/v1/completions", {**base, "stop": ["9 1"]}).json()["choices"][0]
    assert (ch["finish_reason"], ch["stop_reason"], ch["token_ids"], ch["text"]) == ("stop", "9 1", [285, 285], " 1")


def test_chat_defaults_and_token_ids(server):
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is 2 + 3?"}]}],
            "max_completion_tokens": 5, "temperature": 0, "return_token_ids": True,
            "return_tokens_as_token_ids": True, "logprobs": True}
    resp = _post(server, "/v1/chat/completions", body).json()
    assert resp["prompt_token_ids"] == CHAT_PROMPT
    ch = resp["choices"][0]
    assert len(ch["token_ids"]) == 5 and ch["finish_reason"] == "length"
    assert [e["token"] for e in ch["logprobs"]["content"]] == [f"token_id:{t}" for t in ch["token_ids"]]
    assert all(e["top_logprobs"] == [] for e in ch["logprobs"]["content"])  # top_logprobs defaults to 0
    plain = _post(server, "/v1/chat/completions", {"messages": body["messages"], "max_tokens": 2}).json()
    assert plain["choices"][0]["logprobs"] is None and plain["prompt_token_ids"] is None


def test_tokenize_and_detokenize(server):
    r = _post(server, "/tokenize", {"prompt": "what is", "return_token_strs": True}).json()
    assert r == {"count": 2, "max_model_len": 256, "tokens": [269, 272], "token_strs": ["what", "Ġis"]}
    assert _post(server, "/detokenize", {"tokens": [269, 272]}).json() == {"prompt": "what is"}
    assert _post(server, "/detokenize", {"tokens": [999]}).status_code == 400
    assert _post(server, "/tokenize", {"prompt": 3}).json()["error"]["param"] == "prompt"


def test_metrics_count_requests_and_tokens(server):
    _post(server, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 4, "ignore_eos": True})
    text = httpx.get(f"{server.url}/metrics").text
    for name in ("rft_serve_requests_total", "rft_serve_generation_tokens_total", "rft_serve_batch_size_bucket",
                 "rft_serve_request_latency_seconds_bucket", "rft_serve_prompt_tokens_total",
                 "rft_serve_num_sequences_running", "rft_serve_policy_version"):
        assert name in text, name
    assert metrics_text.value(text, "rft_serve_generation_tokens_total") >= 4
    assert metrics_text.value(text, "rft_serve_requests_total", route="/v1/completions", status="200") >= 1
    assert {"rft_job", "rft_namespace", "rft_role"} <= set(metrics_text.samples(text, "rft_serve_policy_version")[0][0])


def test_health_probes_the_engine():
    lm = load_model(TINY, device="cpu")
    srv = ServerThread(Engine(lm, max_batch_size=2), health_timeout=30).start()
    try:
        srv.engine.last_step_ok = None  # nothing generated yet: /health must generate a token itself
        r = httpx.get(f"{srv.url}/health", timeout=60)
        assert r.status_code == 200 and r.text == ""
        assert srv.engine.last_step_ok is not None
        srv.engine.stop()  # a dead engine is unhealthy even though the HTTP server still answers
        r = httpx.get(f"{srv.url}/health", timeout=60)
        assert r.status_code == 503 and r.json()["error"]["code"] == 503
        r = httpx.post(f"{srv.url}/v1/completions", json={"prompt": [1], "max_tokens": 1}, timeout=60)
        assert r.status_code == 500 and "not running" in r.json()["error"]["message"]
    finally:
        srv.stop()


def test_client_disconnect_cancels_generation(server):
    aborted = server.engine.num_aborted
    body = {"prompt": [269, 272], "max_tokens": 250, "ignore_eos": True, "n": 8}
    with pytest.raises(httpx.ReadTimeout):  # 250 decode steps of 8 rows: about 90 ms on a 2-core VM, 3x the read timeout
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=httpx.Timeout(60, read=0.03))
    deadline = time.monotonic() + 60
    while server.engine.num_running or server.engine.num_waiting:
        assert time.monotonic() < deadline, "the abandoned request kept running"
        time.sleep(0.02)
    assert server.engine.num_aborted == aborted + 8  # every choice dropped unfinished, not run to the end
    assert "rft_serve_aborted_sequences_total" in httpx.get(f"{server.url}/metrics").text
    r = _post(server, "/v1/completions", {"prompt": [269, 272], "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200


def _engine_children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` and that run a multiprocessing-spawned engine."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("mode", [[], ["--no-engine-process"]], ids=["engine-process", "one-process"])
def test_cli_main_serves_and_stops(tmp_path, mode):
    port = free_port()
    cmd = [sys.executable, "-m", "rft_runtime.serve.server", "--model", str(TINY), "--host", "127.0.0.1",
           "--port", str(port), "--served-model-name", "tiny", "--max-batch-size", "4", "--threads", "1",
           "--policy-version", "3", "--max-model-len", "64", "--dtype", "float32", "--kv-cache-dtype", "float16",
           *mode]
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", 120, proc=proc, log=tmp_path / "server.log")
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                       json={"model": "tiny", "prompt": "what is", "max_tokens": 3, "temperature": 0}, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == " 19 19 19"
        assert r.headers["x-policy-version"] == "3"
        # --max-model-len is served and enforced with vLLM's recorded context-overflow answer
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0]["max_model_len"] == 64
        fx = fixture("error_context_overflow")
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=fx["request"], timeout=60)
        want = fx["response"]["error"]
        assert r.status_code == fx["status"] == 400
        assert r.json()["error"] == {**want, "message": want["message"].replace("max_model_len=256",
                                                                                "max_model_len=64")}
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": list(range(5, 60)),
                                                                       "max_tokens": 10}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
        assert "maximum context length is 64 tokens" in r.json()["error"]["message"]
        # the routes that render and read text (chat template, token strings, detokenize)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60, json={
            "model": "tiny", "messages": [{"role": "user", "content": "what is 2 + 3"}], "max_tokens": 3,
            "temperature": 0, "logprobs": True, "top_logprobs": 2})
        assert r.status_code == 200 and len(r.json()["choices"][0]["logprobs"]["content"]) == 3, r.text
        r = httpx.post(f"http://127.0.0.1:{port}/tokenize",
                       json={"model": "tiny", "prompt": "what is", "return_token_strs": True})
        assert r.status_code == 200 and len(r.json()["token_strs"]) == r.json()["count"] > 0, r.text
        r = httpx.post(f"http://127.0.0.1:{port}/detokenize", json={"model": "tiny", "tokens": r.json()["tokens"]})
        assert r.status_code == 200 and r.json()["prompt"] == "what is", r.text
        # the engine runs in its own process by default, in the server's process with --no-engine-process
        children = _engine_children(proc.pid)
        assert len(children) == (0 if mode else 1), children
        # with the engine in its own process the front end never loads torch (it holds the tokenizer
        # only): torch's libraries are mapped in the engine process, not in the server's
        assert maps_torch(proc.pid) == bool(mode)
        assert all(maps_torch(c) for c in children)
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
        log.close()
    text = (tmp_path / "server.log").read_text()
    assert rc == 0, text
    # SIGTERM: the server says when it stopped accepting connections (where a replaced replica's outage starts)
    assert "stopped accepting connections; finishing the requests in flight" in text, text[-3000:]
    assert not any(Path(f"/proc/{c}").exists() for c in children), "the engine process outlived the server"
    assert "engine: 4 sequences at once, KV cache float16 (64 columns, up to 64" in text, text[-3000:]
    if not mode:  # the engine process logs (its logging is set up in the child), its stop included
        assert f"[engine]: engine process {children[0]} (parent {proc.pid})" in text, text[-3000:]
        assert f"[engine]: engine process {children[0]}: stopped" in text, text[-3000:]


@pytest.mark.parametrize("mode", [[], ["--no-engine-process"]], ids=["engine-process", "one-process"])
def test_cli_exits_when_the_model_cannot_be_served(tmp_path, mode):
    """A model the engine cannot load ends the server with its error, in either mode (in process mode
    the model loads in the child, and the front end waits for it before it listens)."""
    cmd = [sys.executable, "-m", "rft_runtime.serve.server", "--model", str(TINY), "--host", "127.0.0.1",
           "--port", str(free_port()), "--threads", "1", "--max-model-len", "100000", *mode]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode != 0
    assert "max_model_len" in r.stderr or "max-model-len" in r.stderr, r.stderr[-2000:]
