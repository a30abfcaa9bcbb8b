"""Attacks on the data plane's authentication: every route of the coordinator, the reward server and
the builtin inference server, real servers on loopback, each requiring job A's token.

Each test fails if the attack succeeds: a call without the token, with a wrong one or with another
job's token must be answered 401 (a JSON error, never echoing the token) before any handler runs;
``/health`` and ``/metrics`` stay open; a server on a cluster without a token does not start.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import httpx
import pytest

from rft_runtime import auth
from rft_runtime.rollout.coordinator_client import CoordinatorClient, CoordinatorRejected
from tests.support.ports import free_port
from tests.support.servers import wait_healthy

from .auth_servers import (
    TOKEN_A,
    TOKEN_B,
    Route,
    coordinator_server,
    data_plane,
    inference_server,
    reward_server,
    routes_of,
)

FACTORIES = {"coordinator": coordinator_server, "reward": reward_server, "inference": inference_server}
# Every data-plane route the servers registered when this was written: a route that disappears (or is
# renamed) must be noticed here; new ones are attacked automatically (see test_every_route...).
EXPECTED = {
    "coordinator": {"POST /v1/lease", "POST /v1/episodes", "POST /v1/release", "GET /v1/status"},
    "reward": {"POST /v1/score"},
    "inference": {"POST /v1/completions", "POST /v1/chat/completions", "GET /v1/models", "POST /tokenize",
                  "POST /detokenize", "POST /update_weights_from_disk", "POST /update_weights_from_archive",
                  "GET /get_policy_version"},
}
BAD_CREDENTIALS = {
    "none": {},
    "bearer without token": {"Authorization": "Bearer"},
    "wrong token": {"Authorization": "Bearer not-the-token"},
    "other job's token": {"Authorization": f"Bearer {TOKEN_B}"},
    "token without scheme": {"Authorization": TOKEN_A},
    "token as basic auth": {"Authorization": f"Basic {TOKEN_A}"},
    "token prefix": {"Authorization": f"Bearer {TOKEN_A[:-1]}"},
    "token plus suffix": {"Authorization": f"Bearer {TOKEN_A}x"},
    "token in another header": {"X-Api-Key": TOKEN_A},
}


@pytest.fixture(scope="module")
def servers():
    started = {}
    try:
        for name, factory in FACTORIES.items():
            started[name] = factory()
        yield {name: (f"http://127.0.0.1:{t.port}", routes_of(name, app)) for name, (t, app) in started.items()}
    finally:
        for t, _ in started.values():
            t.stop()


def _call(url: str, route: Route, headers: dict[str, str]) -> httpx.Response:
    body = {"worker_id": "attacker", "max_tasks": 1000, "episodes": [], "lease_ids": [], "samples": [],
            "model": "tiny", "prompt": "hi", "max_tokens": 1, "model_path": "/", "policy_version": 99}
    with httpx.Client(timeout=60) as h:
        return h.request(route.method, url + route.path, headers=headers, json=body)


def test_the_servers_register_the_expected_data_plane_routes(servers) -> None:
    for name, (_, routes) in servers.items():
        assert EXPECTED[name] <= {f"{r.method} {r.path}" for r in data_plane(routes)}, name


@pytest.mark.parametrize("credential", sorted(BAD_CREDENTIALS))
def test_every_data_plane_route_refuses_a_bad_credential(servers, credential: str) -> None:
    attacked = 0
    for url, routes in servers.values():
        for route in data_plane(routes):
            r = _call(url, route, BAD_CREDENTIALS[credential])
            assert r.status_code == 401, f"{route} answered {r.status_code} to {credential}: {r.text[:200]}"
            err = r.json()["error"]
            assert err["type"] == "Unauthorized" and "Bearer" in err["message"]
            assert TOKEN_A not in r.text and TOKEN_B not in r.text
            attacked += 1
    assert attacked >= sum(len(v) for v in EXPECTED.values())


def test_the_right_token_reaches_every_handler(servers) -> None:
    """Not vacuous: with job A's token no route answers 401 (the handlers run and judge the body)."""
    for url, routes in servers.values():
        for route in data_plane(routes):
            r = _call(url, route, {"Authorization": f"Bearer {TOKEN_A}"})
            assert r.status_code != 401, f"{route} refused the right token: {r.text[:200]}"


def test_unknown_paths_need_the_token_too(servers) -> None:
    for url, _ in servers.values():
        for path in ("/v1/nope", "/admin", "/health/../v1/status", "//v1/status"):
            r = httpx.get(url + path)
            assert r.status_code == 401, (url, path, r.status_code)


def test_health_and_metrics_stay_open(servers) -> None:
    for name, (url, routes) in servers.items():
        opened = [r for r in routes if r.path in auth.OPEN_PATHS]
        assert {r.path for r in opened} == {"/health", "/metrics"}, name
        for route in opened:
            r = httpx.request(route.method, url + route.path, timeout=60)
            assert r.status_code == 200, (name, route, r.status_code)
            assert TOKEN_A not in r.text


def test_an_unauthenticated_lease_gets_no_task_and_leaves_the_queue_alone() -> None:
    server, _ = coordinator_server()  # its own: the module's coordinator has been leased from
    try:
        url = f"http://127.0.0.1:{server.port}"
        for headers in BAD_CREDENTIALS.values():
            r = httpx.post(url + "/v1/lease", json={"worker_id": "attacker", "max_tasks": 100}, headers=headers)
            assert r.status_code == 401 and "secret-task" not in r.text and "ground_truth" not in r.text
        status = httpx.get(url + "/v1/status", headers={"Authorization": f"Bearer {TOKEN_A}"}).json()
        assert status["tasks"]["queued"] == 1 and status["tasks"]["leased"] == 0, status
    finally:
        server.stop()


