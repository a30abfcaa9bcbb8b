"""Dataset files as users have them: JSONL, JSON, Parquet and CSV, field mapping, shards, Hugging Face
repository splits, and GSM8K (the real data from ``shared/datasets/gsm8k``) end to end to the math reward."""

from __future__ import annotations

import csv
import datetime
import decimal
import gzip
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from rft_runtime.data import (
    FORMATS,
    DatasetError,
    FieldMap,
    Task,
    detect_format,
    load_file,
    load_files,
    load_jsonl,
    load_split,
    split_files,
    write_jsonl,
)
from rft_runtime.rewards import Item, Sample
from rft_runtime.rewards.builtins import MathEvaluator
from tests.support.shared import pinned_files

GSM8K_SHA256 = {
    "test.jsonl": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
    "train.jsonl": "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
}
"""``shared/datasets/gsm8k/`` (openai/grade-school-math ``grade_school_math/data/``, unchanged; its README)."""

GSM8K = FieldMap(prompt="question", ground_truth="answer")

# GSM8K's dataset card on the hub (its configs; the files sit in one directory per config).
GSM8K_CARD = """---
license: mit
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train-*
  - split: test
    path: main/test-*
- config_name: socratic
  data_files:
  - split: train
    path: socratic/train-*
  - split: test
    path: socratic/test-*
---
# Dataset Card for GSM8K
"""


def gsm8k(name: str) -> Path:
    return {p.name: p for p in pinned_files("datasets/gsm8k", GSM8K_SHA256)}[name]


def dicts(tasks: list[Task], *, ids: bool = True) -> list[dict[str, Any]]:
    out = [t.to_dict() for t in tasks]
    if not ids:
        for d in out:
            d.pop("task_id")
    return out


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    """``rows`` in the format ``path``'s suffix says (the test's own writer, independent of the loader)."""
    fmt = path.name.removesuffix(".gz").rsplit(".", 1)[-1]
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=3)
        return path
    if fmt == "csv":
        columns = list(dict.fromkeys(k for r in rows for k in r))
        text_rows = [{k: (json.dumps(v) if k in ("messages", "metadata") and v is not None else
                          "" if v is None else str(v)) for k, v in r.items()} for r in rows]
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "wt", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, columns)
            w.writeheader()
            w.writerows(text_rows)
        return path
    text = "".join(json.dumps(r) + "\n" for r in rows) if fmt in ("jsonl", "ndjson") else json.dumps(rows)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text, encoding="utf-8")
    return path


SAMPLE_ROWS = [
    {"task_id": f"t{i}", "prompt": f"What is {i} + {i}?" if i % 2 else None,
     "messages": None if i % 2 else [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": f"Double {i}, please.\nThanks, \"friend\"."}],
     "ground_truth": str(2 * i), "domain": "math" if i % 3 else "arith",
     "metadata": {"level": i % 4, "source": "unit"}}
    for i in range(1, 12)
]


def sample_tasks() -> list[Task]:
    return [Task.from_dict({k: v for k, v in r.items() if v is not None}) for r in SAMPLE_ROWS]


# ---------------------------------------------------------------- formats


@pytest.mark.parametrize("name", ["d.jsonl", "d.ndjson", "d.jsonl.gz", "d.json", "d.json.gz", "d.parquet", "d.csv",
                                  "d.csv.gz"])
def test_every_format_round_trips_the_same_tasks(tmp_path: Path, name: str) -> None:
    rows = SAMPLE_ROWS
    if name.startswith("d.json") and not name.startswith("d.jsonl"):
        rows = [{k: v for k, v in r.items() if v is not None} for r in rows]
    elif "jsonl" in name or "ndjson" in name:
        rows = [{k: v for k, v in r.items() if v is not None} for r in rows]
    path = write_rows(tmp_path / name, rows)
    expected = sample_tasks()
    if name.startswith("d.csv"):  # every CSV value is a string (metadata is JSON text, so it keeps its types)
        expected = [Task.from_dict({**t.to_dict(), "ground_truth": str(t.ground_truth)}) for t in expected]
    assert dicts(load_file(path)) == dicts(expected)
    assert detect_format(path) in FORMATS


