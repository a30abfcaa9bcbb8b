"""The coordinator over real HTTP: server thread, async client, trainer-side collect."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from prometheus_client import CollectorRegistry, Gauge

from rft_runtime.coordinator import CollectTimeout, Coordinator, CoordinatorConfig, CoordinatorService
from rft_runtime.coordinator.server import CoordinatorServer
from rft_runtime.rollout.coordinator_client import CoordinatorClient, CoordinatorRejected, CoordinatorUnavailable


@pytest.fixture
def served():
    registry = CollectorRegistry()
    Gauge("rft_test_gauge", "a gauge", registry=registry).set(3)
    svc = CoordinatorService(Coordinator(CoordinatorConfig(n=2, lease_timeout_s=0.5)))
    server = CoordinatorServer(svc, "127.0.0.1", 0, metrics_registry=registry).start()
    try:
        yield svc, server
    finally:
        server.stop()


async def test_lease_post_status_roundtrip(served, episode, tasks):
    svc, server = served
    keys = svc.submit(tasks(2), seeds=[1, 2])
    async with CoordinatorClient(server.url) as c:
        out = await c.lease("w1", 5)
        assert [t.task_key for t in out.tasks] == keys
        eps = [episode(k, i) for k in keys for i in range(2)]
        held = [t.lease_id for t in out.tasks]
        res = await c.post_episodes("w1", eps, held)
        assert len(res.accepted) == 4
        res = await c.post_episodes("w1", eps[:1], held)  # a retried post
        assert res.duplicate == [eps[0]["id"]]
        st = await c.status()
        assert st.tasks.complete == 2
        assert st.counters["episodes_accepted"] == 4 and st.counters["episodes_duplicate"] == 1
    groups = svc.collect(keys, stall_timeout_s=5)
    assert [g.key for g in groups] == keys


async def test_bad_requests_name_the_field(served):
    _, server = served
    async with httpx.AsyncClient() as h:
        r = await h.post(server.url + "/v1/lease", json={"worker_id": "w", "max_tasks": 0})
        assert r.status_code == 400 and r.json()["error"]["field"] == "max_tasks"
        r = await h.post(server.url + "/v1/episodes", json={"worker_id": "w", "episodes": "x"})
        assert r.status_code == 400 and r.json()["error"]["field"] == "episodes"
        r = await h.post(server.url + "/v1/lease", content=b"not json")
        assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
        r = await h.get(server.url + "/metrics")
        assert r.status_code == 200 and "rft_test_gauge 3.0" in r.text
    async with CoordinatorClient(server.url) as c:
        with pytest.raises(CoordinatorRejected, match="worker_id"):
            await c.lease("", 1)


async def test_lease_expires_over_http_and_is_reissued(served, episode, tasks):
    svc, server = served
    (key,) = svc.submit(tasks(1), seeds=[0])
    async with CoordinatorClient(server.url) as c:
        first = (await c.lease("slow", 1)).tasks
        assert first
        second: list = []
        for _ in range(100):  # the lease timeout is 0.5 s
            second = (await c.lease("fast", 1)).tasks
            if second:
                break
            await asyncio.sleep(0.05)
        assert second and second[0].task_key == key and second[0].lease_id != first[0].lease_id
        st = await c.status()
        assert st.counters["leases_expired"] == 1 and st.counters["tasks_reissued"] == 1


def test_collect_blocks_until_a_worker_posts(served, episode, tasks):
    svc, server = served
    keys = svc.submit(tasks(1), seeds=[0])

    def worker() -> None:
        async def run() -> None:
            async with CoordinatorClient(server.url) as c:
                lease = await c.lease("w", 1)
                await c.post_episodes("w", [episode(t.task_key, i) for t in lease.tasks for i in range(2)],
                                      [t.lease_id for t in lease.tasks])
        asyncio.run(run())

    th = threading.Thread(target=worker)
    th.start()
    groups = svc.collect(keys, stall_timeout_s=30)
    th.join()
    assert groups is not None and len(groups[0].episodes) == 2


def test_collect_stops_and_times_out(tasks):
    svc = CoordinatorService(Coordinator(CoordinatorConfig(n=1, lease_timeout_s=5)))
    keys = svc.submit(tasks(1), seeds=[0])
    assert svc.collect(keys, stall_timeout_s=30, should_stop=lambda: True) is None
    with pytest.raises(CollectTimeout, match="rollout workers"):
        svc.collect(keys, stall_timeout_s=0.2, poll_s=0.05)


async def test_client_gives_up_on_dead_coordinator():
    async with CoordinatorClient("http://127.0.0.1:9", deadline_s=0.5) as c:
        with pytest.raises(CoordinatorUnavailable, match="failed after"):
            await c.status()


def test_a_stopping_coordinator_waits_until_active_workers_were_told_done():
    svc = CoordinatorService(Coordinator(CoordinatorConfig(n=2, lease_timeout_s=5)))
    svc.lease("busy", 1)
    svc.lease("gone", 1)
    svc.finish(complete=False)
    asked = threading.Timer(0.3, svc.lease, ("busy", 1))  # asks again a moment later, as a worker does
    asked.start()
    # "gone" never asks again: the wait ends at its bound and names it; "busy" was told meanwhile
    assert svc.wait_workers_told_done(seen_within_s=30, timeout_s=1.0) == ["gone"]
    asked.join()
    svc.lease("gone", 1)
    assert svc.wait_workers_told_done(seen_within_s=30, timeout_s=1.0) == []


async def test_a_long_polled_lease_is_answered_when_tasks_are_submitted_or_the_run_ends(served, tasks, monkeypatch):
    """With nothing to grant, ``wait_s`` holds the answer until tasks are submitted (from the trainer's
    thread) or the run is done. The periodic re-check is pushed past the wait, so only the wake-up can
    answer these leases before ``wait_s`` ends (with no tasks)."""
    from rft_runtime.coordinator import http as coord_http

    monkeypatch.setattr(coord_http, "LEASE_RECHECK_S", 120.0)
    svc, server = served
    loop = asyncio.get_running_loop()
    async with CoordinatorClient(server.url) as c:
        t0 = loop.time()
        out = await c.lease("w", 2, wait_s=0.3)  # nothing comes: an empty answer once the wait is over
        assert out.tasks == [] and not out.done and loop.time() - t0 >= 0.3
        waiting = asyncio.create_task(c.lease("w", 2, wait_s=60))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        keys = await loop.run_in_executor(None, lambda: svc.submit(tasks(3), seeds=[1, 2, 3]))
        out = await asyncio.wait_for(waiting, 30)
        assert [t.task_key for t in out.tasks] == keys[:2]
        out = await c.lease("w", 2, wait_s=60)  # one left: granted at once
        assert [t.task_key for t in out.tasks] == keys[2:]
        waiting = asyncio.create_task(c.lease("w", 1, wait_s=60))
        await asyncio.sleep(0.3)
        await loop.run_in_executor(None, lambda: svc.release([out.tasks[0].lease_id], "worker gone"))
        out = await asyncio.wait_for(waiting, 30)  # a task given back is one to grant
        assert [t.task_key for t in out.tasks] == keys[2:]
        waiting = asyncio.create_task(c.lease("w", 1, wait_s=60))
        await asyncio.sleep(0.3)
        await loop.run_in_executor(None, svc.finish)
        out = await asyncio.wait_for(waiting, 30)
        assert out.done and out.tasks == []


async def test_a_lease_long_polled_when_the_server_stops_does_not_hold_it_up(served):
    svc, server = served
    thread = server._thread
    async with CoordinatorClient(server.url, deadline_s=1.0) as c:
        waiting = asyncio.create_task(c.lease("w", 1, wait_s=60))
        await asyncio.sleep(0.3)
        await asyncio.get_running_loop().run_in_executor(None, server.stop)
        assert thread is not None and not thread.is_alive()  # stop() gives up joining after 10 s
        out = await asyncio.wait_for(waiting, 30)  # answered (empty) as the server shut down
        assert out.model_dump() == {"done": False, "finished": False, "policy_version": 0, "lease_timeout_s": 0.5,
                                    "tasks": []}


@pytest.mark.parametrize("wait_s", [-1, "5", True, 61])
async def test_a_lease_refuses_a_bad_wait(served, wait_s):
    _, server = served
    async with httpx.AsyncClient() as h:
        r = await h.post(server.url + "/v1/lease", json={"worker_id": "w", "max_tasks": 1, "wait_s": wait_s})
    assert r.status_code == 400 and r.json()["error"]["field"] == "wait_s"
    assert "0 to 60" in r.json()["error"]["message"]
