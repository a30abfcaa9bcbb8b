"""The coordinator API's messages (coordinator/wire.py): the JSON they read and write is the API's,
each side parses once and a message that does not fit names its field."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from aiohttp import web

from rft_runtime.coordinator.server import AppThread
from rft_runtime.coordinator.wire import (
    CoordinatorStatus,
    LeaseGrant,
    LeaseResponse,
    PostEpisodesRequest,
    PostEpisodesResponse,
    ReleaseRequest,
    WireError,
)
from rft_runtime.rollout.coordinator_client import CoordinatorClient, CoordinatorProtocolError, CoordinatorRejected
from rft_runtime.rollout.posting import EpisodePoster

# An exchange as the untyped API wrote it (field names and shapes are the contract between versions).
LEGACY_LEASE = {
    "done": False, "finished": False, "policy_version": 3, "lease_timeout_s": 60.0,
    "tasks": [{"lease_id": "ab12-1-" + "0" * 32, "task_key": "t0@7", "task": {"task_id": "t0", "prompt": "q"},
               "n": 4, "seed": 123, "sampling": {"max_tokens": 16, "temperature": 1.0}, "policy_version": 3,
               "purpose": "train", "deadline_in_s": 60.0}],
}
LEGACY_POST = {"accepted": ["t0@7:0"], "duplicate": [], "stale": [], "unknown": [], "refused": [], "invalid": [],
               "errors": []}
LEGACY_STATUS = {"done": False, "policy_version": 3, "mode": "on-policy", "max_staleness": 0,
                 "tasks": {"queued": 1, "leased": 2, "complete": 0}, "counters": {"leases_granted": 2}}


@pytest.mark.parametrize("model, legacy", [(LeaseResponse, LEGACY_LEASE), (PostEpisodesResponse, LEGACY_POST),
                                           (CoordinatorStatus, LEGACY_STATUS)])
def test_a_legacy_answer_parses_and_is_written_back_unchanged(model, legacy):
    assert json.loads(model.parse(legacy).json_bytes()) == legacy


def test_the_coordinator_writes_the_apis_field_names(coord, episode, tasks):
    (key,) = coord.submit(tasks(1), seeds=[5])
    out = json.loads(coord.lease("w", 1).json_bytes())
    assert set(out) == set(LEGACY_LEASE)
    (g,) = out["tasks"]
    assert set(g) == set(LEGACY_LEASE["tasks"][0]) and g["sampling"] == {"max_tokens": 4}  # unset fields left out
    res = json.loads(coord.post_episodes("w", [episode(key, 0)], [g["lease_id"]]).json_bytes())
    assert res == {**LEGACY_POST, "accepted": [f"{key}:0"]}  # no "error" in a 200's body
    assert set(json.loads(coord.status().json_bytes())) == set(LEGACY_STATUS)


def test_an_older_coordinator_that_does_not_say_finished_means_finished():
    assert LeaseResponse.parse({k: v for k, v in LEGACY_LEASE.items() if k != "finished"}).finished is True


@pytest.mark.parametrize("n", [0, -2, "4", 1.5, None])
def test_a_grant_without_a_usable_n_is_refused_once_at_the_boundary(n):
    bad = {**LEGACY_LEASE, "tasks": [{**LEGACY_LEASE["tasks"][0], "n": n}]}
    with pytest.raises(WireError, match=r"^tasks\.0\.n: ") as info:
        LeaseResponse.parse(bad)
    assert info.value.field == "tasks"


def test_request_messages_name_the_field_in_words():
    with pytest.raises(WireError, match="^lease_ids must be the list of lease ids the poster holds$"):
        PostEpisodesRequest.parse({"worker_id": "w", "episodes": [], "lease_ids": ["a", 3]})
    with pytest.raises(WireError, match="^reason must be a string$"):
        ReleaseRequest.parse({"lease_ids": [], "reason": 7})
    with pytest.raises(WireError, match="^body must be a JSON object$") as info:
        ReleaseRequest.parse([])
    assert info.value.field is None
    # the episodes are the coordinator's to check, one by one: the envelope takes any JSON values
    assert PostEpisodesRequest.parse({"worker_id": "w", "lease_ids": [], "episodes": [1, "x", {}]}).episodes == [
        1, "x", {}]


async def test_bad_bodies_are_answered_400_naming_the_field(served):
    _, server = served
    async with httpx.AsyncClient(base_url=server.url) as h:
        for path, body, field, words in [
            ("/v1/lease", [1], None, "body must be a JSON object"),
            ("/v1/lease", {"max_tasks": 1}, "worker_id", "worker_id must be a non-empty string"),
            ("/v1/episodes", {"worker_id": "w", "episodes": []}, "lease_ids", "lease_ids must be the list"),
            ("/v1/release", {"lease_ids": "l1"}, "lease_ids", "lease_ids must be a list of strings"),
        ]:
            r = await h.post(path, json=body)
            assert r.status_code == 400 and r.json()["error"]["field"] == field, (path, r.text)
            assert r.json()["error"]["message"].startswith(words)
        assert (await h.get("/health")).json() == {"ok": True}


async def test_a_release_over_http_answers_how_many_were_live(served, tasks):
    svc, server = served
    svc.submit(tasks(2), seeds=[0, 1])
    async with CoordinatorClient(server.url) as c:
        grants = (await c.lease("w", 2)).tasks
        assert all(isinstance(g, LeaseGrant) for g in grants)
        assert await c.release([g.lease_id for g in grants] + ["gone"], "engine down") == 2
        assert (await c.status()).tasks.queued == 2


class _Fake:
    """A server answering ``/v1/lease`` and ``/v1/episodes`` with fixed bodies and statuses."""

    def __init__(self, lease: dict, episodes: tuple[int, dict]) -> None:
        async def lease_route(request: web.Request) -> web.Response:
            return web.json_response(lease)

        async def episodes_route(request: web.Request) -> web.Response:
            self.posts += 1
            return web.json_response(episodes[1], status=episodes[0])

        app = web.Application()
        app.router.add_post("/v1/lease", lease_route)
        app.router.add_post("/v1/episodes", episodes_route)
        self.posts = 0
        self.server = AppThread(app)

    def __enter__(self) -> str:
        self.server.start()
        return f"http://127.0.0.1:{self.server.port}"

    def __exit__(self, *exc: object) -> None:
        self.server.stop()


async def test_an_answer_that_does_not_fit_is_a_protocol_error():
    with _Fake({"done": False, "tasks": []}, (200, {})) as url:
        async with CoordinatorClient(url, deadline_s=2.0) as c:
            with pytest.raises(CoordinatorProtocolError, match="not a LeaseResponse: policy_version"):
                await c.lease("w", 1)
            with pytest.raises(CoordinatorProtocolError, match="not a PostEpisodesResponse"):
                await c.post_episodes("w", [{"id": "k:0"}], ["l"])


async def test_a_rejection_without_outcomes_fails_every_task_of_the_post(episode):
    """A 400 (or 413...) says nothing about single episodes: no task of the post may take it for an
    answer with nothing accepted."""
    error = {"error": {"message": "lease_ids must be the list of lease ids the poster holds", "field": "lease_ids"}}
    fake = _Fake(LEGACY_LEASE, (400, error))
    with fake as url:
        async with CoordinatorClient(url, deadline_s=2.0) as c:
            poster = EpisodePoster(c, "w")
            results = await asyncio.gather(*(poster.post([episode(f"k{j}", 0)], f"l{j}") for j in range(3)),
                                           return_exceptions=True)
            await poster.aclose()
    assert all(isinstance(r, CoordinatorRejected) and r.status == 400 and "lease_ids" in str(r) for r in results)
    assert fake.posts == poster.requests
