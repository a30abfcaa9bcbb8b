"""Atomic, retained checkpoints on a directory (the checkpoint volume).

Layout under ``root``::

    step-000010/            a complete checkpoint (files written by the caller, then COMPLETE)
    step-000020/
    latest                  text file: "step-000020" — written LAST, atomically

Protocol of :meth:`CheckpointManager.save`: the caller writes its files into a fresh temporary
directory ``.tmp-step-000020-a<attempt>-<random>`` (unique per trainer attempt and per save: the
PID is the same in every container); every file and the directory are fsynced; a ``COMPLETE``
marker (JSON: step, time, files) is written and fsynced; the directory is renamed to
``step-000020`` and the parent fsynced; only then is ``latest`` replaced (temp file, fsync,
rename, fsync). The pointer is the commit: a crash at any point before it is replaced leaves the
previous checkpoint as the latest, and a complete directory newer than the pointer is an
uncommitted leftover that is ignored (a later save of that very step replaces it).

A missing ``latest`` pointer, or one naming a missing or incomplete directory, falls back to the
newest complete checkpoint (a directory with a valid ``COMPLETE`` marker); nothing is deleted for
it. A save never deletes what it did not write, except: temporaries of *earlier* attempts (the
operator starts an attempt only once the previous one's pods are gone; a trainer's start also removes
its own attempt's, :meth:`CheckpointManager.remove_leftovers`), the uncommitted leftover
of the step being written, and, after the pointer moved, committed checkpoints beyond the newest
``keep_last`` (retention), except the one the ``best`` pointer names (:meth:`CheckpointManager.set_best`:
the checkpoint of the best held-out evaluation).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..progress import now_rfc3339

POINTER = "latest"
BEST = "best"
MARKER = "COMPLETE"
_NAME = re.compile(r"^step-(\d{6,})$")
_TMP = re.compile(r"^\.tmp-step-\d{6,}-a(\d+)-[0-9a-f]+$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or inconsistent; the message says which and why."""


class ResumeError(RuntimeError):
    """A checkpoint cannot be resumed by this run; the message says why and what to change (raised by
    :mod:`.state`; defined here, with no torch to import, for the commands that only catch it)."""


class CheckpointLost(ResumeError):
    """The job's progress record lists checkpoints that the checkpoint volume no longer holds (the claim
    was deleted or replaced): starting again from step 0 would silently discard the steps they held."""


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
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(6)}")
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

    def __init__(self, root: str | Path, keep_last: int = 3, attempt: int = 0) -> None:
        if keep_last < 1:
            raise ValueError(f"checkpoint.keepLast must be >= 1, got {keep_last}")
        if attempt < 0:
            raise ValueError(f"the trainer attempt must be >= 0, got {attempt}")
        self.root = Path(root)
        self.keep_last = keep_last
        self.attempt = attempt

    # ---------------------------------------------------------------- reading
    def committed(self) -> list[CheckpointInfo]:
        """Complete checkpoints no newer than the one ``latest`` names, oldest first."""
        head = self.latest()
        if head is None:
            return []
        return [c for c in self._complete() if c.step <= head.step]

    def _complete(self) -> list[CheckpointInfo]:
        """Complete checkpoints (with a valid marker), oldest first, committed or not."""
        out: list[CheckpointInfo] = []
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
        """The checkpoint the ``latest`` pointer names; when the pointer is missing, unreadable or
        names a missing or incomplete directory, the newest complete checkpoint; None when there is
        no complete checkpoint at all."""
        pointer = self.root / POINTER
        try:
            name = pointer.read_text().strip()
        except OSError:  # missing (or unreadable): fall back
            name = ""
        info = self._read_marker(self.root / name) if _NAME.match(name) else None
        if info is not None and info.step == int(name.split("-", 1)[1]):
            return info
        complete = self._complete()
        return complete[-1] if complete else None

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
        self._remove_stale_temporaries()
        name = step_dir_name(step)
        tmp = self.root / f".tmp-{name}-a{self.attempt}-{secrets.token_hex(6)}"
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
        if final.exists():  # an uncommitted leftover of this very step (newer than the pointer)
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_path(self.root)
        if before_pointer is not None:
            before_pointer()
        write_text_atomic(self.root / POINTER, name + "\n")
        self._prune()
        info = self._read_marker(final)
        assert info is not None
        return info

    def _remove_stale_temporaries(self, *, this_attempt: bool = False) -> None:
        """Delete temporary directories of earlier attempts, and of this one with ``this_attempt``
        (never a later one's, nor any temporary whose name this protocol did not produce)."""
        if not self.root.is_dir():
            return
        for d in self.root.iterdir():
            m = _TMP.match(d.name)
            if m and d.is_dir() and (int(m.group(1)) < self.attempt or (this_attempt and int(m.group(1)) == self.attempt)):
                shutil.rmtree(d, ignore_errors=True)

    def remove_leftovers(self) -> None:
        """At a trainer's start, before it writes anything: delete the temporaries of earlier processes
        of this attempt and of earlier attempts. An attempt's trainer runs again after a suspension, an
        eviction or a save cut short by SIGKILL at the end of the grace period, and each time may leave
        a partial checkpoint that no later save of the attempt would remove. The operator starts a
        trainer only once the previous one's pods are gone, so none of these is being written."""
        self._remove_stale_temporaries(this_attempt=True)

    def set_best(self, step: int) -> Path:
        """Mark committed checkpoint ``step`` as the best: retention keeps it (the ``best`` pointer,
        replaced atomically); returns its directory."""
        d = self.root / step_dir_name(step)
        info = self._read_marker(d)
        if info is None or info.step != step:
            raise CheckpointError(f"{d}: no complete checkpoint of step {step} to keep as the best")
        write_text_atomic(self.root / BEST, d.name + "\n")
        return d

    def best_step(self) -> int | None:
        """The step the ``best`` pointer names (None without one)."""
        try:
            name = (self.root / BEST).read_text().strip()
        except OSError:
            return None
        m = _NAME.match(name)
        return int(m.group(1)) if m else None

    def _prune(self) -> None:
        done = [c for c in self.committed() if c.step != self.best_step()]
        for c in done[: max(len(done) - self.keep_last, 0)]:
            shutil.rmtree(c.path, ignore_errors=True)
