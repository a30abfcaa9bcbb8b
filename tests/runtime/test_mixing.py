"""Domain mixing (``spec.dataset.mix``): exact per-step shares, own seeded order per domain, resumable."""

from __future__ import annotations

import pytest

from rft_runtime.data import DatasetError, DomainMixCursor, Task, apportion


def tasks(domain: str, n: int) -> list[Task]:
    return [Task(task_id=f"{domain}-{i}", prompt=f"{domain} {i}", ground_truth=str(i), domain=domain) for i in range(n)]


MIX = [("arithmetic", 0.5), ("words", 0.3), ("code", 0.2)]
TASKS = tasks("arithmetic", 8) + tasks("words", 5) + tasks("code", 3)


@pytest.mark.parametrize(("k", "weights", "expected"), [
    (16, [0.5, 0.3, 0.2], [8, 5, 3]),
    (10, [0.5, 0.3, 0.2], [5, 3, 2]),
    (1, [0.5, 0.3, 0.2], [1, 0, 0]),
    (3, [1, 1, 1], [1, 1, 1]),
    (4, [1, 1, 1], [2, 1, 1]),  # ties go to the domain listed first
    (7, [2, 5], [2, 5]),
    (0, [1, 2], [0, 0]),
])
def test_apportion_is_exact_and_sums_to_k(k, weights, expected):
    assert apportion(k, weights) == expected
    assert sum(apportion(k, weights)) == k


def test_apportion_refuses_bad_weights():
    with pytest.raises(ValueError, match="positive and finite"):
        apportion(4, [1.0, 0.0])


def test_every_batch_holds_each_domains_share_in_its_own_order():
    cur = DomainMixCursor(TASKS, MIX, seed=7)
    seen: dict[str, list[str]] = {}
    for _ in range(6):
        batch = cur.next_batch(10)
        assert [t.domain for t in batch] == ["arithmetic"] * 5 + ["words"] * 3 + ["code"] * 2
        for t in batch:
            seen.setdefault(t.domain, []).append(t.task_id)
    # each domain cycles through all its tasks before repeating one (its own epochs)
    assert set(seen["code"][:3]) == {"code-0", "code-1", "code-2"}
    assert set(seen["arithmetic"][:8]) == {f"arithmetic-{i}" for i in range(8)}


def test_the_order_is_seeded():
    a = [t.task_id for t in DomainMixCursor(TASKS, MIX, seed=1).next_batch(16)]
    b = [t.task_id for t in DomainMixCursor(TASKS, MIX, seed=1).next_batch(16)]
    c = [t.task_id for t in DomainMixCursor(TASKS, MIX, seed=2).next_batch(16)]
    assert a == b and a != c


def test_resuming_from_state_draws_what_an_uninterrupted_run_draws():
    straight = DomainMixCursor(TASKS, MIX, seed=3)
    expected = [[t.task_id for t in straight.next_batch(10)] for _ in range(7)]
    first = DomainMixCursor(TASKS, MIX, seed=3)
    got = [[t.task_id for t in first.next_batch(10)] for _ in range(3)]
    resumed = DomainMixCursor(TASKS, MIX, seed=3)
    resumed.load_state_dict(first.state_dict())
    got += [[t.task_id for t in resumed.next_batch(10)] for _ in range(4)]
    assert got == expected


def test_a_task_domain_the_mix_does_not_list_is_refused_by_name():
    with pytest.raises(DatasetError, match=r"spec.dataset.mix: the training tasks have domain\(s\) code that the mix does not list"):
        DomainMixCursor(TASKS, MIX[:2])


def test_a_listed_domain_without_tasks_is_refused():
    with pytest.raises(DatasetError, match=r"no training task has domain\(s\) proofs"):
        DomainMixCursor(TASKS, [*MIX, ("proofs", 1.0)])


def test_a_state_saved_over_another_mix_or_without_one_is_refused():
    plain_state = {"seed": 0, "epoch": 0, "index": 3, "num_tasks": 16, "fingerprint": "x"}
    cur = DomainMixCursor(TASKS, MIX)
    with pytest.raises(DatasetError, match="saved without a domain mix"):
        cur.load_state_dict(plain_state)
    other = DomainMixCursor(tasks("arithmetic", 8) + tasks("words", 5), MIX[:2]).state_dict()
    with pytest.raises(DatasetError, match="the checkpoint mixed domains arithmetic, words, this job mixes arithmetic, code, words"):
        cur.load_state_dict(other)