def test_json_accepts_an_array_an_object_with_one_array_member_or_json_lines(tmp_path: Path) -> None:
    rows = [{"prompt": "p1", "ground_truth": 1}, {"prompt": "p2", "ground_truth": [2, "two"], "extra": {"a": 1}}]
    (tmp_path / "a.json").write_text(json.dumps(rows))
    (tmp_path / "b.json").write_text(json.dumps({"data": rows}))
    (tmp_path / "c.json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "d.json").write_text(json.dumps(rows[1]))  # one object: a one-row JSON Lines file
    a, b, c = (load_file(tmp_path / f"{n}.json") for n in "abc")
    assert dicts(a, ids=False) == dicts(b, ids=False) == dicts(c, ids=False)
    assert [t.task_id for t in a] == ["a-1", "a-2"] and a[1].metadata == {"extra": {"a": 1}}
    assert dicts(load_file(tmp_path / "d.json"), ids=False) == dicts(a[1:], ids=False)
    (tmp_path / "e.json").write_text('[{"prompt": "x", "ground_truth": 1},')
    with pytest.raises(DatasetError, match=r"e\.json: invalid JSON"):
        load_file(tmp_path / "e.json")


def test_jsonl_without_a_mapping_gives_exactly_what_load_jsonl_gives(tmp_path: Path) -> None:
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"messages": [{"role": "user", "content": "u"}], "ground_truth": "1", "source": "x"})
                 + "\n\n" + json.dumps({"id": 7, "prompt": "p", "ground_truth": None, "domain": "code"}) + "\n"
                 + json.dumps({"prompt": "q", "ground_truth": {"answer": 3}, "metadata": {"k": [1]}}) + "\n")
    assert load_file(p) == load_file(p, format="jsonl") == load_jsonl(p)
    assert [t.task_id for t in load_file(p)] == ["d-1", "7", "d-4"]
    assert load_file(write_jsonl(sample_tasks(), tmp_path / "w.jsonl")) == sample_tasks()
    assert load_file(p, domain="fallback")[0].domain == "fallback"


def test_parquet_values_become_plain_python(tmp_path: Path) -> None:
    table = pa.table({
        "prompt": ["a", "b"],
        "ground_truth": pa.array([1, 2], pa.int64()),
        "score": [0.5, float("nan")],
        "when": pa.array([datetime.datetime(2024, 1, 2, 3, 4, 5), None], pa.timestamp("s")),
        "day": pa.array([datetime.date(2024, 1, 2)] * 2, pa.date32()),
        "price": pa.array([decimal.Decimal("1.50"), decimal.Decimal("2.25")], pa.decimal128(5, 2)),
        "tags": pa.array([["x", "y"], []], pa.list_(pa.string())),
        "info": pa.array([{"n": 1, "s": "u"}, {"n": 2, "s": None}]),
        "kv": pa.array([[("a", 1)], [("b", 2)]], pa.map_(pa.string(), pa.int32())),
        "blob": pa.array([b"text", b"more"], pa.binary()),
    })
    pq.write_table(table, tmp_path / "t.parquet")
    tasks = load_file(tmp_path / "t.parquet")
    assert tasks[0].ground_truth == 1 and type(tasks[0].ground_truth) is int
    assert tasks[0].metadata == {
        "score": 0.5, "when": "2024-01-02T03:04:05", "day": "2024-01-02", "price": "1.50", "tags": ["x", "y"],
        "info": {"n": 1, "s": "u"}, "kv": [["a", 1]], "blob": "text"}
    assert tasks[1].metadata["score"] is None and tasks[1].metadata["when"] is None
    assert json.loads(json.dumps([t.to_dict() for t in tasks], allow_nan=False))  # JSON-ready
    pq.write_table(pa.table({"prompt": ["a"], "ground_truth": ["1"], "img": [b"\xff\xd8\xff"]}), tmp_path / "b.parquet")
    with pytest.raises(DatasetError, match=r"b\.parquet:1: field 'img'.*not UTF-8"):
        load_file(tmp_path / "b.parquet")
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(DatasetError, match=r"bad\.parquet: cannot read it as Parquet"):
        load_file(tmp_path / "bad.parquet")


