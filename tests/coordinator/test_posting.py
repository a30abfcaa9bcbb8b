"""Coalesced episode posts (rollout/posting.py) against the real coordinator over HTTP."""

from __future__ import annotations

import asyncio

import pytest

from rft_runtime.rollout.coordinator_client import CoordinatorClient, CoordinatorRejected, CoordinatorUnavailable
from rft_runtime.rollout.posting import EpisodePoster


async def _leased(svc, c, tasks, k):
    keys = svc.submit(tasks(k), seeds=list(range(k)))
    grants = (await c.lease("w", k)).tasks
    assert [g.task_key for g in grants] == keys
    return grants


async def test_tasks_finishing_together_go_in_one_post_and_each_gets_its_own_outcomes(served, episode, tasks):
    svc, server = served
    async with CoordinatorClient(server.url) as c:
        grants = await _leased(svc, c, tasks, 4)
        poster = EpisodePoster(c, "w")
        # the last task posts under a lease it does not hold: coalescing must not let it ride on the
        # other tasks' leases
        leases = [g.lease_id for g in grants[:3]] + ["not-a-lease"]
        results = await asyncio.gather(*(poster.post([episode(g.task_key, i) for i in range(2)], lease)
                                         for g, lease in zip(grants, leases)), return_exceptions=True)
        await poster.aclose()
    assert poster.requests == 1
    for g, res in zip(grants[:3], results[:3]):
        assert res.accepted == [f"{g.task_key}:0", f"{g.task_key}:1"]
        assert not res.refused and not res.errors
    # the refused task fails as its own post would have (409), naming its own episode
    refused = results[3]
    assert isinstance(refused, CoordinatorRejected) and refused.status == 409
    assert repr(f"{grants[3].task_key}:0") in str(refused) and "live lease" in str(refused)
    assert refused.body["accepted"] == [] and refused.body["refused"] == [f"{grants[3].task_key}:{i}" for i in range(2)]
    st = svc.status()
    assert st.tasks.complete == 3 and st.counters["episodes_accepted"] == 6


async def test_a_post_over_the_byte_budget_goes_alone(served, episode, tasks):
    svc, server = served
    async with CoordinatorClient(server.url) as c:
        grants = await _leased(svc, c, tasks, 3)
        poster = EpisodePoster(c, "w", coalesce_bytes=1)
        results = await asyncio.gather(*(poster.post([episode(g.task_key, i) for i in range(2)], g.lease_id)
                                         for g in grants))
    assert poster.requests == 3
    assert [len(r.accepted) for r in results] == [2, 2, 2]


async def test_tasks_finishing_during_a_post_wait_for_the_next(served, episode, tasks):
    svc, server = served
    async with CoordinatorClient(server.url) as c:
        grants = await _leased(svc, c, tasks, 3)
        poster = EpisodePoster(c, "w")
        first = asyncio.create_task(poster.post([episode(grants[0].task_key, i) for i in range(2)],
                                                grants[0].lease_id))
        while poster.requests == 0:  # the first post is on its way
            await asyncio.sleep(0)
        rest = await asyncio.gather(*(poster.post([episode(g.task_key, i) for i in range(2)], g.lease_id)
                                      for g in grants[1:]))
        assert len((await first).accepted) == 2
    assert poster.requests == 2 and [len(r.accepted) for r in rest] == [2, 2]


async def test_a_cancelled_task_is_left_out_of_the_post(served, episode, tasks):
    svc, server = served
    async with CoordinatorClient(server.url) as c:
        grants = await _leased(svc, c, tasks, 2)
        poster = EpisodePoster(c, "w")
        kept, dropped = (asyncio.create_task(poster.post([episode(g.task_key, i) for i in range(2)],
                                                         g.lease_id)) for g in grants)
        await asyncio.sleep(0)  # both are queued; the sender has not run
        dropped.cancel()
        assert len((await kept).accepted) == 2
        with pytest.raises(asyncio.CancelledError):
            await dropped
    assert poster.requests == 1
    assert svc.status().tasks.model_dump() == {"queued": 0, "leased": 1, "complete": 1}


async def test_a_failed_post_fails_every_task_in_it(episode):
    async with CoordinatorClient("http://127.0.0.1:9", deadline_s=0.3) as c:
        poster = EpisodePoster(c, "w")
        results = await asyncio.gather(*(poster.post([episode(f"k{j}", 0)], f"l{j}") for j in range(3)),
                                       return_exceptions=True)
    assert poster.requests == 1 and all(isinstance(r, CoordinatorUnavailable) for r in results)
