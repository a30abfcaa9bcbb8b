"""Datasets: builtin generators, registry, JSONL loader, resumable cursor."""

from __future__ import annotations

import json
import random
import re

import pytest

from rft_runtime.data import (
    DataCursor,
    DatasetError,
    Task,
    list_datasets,
    load_builtin,
    load_jsonl,
    register_dataset,
    write_jsonl,
)

_ARITH = re.compile(r"^What is (\d+) ([+\-*]) (\d+)\?$")


def test_registry_lists_builtins_refuses_duplicates_and_names_known_on_unknown():
    assert {"arithmetic", "gsm8k_synth"} <= set(list_datasets())
    with pytest.raises(ValueError, match="already registered"):
        register_dataset("arithmetic")(lambda n, seed: [])
    with pytest.raises(DatasetError, match="unknown builtin dataset 'nope'; known datasets: .*arithmetic.*gsm8k_synth"):
        load_builtin("nope", 3)


def test_arithmetic_is_deterministic_by_seed_and_answers_are_right():
    a, b, c = (load_builtin("arithmetic", 200, seed=s) for s in (5, 5, 6))
    assert [t.to_dict() for t in a] == [t.to_dict() for t in b]
    assert [t.chat_messages() for t in a] != [t.chat_messages() for t in c]
    assert len({t.task_id for t in a}) == 200
    for t in a:
        m = _ARITH.match(t.chat_messages()[0]["content"])
        assert m, t.chat_messages()
        x, op, y = int(m[1]), m[2], int(m[3])
        assert t.ground_truth == str({"+": x + y, "-": x - y, "*": x * y}[op])
        assert int(t.ground_truth) >= 0 and max(x, y) <= 20 and t.domain == "math"


def test_arithmetic_options_are_validated_and_applied():
    tasks = load_builtin("arithmetic", 50, seed=0, ops="*", max_factor=3, instruction=True)
    assert all("*" in t.chat_messages()[0]["content"] for t in tasks)
    assert all(t.chat_messages()[0]["content"].endswith("Answer with just the number.") for t in tasks)
    assert all(int(t.ground_truth) <= 9 for t in tasks)
    with pytest.raises(DatasetError, match="'ops'"):
        load_builtin("arithmetic", 1, ops="/")
    with pytest.raises(DatasetError, match="unknown option"):
        load_builtin("arithmetic", 1, colour="red")


def test_gsm8k_synth_solutions_are_consistent_gsm8k_format():
    tasks = load_builtin("gsm8k_synth", 120, seed=1)
    assert [t.to_dict() for t in tasks] == [t.to_dict() for t in load_builtin("gsm8k_synth", 120, seed=1)]
    assert len({t.metadata["template"] for t in tasks}) >= 6
    for t in tasks:
        solution = t.metadata["solution"]
        last = solution.splitlines()[-1]
        assert last == f"#### {t.ground_truth}"
        for expr, value in re.findall(r"<<([^=]+)=(\d+)>>", solution):
            assert eval(expr, {"__builtins__": {}}) == int(value), (expr, value)  # noqa: S307 (our own digits)
        assert int(t.ground_truth) >= 0


# ---------------------------------------------------------------- JSONL