def test_csv_rows_are_data_records_and_values_stay_strings(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    with p.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["question", "answer", "n"])
        for i in range(1, 20):
            w.writerow([f"q{i}\nsecond line" if i < 10 else f"q{i}", f"{i},000" if i % 2 else f"#### {i}", i])
    tasks = load_file(p, fields=GSM8K)
    assert len(tasks) == 19 and tasks[0].prompt == "q1\nsecond line" and tasks[0].ground_truth == "1,000"
    assert tasks[4].metadata == {"n": "5"} and [t.task_id for t in tasks[:2]] == ["d-1", "d-2"]
    text = p.read_text(encoding="utf-8").splitlines(keepends=True)
    p.write_text("".join(text[:-3]) + "q17,only two\n" + "".join(text[-2:]), encoding="utf-8")
    with pytest.raises(DatasetError) as err:  # file line 26: the 17th data record (quoted values span lines)
        load_file(p, fields=GSM8K)
    assert f"{p}:17: the record has 2 values, the header 3 columns" in str(err.value)


def test_csv_cells_over_128_kib_and_a_bom_are_fine(tmp_path: Path) -> None:
    p = tmp_path / "big.csv"
    big = "x" * 300_000
    p.write_text("\ufeffprompt,ground_truth\n" + f'"{big}",1\n', encoding="utf-8")
    assert load_file(p)[0].prompt == big


# ---------------------------------------------------------------- field mapping


def test_field_map_renames_then_validates_and_keeps_other_columns_as_metadata(tmp_path: Path) -> None:
    rows = [{"uid": f"q-{i}", "question": f"Q{i}", "answer": f"A\n#### {i}", "subject": "algebra" if i else "geo",
             "prompt": "a column the mapping overrides", "level": i} for i in range(3)]
    fields = FieldMap(prompt="question", ground_truth="answer", task_id="uid", domain="subject")
    for name in ("m.jsonl", "m.json", "m.parquet", "m.csv"):
        tasks = load_file(write_rows(tmp_path / name, rows), fields=fields)
        assert [t.task_id for t in tasks] == ["q-0", "q-1", "q-2"]
        assert [t.domain for t in tasks] == ["geo", "algebra", "algebra"]
        assert tasks[1].prompt == "Q1" and tasks[1].ground_truth == "A\n#### 1"
        level: Any = "1" if name.endswith(".csv") else 1
        assert tasks[1].metadata == {"prompt": "a column the mapping overrides", "level": level}
    messages = [{"chat": [{"role": "user", "content": "hi"}], "gt": 5}]
    tasks = load_file(write_rows(tmp_path / "c.parquet", messages), fields=FieldMap(messages="chat", ground_truth="gt"))
    assert tasks[0].chat_messages() == [{"role": "user", "content": "hi"}] and tasks[0].metadata == {}
    assert FieldMap.from_mapping({"prompt": "question", "ground_truth": "answer"}) == GSM8K
    assert FieldMap.from_mapping({}) is None
    with pytest.raises(DatasetError, match="unknown field.*'answer'"):
        FieldMap.from_mapping({"answer": "x"})
    with pytest.raises(DatasetError, match="cannot both be mapped"):
        FieldMap(prompt="a", messages="b")
    with pytest.raises(DatasetError, match="fields.task_id"):
        FieldMap(task_id="")


@pytest.mark.parametrize("name, problem", [("r.jsonl", "missing"), ("r.json", "missing"), ("r.parquet", "null")])
def test_a_row_without_the_mapped_column_is_named_by_row_and_column(tmp_path: Path, name: str, problem: str) -> None:
    rows: list[dict[str, Any]] = [{"question": f"q{i}", "answer": "#### 1"} for i in range(1, 30)]
    rows[16] = {"answer": "#### 1"} if problem == "missing" else {"question": None, "answer": "#### 1"}
    path = write_rows(tmp_path / name, rows)
    with pytest.raises(DatasetError) as err:
        load_file(path, fields=GSM8K)
    assert str(err.value) == f"{path}:17: field 'question' (fields.prompt) is {problem}"
    with pytest.raises(DatasetError, match=r"^spec\.dataset\.train:17: field 'question'"):
        load_file(path, fields=GSM8K, where="spec.dataset.train")