def test_an_unauthenticated_weight_load_does_not_change_the_policy(servers, tmp_path) -> None:
    url, _ = servers["inference"]
    r = httpx.post(url + "/update_weights_from_disk", json={"model_path": str(tmp_path), "policy_version": 7})
    assert r.status_code == 401
    v = httpx.get(url + "/get_policy_version", headers={"Authorization": f"Bearer {TOKEN_A}"}).json()
    assert v == {"policy_version": 0}, v


async def test_our_coordinator_client_sends_the_env_token_and_another_jobs_is_refused(servers, monkeypatch) -> None:
    url, _ = servers["coordinator"]
    monkeypatch.setenv(auth.JOB_TOKEN_ENV, TOKEN_A)
    async with CoordinatorClient(url, deadline_s=2.0) as c:
        assert (await c.status()).tasks is not None
    monkeypatch.setenv(auth.JOB_TOKEN_ENV, TOKEN_B)
    async with CoordinatorClient(url, deadline_s=2.0) as c:
        with pytest.raises(CoordinatorRejected) as info:
            await c.status()
    assert TOKEN_B not in str(info.value) and TOKEN_A not in str(info.value)


def test_a_refused_call_logs_no_token(servers, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    for url, routes in servers.values():
        for route in data_plane(routes)[:2]:
            _call(url, route, {"Authorization": f"Bearer {TOKEN_B}"})
    assert TOKEN_A not in caplog.text and TOKEN_B not in caplog.text


def test_a_server_on_a_cluster_without_a_token_refuses_to_start() -> None:
    with pytest.raises(auth.MissingToken, match="RFT_JOB_TOKEN") as info:
        auth.server_token("coordinator", {"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert "coordinator" in str(info.value)
    assert auth.server_token("coordinator", {"KUBERNETES_SERVICE_HOST": "10.0.0.1", auth.JOB_TOKEN_ENV: "t"}) == "t"
    assert auth.server_token("coordinator", {}) is None  # off a cluster: open, with a warning


@pytest.mark.parametrize("argv", [["reward", "--config", "/nonexistent.json"],
                                  ["serve", "--model", "/nonexistent"]])
def test_the_server_clis_refuse_to_start_on_a_cluster_without_a_token(argv: list[str], tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != auth.JOB_TOKEN_ENV}
    env.update({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "RFT_BIND_HOST": "127.0.0.1"})
    proc = subprocess.run([sys.executable, "-m", "rft_runtime.cli", *argv, "--port", "0"], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "RFT_JOB_TOKEN" in proc.stderr


async def test_the_inference_client_sends_the_env_token(servers, monkeypatch) -> None:
    from rft_runtime.rollout.client import InferenceClient
    from rft_runtime.rollout.sampling import SamplingParams

    url, _ = servers["inference"]
    monkeypatch.setenv(auth.JOB_TOKEN_ENV, TOKEN_A)
    async with InferenceClient(url, "tiny") as client:
        out = await client.complete([1, 2, 3], n=1, sampling=SamplingParams(max_tokens=2))
    assert len(out) == 1
    monkeypatch.setenv(auth.JOB_TOKEN_ENV, TOKEN_B)
    async with InferenceClient(url, "tiny") as client:
        with pytest.raises(Exception, match="401") as info:
            await client.complete([1, 2, 3], n=1, sampling=SamplingParams(max_tokens=2))
    assert TOKEN_B not in str(info.value)


@pytest.mark.parametrize("role", ["serve", "reward"])
def test_the_server_clis_on_a_cluster_require_the_token_from_the_environment(role: str, tmp_path) -> None:
    """The entry points the operator's pods run, as processes with a pod's environment."""
    from rft_api.job import validate_spec
    from tests.support.runtime_config import local_config

    from .auth_servers import TINY

    port = free_port()
    env = {**os.environ, "KUBERNETES_SERVICE_HOST": "10.0.0.1", auth.JOB_TOKEN_ENV: TOKEN_A, "HF_HUB_OFFLINE": "1"}
    if role == "serve":
        args, path = ["serve", "--model", str(TINY), "--served-model-name", "tiny", "--threads", "1"], "/v1/models"
    else:
        spec = validate_spec({"model": {"base": "builtin:tiny"}, "dataset": {"train": {"builtin": "arithmetic"}},
                              "evaluator": {"builtin": "math"}})
        cfg = local_config("sec", spec, inference=["http://127.0.0.1:9"], checkpoints=tmp_path / "c",
                           output=tmp_path / "o", reward=f"http://127.0.0.1:{port}")
        (tmp_path / "config.json").write_text(cfg.to_json())
        args, path = ["reward", "--config", str(tmp_path / "config.json")], "/v1/score"
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "rft_runtime.cli", *args, "--host", "127.0.0.1", "--port",
                             str(port)], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url + "/health", 180, proc=proc, log=tmp_path / "server.log", what=f"rft {role} /health")
        method = "GET" if path == "/v1/models" else "POST"
        body = None if method == "GET" else {"samples": [{"id": "a", "sample": {"text": "4"}, "item": {"ground_truth": "4"}}]}
        for headers in BAD_CREDENTIALS.values():
            assert httpx.request(method, url + path, json=body, headers=headers).status_code == 401
        ok = httpx.request(method, url + path, json=body, headers={"Authorization": f"Bearer {TOKEN_A}"})
        assert ok.status_code == 200, ok.text[:300]
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    assert TOKEN_A not in (tmp_path / "server.log").read_text()
