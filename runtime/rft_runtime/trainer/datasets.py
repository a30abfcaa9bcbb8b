"""The tasks of ``spec.dataset``: the training sources (``dataset.train`` and each ``dataset.mix``
entry's own ``train``) and ``dataset.eval``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from rft_api.runtime import DatasetPaths
from rft_api.spec import DatasetSpec, DataSource

from ..data import DatasetError, FieldMap, Task, load_builtin, load_file, load_split

DEFAULT_BUILTIN_SIZE = 1000
UNTAGGED = "default"


def load_source(source: DataSource, where: str, path: Optional[str], config_key: str) -> list[Task]:
    """The tasks of one ``DataSource``: a builtin dataset, or ``path`` (the file the runtime config
    resolved for it, ``paths.datasets.<config_key>``); ``source.size`` bounds them."""
    if source.builtin is not None:
        tasks = load_builtin(source.builtin, source.size or DEFAULT_BUILTIN_SIZE, seed=source.seed)
    else:
        if not path:
            raise DatasetError(f"{where}: the runtime config has no file for it (paths.datasets.{config_key})")
        tasks = load_path(source, Path(path), where)
        if source.size is not None:
            tasks = tasks[: source.size]
    if not tasks:
        raise DatasetError(f"{where}: the dataset has no tasks")
    return tasks


def load_path(source: DataSource, path: Path, where: str) -> list[Task]:
    """The tasks of a file source: one file, or a directory (fetched, or on a claim) holding either a
    single data file or the files of ``source.split`` (and ``source.config``) as on the Hugging Face hub."""
    fields = FieldMap.from_mapping(source.fields.model_dump(exclude_none=True)) if source.fields else None
    fmt = source.format or "auto"
    if not path.is_dir():
        if not path.exists():
            raise DatasetError(f"{where}: {path} does not exist")
        return load_file(path, format=fmt, fields=fields, where=str(path))
    data = [p for p in path.rglob("*") if p.is_file() and p.suffix in _DATA_SUFFIXES
            and not any(part.startswith(".") for part in p.relative_to(path).parts)]
    if len(data) == 1:
        return load_file(data[0], format=fmt, fields=fields)
    return load_split(path, source.split or "train", source.config, format=fmt, fields=fields)


_DATA_SUFFIXES = {".jsonl", ".ndjson", ".json", ".parquet", ".csv", ".gz"}


def load_training_tasks(dataset: DatasetSpec, files: DatasetPaths) -> list[Task]:
    """Every training task: ``dataset.train``'s, then each ``mix`` domain's own source, tagged with that
    domain. A file row tagged with another domain is refused (a builtin dataset's own tag is replaced),
    and so is a task id that two sources share (the coordinator leases tasks by id)."""
    tasks: list[Task] = []
    owner: dict[str, str] = {}
    for where, _, src, domain in dataset.train_sources():
        key = "train" if domain is None else f"mix[{domain!r}]"
        path = files.train if domain is None else files.mix.get(domain)
        for t in load_source(src, where, path, key):
            if domain is not None and t.domain != domain:
                if src.builtin is None and t.domain != UNTAGGED:
                    raise DatasetError(f"{where}: task {t.task_id!r} is tagged domain {t.domain!r}, but this "
                                       f"source is domain {domain!r}")
                t = dataclasses.replace(t, domain=domain)
            if t.task_id in owner:
                raise DatasetError(f"{where}: task_id {t.task_id!r} is also in {owner[t.task_id]}; task ids must "
                                   "be unique across the training sources")
            owner[t.task_id] = where
            tasks.append(t)
    return tasks


def load_eval_tasks(dataset: DatasetSpec, files: DatasetPaths) -> list[Task]:
    """The tasks of ``dataset.eval`` (none when it is not set)."""
    if dataset.eval is None:
        return []
    return load_source(dataset.eval, "spec.dataset.eval", files.eval, "eval")
