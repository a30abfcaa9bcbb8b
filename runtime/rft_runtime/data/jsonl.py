"""Datasets from JSONL files.

One JSON object per line with ``messages`` (chat messages) or ``prompt`` (a string), plus
``ground_truth`` (required key; any JSON value, ``null`` allowed for judge-only tasks). Optional:
``task_id`` or ``id`` (default ``{file stem}-{line number}``), ``domain``, ``metadata``; any other
keys are kept in ``metadata``. Blank lines are skipped. Errors name the file, the line and the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .task import TOO_DEEP, DatasetError, Task

__all__ = ["load_jsonl", "parse_jsonl_row", "write_jsonl"]

_KNOWN = {"task_id", "id", "messages", "prompt", "ground_truth", "domain", "metadata"}


def parse_jsonl_row(row: Any, where: str, default_id: str, domain: str | None = None) -> Task:
    """Turn one decoded JSONL object into a :class:`Task`; ``where`` prefixes error messages."""
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type(row).__name__}")
    has_messages, has_prompt = "messages" in row, "prompt" in row
    if has_messages == has_prompt:
        raise DatasetError(f"{where}: exactly one of field 'messages' or field 'prompt' is required")
    if has_prompt and not isinstance(row["prompt"], str):
        raise DatasetError(f"{where}: field 'prompt' must be a string")
    if "ground_truth" not in row:
        raise DatasetError(f"{where}: field 'ground_truth' is required")
    task_id = row.get("task_id", row.get("id", default_id))
    if isinstance(task_id, int) and not isinstance(task_id, bool):
        task_id = str(task_id)
    if not isinstance(task_id, str) or not task_id:
        raise DatasetError(f"{where}: field 'task_id' must be a non-empty string")
    metadata = row.get("metadata", {})
    if not isinstance(metadata, dict):
        raise DatasetError(f"{where}: field 'metadata' must be an object")
    extra = {k: v for k, v in row.items() if k not in _KNOWN}
    row_domain = row.get("domain", domain or "default")
    if not isinstance(row_domain, str) or not row_domain:
        raise DatasetError(f"{where}: field 'domain' must be a non-empty string")
    try:
        return Task(
            task_id=task_id,
            messages=row.get("messages"),
            prompt=row.get("prompt"),
            ground_truth=row["ground_truth"],
            domain=row_domain,
            metadata={**extra, **metadata},
        )
    except DatasetError as e:
        # Task's own checks name the field; re-prefix with the file position.
        msg = str(e).split(": ", 1)[-1]
        raise DatasetError(f"{where}: {msg}") from None


def load_jsonl(path: str | Path, *, domain: str | None = None) -> list[Task]:
    """Load tasks from a JSONL file; ``domain`` is the default for rows without one.

    Raises :class:`DatasetError` naming ``path:line`` and the field for malformed rows,
    and for duplicate task ids.
    """
    path = Path(path)
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    with path.open("r", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{where}: invalid JSON: {e.msg} (column {e.colno})") from None
            except RecursionError:
                raise DatasetError(f"{where}: {TOO_DEEP}") from None
            task = parse_jsonl_row(row, where, f"{path.stem}-{lineno}", domain)
            if task.task_id in seen:
                raise DatasetError(
                    f"{where}: field 'task_id' {task.task_id!r} duplicates line {seen[task.task_id]}"
                )
            seen[task.task_id] = lineno
            tasks.append(task)
    return tasks


def write_jsonl(tasks: list[Task], path: str | Path) -> Path:
    """Write tasks in the format :func:`load_jsonl` reads back (round-trip exact)."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        for t in tasks:
            f.write(json.dumps(t.to_dict(), ensure_ascii=False) + "\n")
    return path
