"""The engine in a child process (`rft serve`'s default): the same answers as in-process, its metrics, its failures."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from rft_runtime.serve.engine import EngineError
from rft_runtime.serve.procengine import ProcessEngine, served_model
from tests.serve.support import CHAT_PROMPT, TINY, ServerThread, fixture
from tests.serve.test_fixture_shapes import GENERATION_CASES, OUR_EXTRA_TOP_LEVEL, skeleton
from tests.serve.test_streaming import _events
from tests.support import metrics_text


@pytest.fixture(scope="module")
def proc_server():
    engine = ProcessEngine(served_model(str(TINY), None), str(TINY), max_batch_size=8, threads=1,
                           load_kwargs={"device": "cpu"})
    s = ServerThread(engine, health_timeout=120).start()
    yield s
    s.stop()
    assert not engine.alive


@pytest.mark.parametrize("case", GENERATION_CASES)
def test_same_answers_and_shapes_as_in_process(server, proc_server, case):
    fx = fixture(case)
    a = httpx.post(server.url + fx["path"], json=fx["request"], timeout=120).json()
    b = httpx.post(proc_server.url + fx["path"], json=fx["request"], timeout=120).json()
    assert skeleton({k: v for k, v in b.items() if k not in OUR_EXTRA_TOP_LEVEL}) == skeleton(fx["response"])
    for ca, cb in zip(a["choices"], b["choices"]):
        for key in ("text", "token_ids", "finish_reason", "stop_reason", "prompt_logprobs"):
            assert ca.get(key) == cb.get(key), key
        assert (ca["logprobs"] is None) == (cb["logprobs"] is None)


def test_streams_and_errors(proc_server):
    rec = fixture("stream_completions_token_ids_n2")
    r, events = _events(proc_server.url, rec["path"], rec["request"])
    plain = httpx.post(proc_server.url + rec["path"], json={**rec["request"], "stream": False,
                                                             "stream_options": None}, timeout=60).json()
    for choice in plain["choices"]:
        mine = [c for e in events[:-1] for c in e["choices"] if c["index"] == choice["index"]]
        assert [t for c in mine for t in c["token_ids"]] == choice["token_ids"]
    r = httpx.post(proc_server.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 300})
    assert r.status_code == 400
    assert httpx.get(proc_server.url + "/health", timeout=60).status_code == 200


def test_weight_updates_in_the_engine_process(proc_server, tmp_path):
    url = proc_server.url
    body = {"prompt": CHAT_PROMPT, "max_tokens": 4, "temperature": 0}
    before = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
    u = httpx.post(url + "/update_weights_from_disk", json={"model_path": str(TINY), "policy_version": 4}, timeout=120)
    assert u.status_code == 200 and u.json()["policy_version"] == 4 and u.json()["load_format"] == "full"
    after = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert after.headers["x-policy-version"] == "4" and after.json()["choices"][0]["text"] == before["choices"][0]["text"]
    bad = httpx.post(url + "/update_weights_from_disk", json={"model_path": str(tmp_path / "missing")}, timeout=60)
    assert bad.status_code == 400 and bad.json()["success"] is False and bad.json()["policy_version"] == 4


def test_the_engines_metrics_reach_the_front_end(proc_server):
    """The engine observes batch sizes, tokens and its queue in the child; the front end's /metrics shows
    them as soon as the answer that produced them has arrived."""
    url = proc_server.url
    before = httpx.get(url + "/metrics").text
    r = httpx.post(url + "/v1/completions", json={"prompt": [[5, 6, 7], [8, 9]], "max_tokens": 6, "n": 2,
                                                  "temperature": 1.0, "ignore_eos": True}, timeout=60)
    assert r.status_code == 200
    after = httpx.get(url + "/metrics").text
    tokens = [metrics_text.value(t, "rft_serve_generation_tokens_total") or 0 for t in (before, after)]
    steps = [metrics_text.value(t, "rft_serve_batch_size_count") or 0 for t in (before, after)]
    assert tokens[1] - tokens[0] == 4 * 6  # two prompts x n=2 x 6 tokens, nothing else ran meanwhile
    assert steps[1] - steps[0] >= 6
    big = {labels["le"]: v for labels, v in metrics_text.samples(after, "rft_serve_batch_size_bucket")}
    assert big["4.0"] - big["2.0"] >= 1  # some step ran the four sequences together
    assert metrics_text.value(after, "rft_serve_num_sequences_running") == 0
    assert metrics_text.value(after, "rft_serve_num_requests_waiting") == 0


def test_client_disconnect_drops_the_rows_in_the_engine_process(proc_server):
    """The front end's cancel reaches the child, which drops the request's rows at its next iteration
    (answered from the engine thread, a request is found by its id until it is answered)."""
    url = proc_server.url
    aborted = metrics_text.value(httpx.get(url + "/metrics").text, "rft_serve_aborted_sequences_total") or 0
    body = {"prompt": [269, 272], "max_tokens": 250, "ignore_eos": True, "n": 8}
    with pytest.raises(httpx.ReadTimeout):  # 250 decode steps of 8 rows: about 90 ms on a 2-core VM, 3x the read timeout
        httpx.post(url + "/v1/completions", json=body, timeout=httpx.Timeout(60, read=0.03))
    deadline = time.monotonic() + 60
    while True:  # the child reports its counts every half second while it works, and when it answers
        text = httpx.get(url + "/metrics").text
        if (metrics_text.value(text, "rft_serve_aborted_sequences_total") or 0) > aborted:
            break
        assert time.monotonic() < deadline, "the abandoned request kept running"
        time.sleep(0.05)
    assert metrics_text.value(text, "rft_serve_aborted_sequences_total") == aborted + 8  # every choice, unfinished
    r = httpx.post(url + "/v1/completions", json={"prompt": [269, 272], "max_tokens": 2, "temperature": 0}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    assert metrics_text.value(httpx.get(url + "/metrics").text, "rft_serve_num_sequences_running") == 0


def test_an_engine_process_that_cannot_load_fails_the_servers_start():
    engine = ProcessEngine(served_model(str(TINY), None), str(TINY), max_batch_size=2, threads=1,
                           load_kwargs={"device": "cpu", "max_model_len": 100000})
    with pytest.raises(EngineError, match="engine process exited"):
        ServerThread(engine, health_timeout=5).start()
    assert not engine.alive


def test_a_dead_engine_process_fails_requests_and_health():
    engine = ProcessEngine(served_model(str(TINY), None), str(TINY), max_batch_size=2, threads=1,
                           load_kwargs={"device": "cpu"})
    s = ServerThread(engine, health_timeout=5).start()
    try:
        assert httpx.get(s.url + "/health", timeout=30).status_code == 200
        os.kill(engine._proc.pid, signal.SIGKILL)
        engine._proc.join(30)
        deadline = time.monotonic() + 30
        while engine.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        assert httpx.get(s.url + "/health", timeout=30).status_code == 503
        r = httpx.post(s.url + "/v1/completions", json={"prompt": [5, 6], "max_tokens": 2}, timeout=30)
        assert r.status_code >= 500 and "engine" in r.json()["error"]["message"]
    finally:
        s.stop()


def test_a_half_precision_kv_cache_in_the_engine_process(tmp_path):
    """``kv_cache_dtype`` (``rft serve --kv-cache-dtype``) reaches the engine process, whose log says the
    cache's type, and the engine serves with it: the same greedy tokens as with the model's float32 cache
    here, its logprobs rounded by little."""
    log_file = tmp_path / "engine.log"
    engine = ProcessEngine(served_model(str(TINY), None), str(TINY), max_batch_size=2, threads=1,
                           load_kwargs={"device": "cpu"}, kv_cache_dtype="float16", log_file=str(log_file))
    s = ServerThread(engine, health_timeout=120).start()
    body = {"prompt": CHAT_PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True, "logprobs": 0}
    try:
        half = httpx.post(s.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["logprobs"]
    finally:
        s.stop()
    assert "KV cache float16" in log_file.read_text()
    from tests.serve.support import start_server

    ref = start_server()
    try:
        full = httpx.post(ref.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["logprobs"]
    finally:
        ref.stop()
    assert half["tokens"] == full["tokens"]
    diffs = [abs(a - b) for a, b in zip(half["token_logprobs"], full["token_logprobs"])]
    assert 0 < max(diffs) < 1e-2


def test_graph_iterations_reach_the_front_end():
    """Decode iterations run in the CUDA graphs' fixed shape (uncaptured here, on the CPU) are counted in
    the child and shown by the front end: every iteration but the one that prefilled."""
    engine = ProcessEngine(served_model(str(TINY), None), str(TINY), max_batch_size=4, threads=1,
                           load_kwargs={"device": "cpu"}, cuda_graphs="uncaptured", pacing="never")
    s = ServerThread(engine, health_timeout=120).start()
    try:
        r = httpx.post(s.url + "/v1/completions", json={"prompt": [269, 272], "max_tokens": 8, "ignore_eos": True},
                       timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
        text = httpx.get(s.url + "/metrics").text
    finally:
        s.stop()
    assert metrics_text.value(text, "rft_serve_batch_size_count") == 8
    assert metrics_text.value(text, "rft_serve_graph_iterations_total") == 7
    assert metrics_text.value(text, "rft_serve_graph_captures_total") == 1
    assert metrics_text.value(text, "rft_serve_engine_pauses_total") == 0
