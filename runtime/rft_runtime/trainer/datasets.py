"""The tasks of ``spec.dataset.train`` / ``spec.dataset.eval``."""

from __future__ import annotations

from rft_api.runtime import DatasetPaths
from rft_api.spec import DataSource

from ..data import DatasetError, Task, load_builtin, load_jsonl

DEFAULT_BUILTIN_SIZE = 1000


def load_tasks(source: DataSource, role: str, files: DatasetPaths) -> list[Task]:
    """The tasks of a ``DataSource`` (``role`` is ``train`` or ``eval``): a builtin dataset, or the
    file the runtime config resolved for it (``paths.datasets.<role>``); ``source.size`` bounds them."""
    where = f"spec.dataset.{role}"
    if source.builtin is not None:
        tasks = load_builtin(source.builtin, source.size or DEFAULT_BUILTIN_SIZE, seed=source.seed)
    else:
        path = getattr(files, role)
        if not path:
            raise DatasetError(f"{where}: the runtime config has no file for it (paths.datasets.{role})")
        tasks = load_jsonl(path)
        if source.size is not None:
            tasks = tasks[: source.size]
    if not tasks:
        raise DatasetError(f"{where}: the dataset has no tasks")
    return tasks
