"""Unit tests of the coordinator state machine (no I/O, fake clock)."""

from __future__ import annotations

import pytest

from rft_runtime.coordinator import Coordinator, CoordinatorConfig, CoordinatorError
from rft_runtime.coordinator.wire import LeaseRequest, Sampling, TaskStates, WireError


def test_lease_hands_out_tasks_with_all_fields(coord, episode, tasks):
    keys = coord.submit(tasks(3), seeds=[10, 20, 30])
    assert keys == ["t0@0", "t1@1", "t2@2"]
    out = coord.lease("w1", 2)
    assert out.done is False and out.policy_version == 0
    assert [g.task_key for g in out.tasks] == ["t0@0", "t1@1"]
    g = out.tasks[0]
    assert g.n == 2 and g.seed == 10 and g.sampling == Sampling(max_tokens=4)
    assert g.task["ground_truth"] == "0" and g.purpose == "train"
    assert g.deadline_in_s == 10.0 and g.lease_id
    assert coord.status().tasks == TaskStates(queued=1, leased=2, complete=0)


def test_group_completes_and_is_taken_in_order(coord, episode, tasks):
    keys = coord.submit(tasks(2), seeds=[0, 0])
    coord.lease("w", 2)
    for k in reversed(keys):
        res = coord.post_episodes("w", [episode(k, 1), episode(k, 0)])
        assert len(res.accepted) == 2
    groups, requeued = coord.take(keys)
    assert requeued == []
    assert [g.key for g in groups] == keys
    assert [e.rollout_idx for e in groups[0].episodes] == [0, 1]
    assert coord.counters["groups_completed"] == 2 and coord.counters["groups_taken"] == 2


def test_take_refuses_incomplete_group(coord, episode, tasks):
    (key,) = coord.submit(tasks(1), seeds=[0])
    coord.lease("w", 1)
    coord.post_episodes("w", [episode(key, 0)])
    with pytest.raises(CoordinatorError, match="not complete"):
        coord.take([key])


def test_posting_is_idempotent_by_episode_id(coord, episode, tasks):
    (key,) = coord.submit(tasks(1), seeds=[0])
    coord.lease("w", 1)
    ep = episode(key, 0)
    assert coord.post_episodes("w", [ep]).accepted == [f"{key}:0"]
    again = coord.post_episodes("w", [ep, ep])
    assert again.accepted == [] and len(again.duplicate) == 2
    assert coord.counters["episodes_accepted"] == 1 and coord.counters["episodes_duplicate"] == 2
    coord.post_episodes("w", [episode(key, 1)])
    groups, _ = coord.take([key])
    assert len(groups[0].episodes) == 2
    # A late copy after the group was trained on is still a duplicate, not a new episode.
    late = coord.post_episodes("w", [ep])
    assert late.duplicate == [f"{key}:0"] and coord.counters["episodes_accepted"] == 2


def test_idle_seconds_count_the_time_with_nothing_to_generate(coord, clock, episode, tasks):
    """The rollout workers are idle while no task is queued or leased: from the start until the first
    submission, and from the completion of the last open task until the next submission (a group waiting
    to be taken does not make them busy; a stale group put back in the queue does)."""
    clock.advance(5)
    assert coord.idle_seconds() == 5
    (key,) = coord.submit(tasks(1), seeds=[0])
    coord.lease("w", 1)
    clock.advance(3)
    coord.post_episodes("w", [episode(key, 0)])
    clock.advance(1)
    assert coord.idle_seconds() == 5  # half the group is in: still work to do
    coord.post_episodes("w", [episode(key, 1)])
    clock.advance(2)
    assert coord.idle_seconds() == 7  # complete, not yet taken: nothing to generate
    coord.take([key])
    clock.advance(4)
    assert coord.idle_seconds() == 11
    (key,) = coord.submit(tasks(1), seeds=[0])
    coord.lease("w", 1)
    clock.advance(6)
    assert coord.idle_seconds() == 11
    coord.post_episodes("w", [episode(key, 0), episode(key, 1)])
    coord.set_policy_version(1)  # on-policy: the version-0 group is now stale
    assert coord.take([key]) == ([], [key])  # put back in the queue: work again
    clock.advance(2)
    assert coord.idle_seconds() == 11