def test_jsonl_loader_accepts_messages_or_prompt_and_round_trips(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(
        json.dumps({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                    "ground_truth": "1", "source": "x"}) + "\n\n"
        + json.dumps({"id": 7, "prompt": "p", "ground_truth": None, "domain": "code"}) + "\n"
    )
    tasks = load_jsonl(p)
    assert [t.task_id for t in tasks] == ["d-1", "7"]
    assert tasks[0].metadata == {"source": "x"} and tasks[0].domain == "default"
    assert tasks[1].chat_messages() == [{"role": "user", "content": "p"}] and tasks[1].domain == "code"
    out = write_jsonl(tasks, tmp_path / "out.jsonl")
    assert load_jsonl(out) == tasks


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"prompt": "x"', "invalid JSON"),
        ('[1, 2]', "expected a JSON object"),
        ('{"ground_truth": 1}', "field 'messages' or field 'prompt'"),
        ('{"prompt": "x", "messages": [], "ground_truth": 1}', "field 'messages' or field 'prompt'"),
        ('{"prompt": "x"}', "field 'ground_truth' is required"),
        ('{"prompt": 3, "ground_truth": 1}', "field 'prompt' must be a string"),
        ('{"messages": [], "ground_truth": 1}', "field 'messages' must be a non-empty list"),
        ('{"messages": [{"content": "x"}], "ground_truth": 1}', "field 'messages[0].role'"),
        ('{"messages": [{"role": "user", "content": 5}], "ground_truth": 1}', "field 'messages[0].content'"),
        ('{"prompt": "x", "ground_truth": 1, "metadata": 3}', "field 'metadata' must be an object"),
        ('{"prompt": "x", "ground_truth": 1, "task_id": "d-1"}', "duplicates line 1"),
    ],
)
def test_jsonl_loader_errors_name_line_and_field(tmp_path, line, message):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"prompt": "ok", "ground_truth": 0}) + "\n" + line + "\n")
    with pytest.raises(DatasetError) as err:
        load_jsonl(p)
    assert f"{p}:2: " in str(err.value)
    assert message in str(err.value)


def test_task_requires_exactly_one_prompt_form():
    with pytest.raises(DatasetError, match="exactly one of 'messages' or 'prompt'"):
        Task(task_id="x", ground_truth=1)
    assert Task.from_dict(Task(task_id="x", prompt="p", ground_truth=[1]).to_dict()).ground_truth == [1]


# ---------------------------------------------------------------- cursor


def test_cursor_resume_sees_exactly_the_uninterrupted_order():
    tasks = load_builtin("arithmetic", 13, seed=0)
    sizes = [random.Random(9).randint(1, 9) for _ in range(20)]
    straight = DataCursor(tasks, seed=4)
    expected = [[t.task_id for t in straight.next_batch(k)] for k in sizes]

    got, cursor = [], DataCursor(tasks, seed=4)
    for i, k in enumerate(sizes):
        if i % 3 == 2:  # "crash" and resume from a JSON-serialised state
            state = json.loads(json.dumps(cursor.state_dict()))
            cursor = DataCursor(tasks, seed=0)
            cursor.load_state_dict(state)
        got.append([t.task_id for t in cursor.next_batch(k)])
    assert got == expected
    assert cursor.consumed == sum(sizes) and cursor.epoch == sum(sizes) // 13


def test_cursor_epochs_are_permutations_differing_by_epoch_and_seed():
    tasks = load_builtin("arithmetic", 10, seed=0)
    c = DataCursor(tasks, seed=1)
    e0, e1 = c.next_batch(10), c.next_batch(10)
    assert sorted(t.task_id for t in e0) == sorted(t.task_id for t in tasks)
    assert [t.task_id for t in e0] != [t.task_id for t in e1]
    assert [t.task_id for t in DataCursor(tasks, seed=2).next_batch(10)] != [t.task_id for t in e0]
    assert [t.task_id for t in DataCursor(tasks, shuffle=False).next_batch(10)] == [t.task_id for t in tasks]


def test_cursor_epoch_limit_and_positions():
    tasks = load_builtin("arithmetic", 5, seed=0)
    c = DataCursor(tasks, seed=0, epochs=2)
    items = c.next_batch_with_positions(4) + c.next_batch_with_positions(4)
    assert [(e, i) for e, i, _ in items] == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (1, 0), (1, 1), (1, 2)]
    assert len(c.next_batch(4)) == 2 and c.exhausted and c.next_batch(4) == []


def test_cursor_refuses_state_of_another_dataset():
    c = DataCursor(load_builtin("arithmetic", 5, seed=0))
    other = DataCursor(load_builtin("arithmetic", 5, seed=1))
    with pytest.raises(DatasetError, match="fingerprint"):
        other.load_state_dict(c.state_dict())
    with pytest.raises(DatasetError, match="'index' is missing"):
        c.load_state_dict({"seed": 0, "epoch": 0, "num_tasks": 5, "fingerprint": "x"})