def test_unknown_formats_and_missing_files_are_named(tmp_path: Path) -> None:
    for name in ("data.txt", "data.xlsx", "data.parquet.gz", "noext"):
        with pytest.raises(DatasetError, match=rf"{name}: cannot tell the dataset format"):
            detect_format(tmp_path / name)
        with pytest.raises(DatasetError, match=rf"{name}: cannot tell the dataset format"):
            load_file(tmp_path / name)
    with pytest.raises(DatasetError, match=r"x\.jsonl: unknown dataset format 'xml'"):
        load_file(tmp_path / "x.jsonl", format="xml")
    with pytest.raises(DatasetError, match=r"absent\.csv: no such file"):
        load_file(tmp_path / "absent.csv")
    (tmp_path / "data.txt").write_text(json.dumps({"prompt": "p", "ground_truth": 1}) + "\n")
    assert load_file(tmp_path / "data.txt", format="jsonl")[0].task_id == "data-1"


def test_load_files_keeps_shard_order_and_refuses_an_id_in_two_shards(tmp_path: Path) -> None:
    shards = []
    for k in range(3):
        rows = [{"prompt": f"p{k}-{i}", "ground_truth": i} for i in range(4)]
        shards.append(write_rows(tmp_path / f"train-0000{k}-of-00003.parquet", rows))
    tasks = load_files(shards)
    assert [t.prompt for t in tasks] == [f"p{k}-{i}" for k in range(3) for i in range(4)]
    assert len({t.task_id for t in tasks}) == 12 and tasks[4].task_id == "train-00001-of-00003-1"
    a = write_rows(tmp_path / "a.jsonl", [{"id": "same", "prompt": "x", "ground_truth": 1}])
    b = write_rows(tmp_path / "b.csv", [{"id": "same", "prompt": "y", "ground_truth": 2}])
    with pytest.raises(DatasetError, match=rf"{b}:1: field 'task_id' 'same' duplicates {a}:1"):
        load_files([a, b])


# ---------------------------------------------------------------- Hugging Face repository layout


def touch(root: Path, *names: str, rows: int = 1) -> None:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        write_rows(root / name, [{"prompt": f"{name} {i}", "ground_truth": i} for i in range(rows)])


def rel(root: Path, files: list[Path]) -> list[str]:
    return [f.relative_to(root).as_posix() for f in files]


def test_split_files_follows_the_hub_conventions(tmp_path: Path) -> None:
    a = tmp_path / "a"  # data/<split>-NNNNN-of-NNNNN: shards in order
    touch(a, "data/train-00001-of-00002.parquet", "data/train-00000-of-00002.parquet",
          "data/test-00000-of-00001.parquet", "README.md.jsonl.bak")
    assert rel(a, split_files(a, "train")) == ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"]
    assert rel(a, split_files(a, "test")) == ["data/test-00000-of-00001.parquet"]
    b = tmp_path / "b"  # files named by the split, at the root or under data/; hub synonyms
    touch(b, "train.jsonl", "data/test.jsonl", "dev.jsonl", "my_train_extra.jsonl")
    (b / "dataset_info.json").write_text("{}")
    touch(b, ".hidden/train.jsonl", "__pycache__/train.jsonl")
    assert rel(b, split_files(b, "train")) == ["my_train_extra.jsonl", "train.jsonl"]
    assert rel(b, split_files(b, "test")) == ["data/test.jsonl"]
    assert rel(b, split_files(b, "validation")) == ["dev.jsonl"]
    c = tmp_path / "c"  # directories named by the split decide over file names
    touch(c, "train/part-0.csv", "train/part-1.csv", "data/validation/x.csv", "test_notes.csv")
    assert rel(c, split_files(c, "train")) == ["train/part-0.csv", "train/part-1.csv"]
    assert rel(c, split_files(c, "validation")) == ["data/validation/x.csv"]
    d = tmp_path / "d"  # no split named anywhere: everything is train
    touch(d, "questions.jsonl", "more/questions2.jsonl")
    assert rel(d, split_files(d, "train")) == ["more/questions2.jsonl", "questions.jsonl"]
    with pytest.raises(DatasetError, match=rf"split 'test' of {d} is empty: no data files"):
        split_files(d, "test")
    e = tmp_path / "e"  # a custom split name
    touch(e, "data/holdout-00000-of-00001.parquet", "data/train-00000-of-00001.parquet")
    assert rel(e, split_files(e, "holdout")) == ["data/holdout-00000-of-00001.parquet"]