def test_expired_lease_is_reissued_and_counted(coord, clock, episode, tasks):
    (key,) = coord.submit(tasks(1), seeds=[0])
    first = coord.lease("w1", 1).tasks[0]
    assert coord.lease("w2", 1).tasks == []
    clock.advance(10.5)
    second = coord.lease("w2", 1).tasks[0]
    assert second.task_key == key and second.lease_id != first.lease_id
    assert coord.counters["leases_expired"] == 1 and coord.counters["tasks_reissued"] == 1
    # The first worker's late episodes are refused (its lease expired); the new holder's count.
    late = coord.post_episodes("w1", [episode(key, 0), episode(key, 1)])
    assert len(late.refused) == 2 and coord.counters["episodes_refused_lease"] == 2
    res = coord.post_episodes("w2", [episode(key, 0), episode(key, 1)])
    assert len(res.accepted) == 2
    assert coord.is_complete(key)


def test_release_requeues_at_front(coord, episode, tasks):
    coord.submit(tasks(3), seeds=[0, 0, 0])
    lease = coord.lease("w", 1).tasks[0]
    assert coord.release([lease.lease_id], "engine down") == 1
    assert coord.lease("w", 1).tasks[0].task_key == lease.task_key
    assert coord.counters["leases_released"] == 1 and coord.counters["tasks_reissued"] == 1


def test_on_policy_drops_stale_episodes_and_resamples(coord, episode, tasks):
    (key,) = coord.submit(tasks(1), seeds=[0])
    coord.lease("w", 1)
    coord.set_policy_version(1)
    res = coord.post_episodes("w", [episode(key, 0, version=0), episode(key, 1, version=0)])
    assert len(res.stale) == 2 and coord.counters["episodes_dropped_stale"] == 2
    # The task was leased under version 0: it goes back to the queue for the current policy.
    again = coord.lease("w", 1).tasks[0]
    assert again.task_key == key and again.policy_version == 1
    res = coord.post_episodes("w", [episode(key, 0, version=1), episode(key, 1, version=1)])
    assert len(res.accepted) == 2


def test_stale_samples_of_a_current_lease_are_resampled_at_once(coord, episode, tasks):
    """A worker leased the task at the current version but the engine served older weights (an
    inference server that restarted): the task is re-queued now, not when the lease expires."""
    (key,) = coord.submit(tasks(1), seeds=[0])
    coord.set_policy_version(3)
    assert coord.lease("w", 1).tasks[0].policy_version == 3
    res = coord.post_episodes("w", [episode(key, 0, version=0), episode(key, 1, version=0)])
    assert len(res.stale) == 2
    again = coord.lease("w", 1).tasks[0]
    assert again.task_key == key and again.policy_version == 3
    res = coord.post_episodes("w", [episode(key, 0, version=3), episode(key, 1, version=3)])
    assert len(res.accepted) == 2 and coord.is_complete(key)


def test_bounded_staleness_accepts_up_to_s_versions(clock, episode, tasks):
    c = Coordinator(CoordinatorConfig(n=1, lease_timeout_s=10, max_staleness=2), clock=clock)
    keys = c.submit(tasks(3), seeds=[0, 0, 0])
    c.lease("w", 3)
    c.set_policy_version(2)
    assert c.post_episodes("w", [episode(keys[0], 0, version=0)]).accepted
    c.set_policy_version(3)
    assert c.post_episodes("w", [episode(keys[1], 0, version=0)]).stale
    assert c.post_episodes("w", [episode(keys[2], 0, version=1)]).accepted
    assert c.status().mode == "bounded-staleness"
    # keys[0] (version 0) became 3 versions old while waiting: dropped at take and re-queued.
    groups, requeued = c.take([keys[0], keys[2]])
    assert [g.key for g in groups] == [keys[2]] and requeued == [keys[0]]
    assert c.counters["groups_dropped_stale"] == 1
    assert c.status().tasks.queued >= 1


