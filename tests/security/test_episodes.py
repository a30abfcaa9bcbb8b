"""Attacks on the coordinator's episode intake over real HTTP on loopback: forged episodes (no
lease, another worker's lease, an expired lease, a wrong prompt), poisoned ones (NaN/inf rewards,
out-of-vocabulary ids, over-length), oversized bodies and ``max_tasks`` abuse. Each test fails if
the attack gets an episode accepted (or the trainer-side batch crashes)."""

from __future__ import annotations

import json
import math

import httpx
import pytest

from rft_runtime.coordinator import Coordinator, CoordinatorConfig, CoordinatorService, EpisodeLimits
from rft_runtime.coordinator.core import max_body_bytes
from rft_runtime.coordinator.server import CoordinatorServer
from rft_runtime.trainer.batch import BatchError, collate, sequences_from_groups
from rft_runtime.types import Episode

from .attacks import episode, tasks

LIMITS = EpisodeLimits(vocab_size=100, max_prompt_tokens=8, max_model_len=24)
LEASE_S = 30.0


@pytest.fixture
def served():
    cfg = CoordinatorConfig(n=2, lease_timeout_s=LEASE_S, sampling={"max_tokens": 4}, limits=LIMITS,
                            max_lease_tasks=3)
    svc = CoordinatorService(Coordinator(cfg))
    server = CoordinatorServer(svc, "127.0.0.1", 0).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as h:
            yield svc, h
    finally:
        server.stop()


def _lease(h: httpx.Client, worker: str, k: int = 1) -> list[dict]:
    r = h.post("/v1/lease", json={"worker_id": worker, "max_tasks": k})
    assert r.status_code == 200, r.text
    return r.json()["tasks"]


def _post(h: httpx.Client, worker: str, leases: list[str], eps: list[dict]) -> httpx.Response:
    return h.post("/v1/episodes", json={"worker_id": worker, "lease_ids": leases, "episodes": eps})


def _accepted(svc: CoordinatorService) -> int:
    return svc.counters()["episodes_accepted"]


def test_honest_worker_is_accepted(served):
    svc, h = served
    (key,) = svc.submit(tasks(1), seeds=[0])
    (g,) = _lease(h, "w1")
    r = _post(h, "w1", [g["lease_id"]], [episode(key, 0), episode(key, 1)])
    assert r.status_code == 200 and len(r.json()["accepted"]) == 2


def test_episode_for_a_task_nobody_leased_is_refused(served):
    svc, h = served
    (key,) = svc.submit(tasks(1), seeds=[0])
    r = _post(h, "attacker", [], [episode(key, 0, reward=1.0), episode(key, 1, reward=1.0)])
    assert r.status_code == 409 and r.json()["refused"] == [f"{key}:0", f"{key}:1"]
    assert "not leased" in r.json()["error"]["message"]
    assert _accepted(svc) == 0
    status = h.get("/v1/status").json()
    assert status["counters"]["episodes_refused_lease"] == 2


def test_episode_on_another_workers_lease_is_refused(served):
    svc, h = served
    (key, other) = svc.submit(tasks(2), seeds=[0, 1])
    (g1,) = _lease(h, "w1")
    (g2,) = _lease(h, "w2")
    assert g1["task_key"] == key
    # w2 holds a lease of its own, but not the one for `key`
    r = _post(h, "w2", [g2["lease_id"]], [episode(key, 0), episode(key, 1)])
    assert r.status_code == 409 and _accepted(svc) == 0


def test_spoofed_worker_id_without_the_lease_id_is_refused(served):
    svc, h = served
    (key,) = svc.submit(tasks(1), seeds=[0])
    (g,) = _lease(h, "w1")
    # The attacker knows the worker id (it is in logs) and guesses the lease id's visible prefix.
    guessed = g["lease_id"].rsplit("-", 1)[0] + "-" + "0" * 32
    for held in ([], [guessed]):
        r = _post(h, "w1", held, [episode(key, 0), episode(key, 1)])
        assert r.status_code == 409
    assert _accepted(svc) == 0


def test_episode_after_the_lease_expired_is_refused():
    clock = [0.0]
    coord = Coordinator(CoordinatorConfig(n=1, lease_timeout_s=5.0), clock=lambda: clock[0])
    (key,) = coord.submit(tasks(1), seeds=[0])
    (g,) = coord.lease("w1", 1).tasks
    clock[0] += 5.5
    res = coord.post_episodes("w1", [episode(key, 0)], [g.lease_id])
    assert res.refused == [f"{key}:0"] and not res.accepted
    assert coord.counters["episodes_refused_lease"] == 1


def test_released_lease_cannot_post(served):
    svc, h = served
    (key,) = svc.submit(tasks(1), seeds=[0])
    (g,) = _lease(h, "w1")
    assert h.post("/v1/release", json={"lease_ids": [g["lease_id"]]}).json()["released"] == 1
    assert _post(h, "w1", [g["lease_id"]], [episode(key, 0)]).status_code == 409


