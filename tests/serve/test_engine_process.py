"""``rft serve --engine-process``: the engine in a child process gives the same answers as in-process."""

from __future__ import annotations

import httpx
import pytest

from rft_runtime.serve.procengine import ProcessEngine, served_model
from tests.serve.support import CHAT_PROMPT, TINY, ServerThread, fixture
from tests.serve.test_fixture_shapes import GENERATION_CASES, OUR_EXTRA_TOP_LEVEL, skeleton
from tests.serve.test_streaming import _events


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
