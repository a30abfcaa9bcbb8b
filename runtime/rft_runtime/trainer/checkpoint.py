"""Atomic, retained checkpoints on a directory (the checkpoint volume).

Layout under ``root``::

    step-000010/            a complete checkpoint (files written by the caller, then COMPLETE)
    step-000020/
    latest                  text file: "step-000020" — written LAST, atomically

Protocol of :meth:`CheckpointManager.save`: the caller writes its files into a fresh temporary
directory ``.tmp-step-000020-<pid>``; every file and the directory are fsynced; a ``COMPLETE``
marker (JSON: step, time, files) is written and fsynced; the directory is renamed to
``step-000020`` and the parent fsynced; only then is ``latest`` replaced (temp file, fsync,
rename, fsync). The pointer is the commit: a crash at any point before it is replaced leaves the
previous checkpoint as the latest, and a complete directory newer than the pointer is an
uncommitted leftover that is ignored (and removed by the next save, with stale temporary
directories). After the pointer moved, committed checkpoints beyond the newest ``keep_last`` are
deleted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..progress import now_rfc3339

POINTER = "latest"
MARKER = "COMPLETE"
_NAME = re.compile(r"^step-(\d{6,})$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or inconsistent; the message says which and why."""


def step_dir_name(step: int) -> str:
    """``step-000010`` for step 10."""
    return f"step-{step:06d}"


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """fsync every file and directory under ``path`` (and ``path`` itself)."""
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            _fsync_path(Path(dirpath) / f)
        _fsync_path(Path(dirpath))


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (temp file, fsync, rename, fsync of the dir)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_path(path.parent)


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete checkpoint."""

    step: int
    path: Path
    time: str


class CheckpointManager:
    """Saves, finds and prunes checkpoints under ``root`` (see the module docstring)."""

    def __init__(self, root: str | Path, keep_last: int = 3) -> None:
        if keep_last < 1:
            raise ValueError(f"checkpoint.keepLast must be >= 1, got {keep_last}")
        self.root = Path(root)
        self.keep_last = keep_last

    # ---------------------------------------------------------------- reading
    def committed(self) -> list[CheckpointInfo]:
        """Complete checkpoints no newer than the one ``latest`` names, oldest first."""
        head = self.latest()
        if head is None:
            return []
        return [c for c in self._complete() if c.step <= head.step]

    def _complete(self) -> list[CheckpointInfo]:
        """Complete checkpoints (with a valid marker), oldest first, committed or not."""
        out = []
        if not self.root.is_dir():
            return out
        for d in self.root.iterdir():
            m = _NAME.match(d.name)
            if not m or not d.is_dir():
                continue
            info = self._read_marker(d)
            if info is not None and info.step == int(m.group(1)):
                out.append(info)
        return sorted(out, key=lambda c: c.step)

    def latest(self) -> CheckpointInfo | None:
        """The checkpoint the ``latest`` pointer names; None when there is no pointer.

        Raises :class:`CheckpointError` when the pointer names a missing or incomplete checkpoint.
        """
        pointer = self.root / POINTER
        if not pointer.exists():
            return None
        name = pointer.read_text().strip()
        if not _NAME.match(name):
            raise CheckpointError(f"{pointer}: names {name!r}, which is not a checkpoint directory")
        info = self._read_marker(self.root / name)
        if info is None:
            raise CheckpointError(f"{pointer}: names {name}, which is missing or incomplete (no {MARKER})")
        return info

    def _read_marker(self, d: Path) -> CheckpointInfo | None:
        marker = d / MARKER
        if not marker.is_file():
            return None
        try:
            data = json.loads(marker.read_text())
            return CheckpointInfo(int(data["step"]), d, str(data.get("time", "")))
        except (ValueError, KeyError, TypeError):
            return None

    # ---------------------------------------------------------------- writing
    def save(self, step: int, write: Callable[[Path], None],
             before_pointer: Callable[[], None] | None = None) -> CheckpointInfo:
        """Write checkpoint ``step`` with ``write(tmp_dir)``; returns it once ``latest`` names it.

        ``before_pointer`` (tests) runs after the directory is complete and before the pointer
        moves: raising there simulates a crash at the worst moment.
        """
        if step < 0:
            raise CheckpointError(f"checkpoint step must be >= 0, got {step}")
        self.root.mkdir(parents=True, exist_ok=True)
        current = self.latest()
        if current is not None and step < current.step:
            raise CheckpointError(f"checkpoint step {step} is older than the latest ({current.step}): "
                                  "the step counter may not go backwards")
        if current is not None and step == current.step:
            return current  # the state of a step is unique: it is already committed
        self._remove_uncommitted(current.step if current is not None else -1)
        name = step_dir_name(step)
        tmp = self.root / f".tmp-{name}-{os.getpid()}"
        tmp.mkdir()
        try:
            write(tmp)
            files = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())
            (tmp / MARKER).write_text(json.dumps({"step": step, "time": now_rfc3339(), "files": files}))
            fsync_tree(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        final = self.root / name
        os.rename(tmp, final)
        _fsync_path(self.root)
        if before_pointer is not None:
            before_pointer()
        write_text_atomic(self.root / POINTER, name + "\n")
        self._prune()
        info = self._read_marker(final)
        assert info is not None
        return info

    def _remove_uncommitted(self, head_step: int) -> None:
        """Delete temporaries and step directories newer than the pointer (a crashed timeline)."""
        for d in self.root.iterdir():
            m = _NAME.match(d.name)
            stale_tmp = d.name.startswith(".tmp-step-")
            if d.is_dir() and (stale_tmp or (m and int(m.group(1)) > head_step)):
                shutil.rmtree(d, ignore_errors=True)

    def _prune(self) -> None:
        done = self.committed()
        for c in done[: max(len(done) - self.keep_last, 0)]:
            shutil.rmtree(c.path, ignore_errors=True)