def test_episode_with_a_different_prompt_than_its_group_is_refused(served):
    svc, h = served
    (key,) = svc.submit(tasks(1), seeds=[0])
    (g,) = _lease(h, "w1")
    assert _post(h, "w1", [g["lease_id"]], [episode(key, 0, prompt=[1, 2])]).status_code == 200
    r = _post(h, "w1", [g["lease_id"]], [episode(key, 1, prompt=[7, 7, 7])])
    assert r.status_code == 422 and "prompt_ids differ" in r.json()["error"]["message"]
    assert _accepted(svc) == 1


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_reward_in_the_body_is_refused(served, literal):
    svc, h = served
    (key,) = svc.submit(tasks(1), seeds=[0])
    (g,) = _lease(h, "w1")
    body = json.dumps({"worker_id": "w1", "lease_ids": [g["lease_id"]],
                       "episodes": [episode(key, 0, reward=0.5)]}).replace("0.5", literal)
    r = h.post("/v1/episodes", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "finite" in r.json()["error"]["message"]
    assert _accepted(svc) == 0


@pytest.mark.parametrize("reward", [math.nan, 1e300, -2e9])
def test_a_non_finite_or_out_of_scale_reward_in_process_is_invalid(reward):
    """Beyond ±1e9 a reward's advantage could overflow the learner's float32: refused like NaN."""
    coord = Coordinator(CoordinatorConfig(n=1, lease_timeout_s=5.0))
    (key,) = coord.submit(tasks(1), seeds=[0])
    (g,) = coord.lease("w", 1).tasks
    res = coord.post_episodes("w", [episode(key, 0, reward=reward)], [g.lease_id])
    assert res.invalid and "finite and within ±1e+09" in res.errors[0] and not res.accepted
    res = coord.post_episodes("w", [episode(key, 0, reward=1e9)], [g.lease_id])
    assert res.accepted and not res.invalid


def test_out_of_vocabulary_token_ids_are_refused(served):
    svc, h = served
    (key,) = svc.submit(tasks(1), seeds=[0])
    (g,) = _lease(h, "w1")
    for ep, bad in ((episode(key, 0, response=[10**9]), 10**9), (episode(key, 0, prompt=[1, 100]), 100)):
        r = _post(h, "w1", [g["lease_id"]], [ep])
        assert r.status_code == 422 and "outside the vocabulary" in r.json()["error"]["message"]
        assert f"holds token id {bad}," in r.json()["error"]["message"]  # the first id outside, named
    assert _accepted(svc) == 0 and svc.counters()["episodes_dropped_invalid"] == 2


@pytest.mark.parametrize("kind", ["response", "prompt", "context"])
def test_over_length_episodes_are_refused(served, kind):
    svc, h = served
    (key,) = svc.submit(tasks(1), seeds=[0])
    (g,) = _lease(h, "w1")
    ep = {"response": episode(key, 0, response=[3] * 5),  # > sampling max_tokens 4
          "prompt": episode(key, 0, prompt=[1] * 9),  # > max_prompt_tokens 8
          }.get(kind)
    if kind == "context":  # a multi-turn chain whose last step exceeds the context of 24
        ep = episode(key, 0, prompt=[1] * 8, response=[3] * 4)
        ep["trajectories"][0]["steps"].append({
            "prompt_ids": [1] * 8 + [3] * 4 + [5] * 10, "response_ids": [3] * 4, "logprobs": [-0.1] * 4,
            "policy_version": 0})
    r = _post(h, "w1", [g["lease_id"]], [ep])
    assert r.status_code == 422 and _accepted(svc) == 0, r.text


def test_oversized_body_is_refused_before_parsing(served):
    svc, h = served
    cap = max_body_bytes(svc.config)
    assert cap < 16 * 1024 * 1024  # derived from the limits, far below the former 256 MiB
    r = h.post("/v1/episodes", content=b'{"worker_id": "' + b"x" * (cap + 10) + b'"}',
               headers={"Content-Type": "application/json"})
    assert r.status_code == 413


def test_max_tasks_abuse_is_capped(served):
    svc, h = served
    svc.submit(tasks(10), seeds=list(range(10)))
    got = _lease(h, "greedy", 10**9)
    assert len(got) == 3  # max_lease_tasks; the ground truths of the other tasks stay unleased


def test_missing_lease_ids_names_the_field(served):
    svc, h = served
    (key,) = svc.submit(tasks(1), seeds=[0])
    _lease(h, "w1")
    r = h.post("/v1/episodes", json={"worker_id": "w1", "episodes": [episode(key, 0)]})
    assert r.status_code == 400 and r.json()["error"]["field"] == "lease_ids"


class _G:
    def __init__(self, key: str, eps: list[Episode]) -> None:
        self.key, self.episodes = key, eps


def test_trainer_batch_refuses_poison_instead_of_crashing():
    """Defence in depth: even if a poisoned episode got past the coordinator, batch building drops
    it (with a reason) rather than crashing the trainer step or indexing outside the embedding."""
    good = Episode.model_validate(episode("t@0", 0))
    nan = Episode.model_validate(episode("t@0", 1, reward=math.nan))
    oov = Episode.model_validate(episode("t@0", 2, response=[10**6]))
    long = Episode.model_validate(episode("t@0", 3, response=[3] * 50))
    dropped: list[str] = []
    seqs = sequences_from_groups([_G("t@0", [good, nan, oov, long])], vocab_size=100, max_len=24,
                                 on_drop=dropped.append)
    assert [s.episode_id for s in seqs] == ["t@0:0"] and len(dropped) == 3
    batch = collate(seqs, vocab_size=100)
    assert int(batch.input_ids.max()) < 100
    with pytest.raises(BatchError, match="vocabulary"):
        collate(sequences_from_groups([_G("t@0", [oov])]), vocab_size=100)


def test_lease_ids_are_unguessable():
    coord = Coordinator(CoordinatorConfig(n=1, lease_timeout_s=5.0))
    coord.submit(tasks(2), seeds=[0, 1])
    a, b = (t.lease_id for t in coord.lease("w", 2).tasks)
    assert len(a.rsplit("-", 1)[1]) == 32 and a.rsplit("-", 1)[1] != b.rsplit("-", 1)[1]