def test_future_version_and_bad_index_are_invalid(coord, episode, tasks):
    (key,) = coord.submit(tasks(1), seeds=[0])
    coord.lease("w", 1)
    res = coord.post_episodes("w", [episode(key, 0, version=5), episode(key, 7)])
    assert len(res.invalid) == 2 and len(res.errors) == 2
    res = coord.post_episodes("w", [{"id": "x"}])
    assert res.invalid == ["x"] and "task_id" in res.errors[0]
    assert coord.counters["episodes_dropped_invalid"] == 3


def test_token_contract_is_checked_on_post(coord, episode, tasks):
    (key,) = coord.submit(tasks(1), seeds=[0])
    coord.lease("w", 1)
    res = coord.post_episodes("w", [episode(key, 0, version=None)])
    assert res.invalid == [f"{key}:0"] and "policy_version" in res.errors[0]
    bad = episode(key, 1)
    bad["trajectories"][0]["steps"][0]["logprobs"] = [-0.5, -0.1]  # 2 logprobs for 1 token
    res = coord.post_episodes("w", [bad])
    assert res.invalid and "logprobs" in res.errors[0]
    assert coord.post_episodes("w", [episode(key, 0), episode(key, 1)]).accepted


def test_unknown_and_cancelled_tasks_are_dropped(coord, episode, tasks):
    keys = coord.submit(tasks(2), seeds=[0, 0])
    coord.lease("w", 1)
    returned = coord.cancel(keys)
    assert sorted(t["task_id"] for t in returned) == ["t0", "t1"]
    assert coord.lease("w", 5).tasks == []
    res = coord.post_episodes("w", [episode(keys[0], 0), episode("nope@9", 0)])
    assert len(res.unknown) == 2 and coord.counters["episodes_dropped_unknown"] == 2
    assert coord.counters["tasks_cancelled"] == 2


def test_done_stops_leasing(coord, episode, tasks):
    coord.submit(tasks(1), seeds=[0])
    coord.finish()
    out = coord.lease("w", 1)
    assert out.done is True and out.finished is True and out.tasks == []


def test_a_stopping_trainer_says_done_but_not_finished(coord, tasks):
    """A trainer that stops without completing (its pod deleted, interrupted) ends leasing with ``done``
    alone: its next attempt resumes the run, so a worker must not idle as if training were over. A later
    completion still says ``finished``."""
    coord.submit(tasks(1), seeds=[0])
    assert coord.lease("w", 1).finished is False
    coord.finish(complete=False)
    out = coord.lease("w", 1)
    assert out.done is True and out.finished is False and out.tasks == []
    coord.finish()
    assert coord.lease("w", 1).finished is True
    coord.finish(complete=False)  # closing after completion keeps it
    assert coord.lease("w", 1).finished is True


def test_version_never_goes_backwards(coord, episode, tasks):
    coord.set_policy_version(3)
    with pytest.raises(CoordinatorError, match="backwards"):
        coord.set_policy_version(2)


def test_bad_lease_arguments_name_the_field(coord, episode, tasks):
    """A lease's arguments are checked where they are built: the request message (the HTTP boundary)."""
    with pytest.raises(WireError, match="max_tasks must be an integer >= 1") as info:
        LeaseRequest.parse({"worker_id": "w", "max_tasks": 0})
    assert info.value.field == "max_tasks"
    with pytest.raises(WireError, match="worker_id"):
        LeaseRequest.parse({"worker_id": "", "max_tasks": 1})
    with pytest.raises(ValueError, match="lease_timeout_s"):
        CoordinatorConfig(n=1, lease_timeout_s=0)


