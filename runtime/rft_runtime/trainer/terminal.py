"""The trainer's terminal errors: what no restart cures, told to the operator with a reason.

``rft trainer`` exits with status 2 for them and writes ``rft trainer: <Reason>: <message>`` to stderr,
which the pod's termination message carries (``FallbackToLogsOnError``); the operator fails the job with
that reason (:data:`rft_api.constants.TRAINER_TERMINAL_REASONS`). Everything else is a crash that
spends a restart. No torch here: ``rft run``'s driver imports it.
"""

from __future__ import annotations

import errno
from typing import Optional

from rft_api.constants import TRAINER_REASON_PREFIX

from ..data import DatasetError
from ..model.loading import ModelLoadError
from .checkpoint import CheckpointLost, ResumeError
from .finite import NonFiniteTraining, NonFiniteWeights

__all__ = ["TERMINAL_EXIT", "disk_full", "terminal_reason", "terminal_line"]

TERMINAL_EXIT = 2

_REASONS: tuple[tuple[type[BaseException], str], ...] = (
    (CheckpointLost, "CheckpointLost"),  # before its base, ResumeError
    (ResumeError, "CannotResume"),
    (NonFiniteTraining, "NonFiniteTraining"),
    (NonFiniteWeights, "NonFiniteWeights"),
    (DatasetError, "InvalidDataset"),
    (ModelLoadError, "ModelLoadFailed"),
)
_FULL = (errno.ENOSPC, errno.EDQUOT)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: Optional[BaseException] = exc
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def disk_full(exc: BaseException) -> bool:
    """``exc`` (or what caused it) is a volume out of space or quota; torch's distributed checkpoint
    reports a rank's failure as text, so the message counts too."""
    return any((isinstance(e, OSError) and e.errno in _FULL) or "No space left on device" in str(e)
               or "Disk quota exceeded" in str(e) for e in _chain(exc))


def terminal_reason(exc: BaseException) -> Optional[str]:
    """The reason of a terminal error, or None for one a restart may cure."""
    for cls, reason in _REASONS:
        if isinstance(exc, cls):
            return reason
    if disk_full(exc):
        return "CheckpointVolumeFull"
    return None


def terminal_line(reason: str, exc: BaseException) -> str:
    """The line the operator reads: ``rft trainer: <reason>: <message>``."""
    msg = str(exc)
    if reason == "CheckpointVolumeFull":
        msg = (f"the checkpoint volume is full ({msg.splitlines()[0][:300] if msg else type(exc).__name__}): no "
               "checkpoint or publication can be written, and a restart would find it as full; raise "
               "checkpoint.size, lower checkpoint.keepLast, or free space on checkpoint.existingClaim")
    return f"{TRAINER_REASON_PREFIX}{reason}: {msg}"