def test_split_files_configs_are_subdirectories_or_the_cards_configs(tmp_path: Path) -> None:
    root = tmp_path / "gsm"
    touch(root, "main/train-00000-of-00001.parquet", "main/test-00000-of-00001.parquet",
          "socratic/train-00000-of-00001.parquet", "socratic/test-00000-of-00001.parquet")
    assert rel(root, split_files(root, "test", "main")) == ["main/test-00000-of-00001.parquet"]
    assert rel(root, split_files(root, "train", "socratic")) == ["socratic/train-00000-of-00001.parquet"]
    with pytest.raises(DatasetError, match="several config directories \\(main, socratic\\); choose a config"):
        split_files(root, "test")
    with pytest.raises(DatasetError, match="no config 'nope'"):
        split_files(root, "test", "nope")
    (root / "README.md").write_text(GSM8K_CARD)
    assert rel(root, split_files(root, "test", "main")) == ["main/test-00000-of-00001.parquet"]
    with pytest.raises(DatasetError, match="several configs \\(main, socratic\\) and none is the default"):
        split_files(root, "test")
    with pytest.raises(DatasetError, match="config 'main' has no split 'validation' \\(its splits: train, test\\)"):
        split_files(root, "validation", "main")
    with pytest.raises(DatasetError, match="no config 'nope'; its README.md lists: main, socratic"):
        split_files(root, "test", "nope")
    (root / "README.md").write_text(GSM8K_CARD.replace("- config_name: main\n", "- config_name: main\n  default: true\n"))
    assert rel(root, split_files(root, "train")) == ["main/train-00000-of-00001.parquet"]


def test_an_empty_split_is_an_error_naming_split_and_root(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=rf"split 'train' of {tmp_path} is empty"):
        split_files(tmp_path, "train")
    touch(tmp_path, "train.jsonl", "test.jsonl", rows=0)
    pq.write_table(pa.table({"prompt": pa.array([], pa.string()), "ground_truth": pa.array([], pa.string())}),
                   tmp_path / "validation.parquet")
    for split in ("test", "validation"):
        with pytest.raises(DatasetError, match=rf"split '{split}' of {tmp_path} is empty: its files \({split}\."):
            load_split(tmp_path, split)
    touch(tmp_path, "train.csv")
    with pytest.raises(DatasetError, match="mixes formats \\(csv, jsonl\\)"):
        split_files(tmp_path, "train")
    with pytest.raises(DatasetError, match="not a directory"):
        split_files(tmp_path / "train.csv", "train")


# ---------------------------------------------------------------- GSM8K, the real data