@pytest.mark.parametrize("n", [0, -1, 1.5, "2", True])
def test_a_group_size_that_is_not_an_integer_of_at_least_one_is_refused_where_it_is_built(clock, tasks, n):
    """``n`` has one rule (wire.GroupSize), checked on the coordinator's default and on each submission."""
    with pytest.raises(ValueError, match="field 'n' must be an integer >= 1"):
        CoordinatorConfig(n=n, lease_timeout_s=5)
    c = Coordinator(CoordinatorConfig(n=2, lease_timeout_s=5), clock=clock)
    with pytest.raises(CoordinatorError, match=r"'t0': n: "):
        c.submit(tasks(2), seeds=[0, 1], n=n)
    assert c.status().tasks == TaskStates() and c.next_seq == 0  # nothing of the call was queued


def test_a_submission_with_bad_sampling_or_seed_is_refused(coord, tasks):
    with pytest.raises(CoordinatorError, match="sampling: max_tokens"):
        coord.submit(tasks(1), seeds=[0], sampling={"max_tokens": "4"})
    with pytest.raises(CoordinatorError, match="seed"):
        coord.submit(tasks(1), seeds=[-1])
    with pytest.raises(CoordinatorError, match="purpose"):
        coord.submit(tasks(1), seeds=[0], purpose="fun")
    with pytest.raises(ValueError, match="sampling"):
        Coordinator(CoordinatorConfig(n=1, lease_timeout_s=5, sampling={"temperature": "hot"}))


def test_an_eval_submission_is_granted_with_its_own_n(coord, tasks):
    """The grant's ``n`` is the task's (evaluation.samplesPerPrompt for eval tasks), not the default."""
    coord.submit(tasks(1), seeds=[0], n=5, purpose="eval", sampling={"max_tokens": 8, "temperature": 0.0})
    (g,) = coord.lease("w", 1).tasks
    assert g.n == 5 and g.purpose == "eval" and g.sampling == Sampling(max_tokens=8, temperature=0.0)


def test_keys_unique_across_resubmission_of_the_same_task(coord, episode, tasks):
    a = coord.submit(tasks(1), seeds=[0])
    b = coord.submit(tasks(1), seeds=[0])
    assert a != b and coord.next_seq == 2


def test_workers_not_told_done_are_those_recently_active_without_a_done_answer(coord, clock, episode, tasks):
    """What a stopping trainer waits for before it stops its coordinator's server."""
    keys = coord.submit(tasks(1), seeds=[1])
    grant = coord.lease("a", 1).tasks[0]
    coord.lease("b", 1)
    clock.advance(20)
    coord.post_episodes("a", [episode(keys[0], 0)], [grant.lease_id])
    clock.advance(15)  # "b" last asked 35 s ago, "a" posted 15 s ago
    assert coord.workers_not_told_done(30) == ["a"]  # before finish() no worker has been told
    assert coord.workers_not_told_done(60) == ["a", "b"]
    coord.finish(complete=False)
    assert coord.workers_not_told_done(60) == ["a", "b"]
    assert coord.lease("a", 1).done is True
    assert coord.workers_not_told_done(60) == ["b"]
    coord.lease("b", 4)
    assert coord.workers_not_told_done(60) == []
    coord.finish()  # told "done" stays told when the run is then marked finished
    assert coord.workers_not_told_done(60) == []


def test_a_task_waits_for_its_min_version_while_later_ones_go_first(coord, episode, tasks):
    """A trainer publishing version 1 in the background submits the next tasks for it: they are not granted
    while version 0 is served (later tasks that may be go first), then granted with version 1."""
    early = coord.submit(tasks(1), seeds=[0])
    waiting = coord.submit(tasks(2), seeds=[0, 0], min_version=1)
    late = coord.submit(tasks(1), seeds=[0])
    out = coord.lease("w", 4)
    assert [g.task_key for g in out.tasks] == early + late
    assert coord.lease("w", 4).tasks == [] and coord.status().tasks.queued == 2
    coord.set_policy_version(1)
    grants = coord.lease("w", 4).tasks
    assert [g.task_key for g in grants] == waiting and {g.policy_version for g in grants} == {1}
    res = coord.post_episodes("w", [episode(waiting[0], i, version=1) for i in range(2)])
    assert len(res.accepted) == 2 and coord.is_complete(waiting[0])
