"""The tasks of ``spec.dataset.train`` / ``spec.dataset.eval``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..data import DatasetError, Task, load_builtin, load_jsonl

DEFAULT_BUILTIN_SIZE = 1000


def load_tasks(source: Any, role: str, files: dict[str, str] | None = None) -> list[Task]:
    """The tasks of a ``DataSource`` (``role`` is ``train`` or ``eval``, used in errors and to find
    a mounted ConfigMap file in ``files``); ``source.size`` bounds them."""
    where = f"spec.dataset.{role}"
    if source.builtin is not None:
        tasks = load_builtin(source.builtin, source.size or DEFAULT_BUILTIN_SIZE, seed=source.seed)
    elif source.path is not None:
        path = Path(source.path)
        if not path.is_absolute():
            if source.volume is None:
                raise DatasetError(f"{where}.path: {source.path!r} is relative but {where}.volume is not set")
            path = Path(source.volume.mount_path) / path
        tasks = load_jsonl(path)
    else:
        f = (files or {}).get(role)
        if not f:
            raise DatasetError(f"{where}.configMapKeyRef: no mounted file for it (config paths.datasets.{role})")
        tasks = load_jsonl(f)
    if source.size is not None and source.builtin is None:
        tasks = tasks[: source.size]
    if not tasks:
        raise DatasetError(f"{where}: the dataset has no tasks")
    return tasks
