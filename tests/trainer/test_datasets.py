"""The training tasks of ``spec.dataset``: ``dataset.train`` plus each ``dataset.mix`` domain's own
source, tagged with its domain, with clear errors for mis-tagged rows and shared task ids."""

from __future__ import annotations

import json

import pytest

from rft_api.runtime import DatasetPaths
from rft_api.spec import DatasetSpec
from rft_runtime.data import DataCursor, DatasetError, DomainMixCursor
from rft_runtime.trainer.datasets import load_eval_tasks, load_training_tasks


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _spec(**kw) -> DatasetSpec:
    return DatasetSpec.model_validate(kw)


def test_every_domain_from_its_own_source(tmp_path):
    words = _jsonl(tmp_path / "words.jsonl", [{"task_id": "w1", "prompt": "one more than 2?", "ground_truth": "3"},
                                              {"task_id": "w2", "domain": "words", "prompt": "two?", "ground_truth": "2"}])
    base = _jsonl(tmp_path / "train.jsonl", [{"task_id": "c1", "domain": "code", "prompt": "print 1", "ground_truth": "1"}])
    spec = _spec(train={"configMapKeyRef": {"name": "t", "key": "train.jsonl"}},
                 mix=[{"domain": "code", "weight": 1},
                      {"domain": "arith", "weight": 2, "train": {"builtin": "arithmetic", "size": 4, "seed": 3}},
                      {"domain": "words", "weight": 1, "train": {"configMapKeyRef": {"name": "t", "key": "w.jsonl"}}}])
    tasks = load_training_tasks(spec, DatasetPaths(train=base, mix={"words": words}))
    assert [(t.task_id, t.domain) for t in tasks[:1] + tasks[-2:]] == [("c1", "code"), ("w1", "words"), ("w2", "words")]
    arith = [t for t in tasks if t.domain == "arith"]
    assert len(arith) == 4 and len(tasks) == 7  # the builtin's own tag (math) replaced by the domain's
    cursor = DomainMixCursor(tasks, [(m.domain, m.weight) for m in spec.mix], seed=spec.order_seed())
    assert cursor.counts(8) == {"code": 2, "arith": 4, "words": 2}
    assert spec.order_seed() == 0 and load_eval_tasks(spec, DatasetPaths()) == []


def test_without_dataset_train_the_first_source_seeds_the_order(tmp_path):
    spec = _spec(mix=[{"domain": "a", "weight": 1, "train": {"builtin": "arithmetic", "size": 5, "seed": 7}},
                      {"domain": "b", "weight": 1, "train": {"builtin": "arithmetic", "size": 5, "seed": 8}}])
    assert spec.order_seed() == 7
    tasks = load_training_tasks(spec, DatasetPaths())
    assert [t.domain for t in tasks] == ["a"] * 5 + ["b"] * 5
    assert len(DataCursor(tasks, seed=spec.order_seed()).next_batch(10)) == 10
    same = _spec(mix=[{"domain": "a", "weight": 1, "train": {"builtin": "arithmetic", "size": 5, "seed": 7}},
                      {"domain": "b", "weight": 1, "train": {"builtin": "arithmetic", "size": 3, "seed": 7}}])
    with pytest.raises(DatasetError, match=r"spec.dataset.mix\[1\].train: task_id 'arithmetic-s7-0' is also in "
                                           r"spec.dataset.mix\[0\].train"):
        load_training_tasks(same, DatasetPaths())  # the same generator and seed name their tasks alike


def test_a_row_tagged_with_another_domain_is_refused(tmp_path):
    words = _jsonl(tmp_path / "w.jsonl", [{"task_id": "w1", "domain": "code", "prompt": "p", "ground_truth": "1"}])
    spec = _spec(mix=[{"domain": "words", "weight": 1, "train": {"configMapKeyRef": {"name": "t", "key": "w.jsonl"}}}])
    with pytest.raises(DatasetError, match=r"spec.dataset.mix\[0\].train: task 'w1' is tagged domain 'code', but "
                                           r"this source is domain 'words'"):
        load_training_tasks(spec, DatasetPaths(mix={"words": words}))
    with pytest.raises(DatasetError, match=r"spec.dataset.mix\[0\].train: the runtime config has no file for it"):
        load_training_tasks(spec, DatasetPaths())


def test_dataset_train_is_required_unless_every_domain_has_a_source():
    with pytest.raises(ValueError, match="dataset.train is required unless every dataset.mix entry has its own"):
        _spec(mix=[{"domain": "a", "weight": 1, "train": {"builtin": "arithmetic"}}, {"domain": "b", "weight": 1}])
    with pytest.raises(ValueError, match="dataset.train is required"):
        _spec()