def test_gsm8k_loads_the_same_from_jsonl_parquet_csv_and_a_hub_layout(tmp_path: Path) -> None:
    src = gsm8k("test.jsonl")
    tasks = load_file(src, fields=GSM8K)
    raw = [json.loads(line) for line in src.read_text(encoding="utf-8").splitlines()]
    assert len(tasks) == len(raw) == 1319
    assert [(t.prompt, t.ground_truth, t.metadata) for t in tasks] == [(r["question"], r["answer"], {}) for r in raw]
    assert tasks[0].task_id == "test-1" and len({t.task_id for t in tasks}) == 1319
    table = pa.Table.from_pylist(raw)
    pq.write_table(table, tmp_path / "test.parquet", row_group_size=200)
    pa_csv.write_csv(table, tmp_path / "test.csv")
    assert load_file(tmp_path / "test.parquet", fields=GSM8K) == tasks
    assert load_file(tmp_path / "test.csv", fields=GSM8K) == tasks
    repo = tmp_path / "openai-gsm8k"
    (repo / "main").mkdir(parents=True)
    pq.write_table(table, repo / "main" / "test-00000-of-00001.parquet")
    pq.write_table(table.slice(0, 10), repo / "main" / "train-00000-of-00001.parquet")
    files = split_files(repo, "test", "main")
    assert rel(repo, files) == ["main/test-00000-of-00001.parquet"]
    from_repo = load_files(files, fields=GSM8K)
    assert dicts(from_repo, ids=False) == dicts(tasks, ids=False)
    assert from_repo[0].task_id == "test-00000-of-00001-1" and len({t.task_id for t in from_repo}) == 1319
    (repo / "README.md").write_text(GSM8K_CARD)  # as downloaded from the hub: the card names the files
    assert load_split(repo, "test", "main", fields=GSM8K) == from_repo


async def test_math_evaluator_scores_real_gsm8k_answers() -> None:
    tasks = load_file(gsm8k("test.jsonl"), fields=GSM8K)
    ev = MathEvaluator({})
    checked = 0
    for t in tasks[::7] + [t for t in tasks if "," in t.ground_truth.rsplit("####", 1)[1]]:
        final = t.ground_truth.rsplit("####", 1)[1].strip().replace(",", "")
        item = Item.from_any(t)
        right = await ev.score(Sample(text=f"Step by step... so the answer is {final}."), item)
        hashed = await ev.score(Sample(text=f"Work.\n#### {int(final):,}"), item)
        wrong = await ev.score(Sample(text=f"Step by step... so the answer is {int(final) + 1}."), item)
        assert (right.reward, hashed.reward, wrong.reward) == (1.0, 1.0, 0.0), (t.task_id, final, wrong.reason)
        checked += 1
    assert checked > 190
    first = tasks[0]  # Janet's ducks: #### 18
    assert (await ev.score(Sample(text="She makes $18 every day."), Item.from_any(first))).reward == 1.0
    assert (await ev.score(Sample(text="She makes $16 every day."), Item.from_any(first))).reward == 0.0


def test_gsm8k_train_over_a_mib_loads_from_every_format(tmp_path: Path) -> None:
    src = gsm8k("train.jsonl")
    assert src.stat().st_size > 1_500_000
    tasks = load_file(src, fields=GSM8K)
    assert len(tasks) == 7473
    table = pa.Table.from_pylist([json.loads(line) for line in src.read_text(encoding="utf-8").splitlines()])
    pq.write_table(table, tmp_path / "train.parquet")  # one row group: several record batches
    pa_csv.write_csv(table, tmp_path / "train.csv")
    (tmp_path / "train.json").write_text(json.dumps({"data": table.to_pylist()}))
    for name in ("train.parquet", "train.csv", "train.json"):
        assert (tmp_path / name).stat().st_size > 1_500_000
        assert load_file(tmp_path / name, fields=GSM8K) == tasks


@pytest.mark.parametrize("name", ["deep.jsonl", "deep.json", "deep.csv"])
def test_json_nested_too_deeply_names_the_file_and_row_not_a_traceback(tmp_path, name):
    """A row nested 100,000 levels deep (Python's parser recurses): a DatasetError, not RecursionError."""
    deep = "[" * 100_000 + "]" * 100_000
    text = {"deep.jsonl": '{"prompt": "a", "ground_truth": 1}\n{"prompt": "b", "metadata": {"x": %s}}\n' % deep,
            "deep.json": '[{"prompt": "a", "metadata": {"x": %s}}]' % deep,
            "deep.csv": 'prompt,metadata\na,"{""x"": %s}"\n' % deep}[name]
    (tmp_path / name).write_text(text)
    where = {"deep.jsonl": r"deep\.jsonl:2", "deep.json": r"deep\.json", "deep.csv": r"deep\.csv:1: field 'metadata'"}
    with pytest.raises(DatasetError, match=where[name] + r".*nested deeper than the parser allows"):
        load_file(tmp_path / name)
