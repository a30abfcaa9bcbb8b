"""Which cores each role's processes run on in a one-machine ``rft run`` (the policy), and pinning a
process to them.

When generation overlaps training (``rollout.maxStaleness`` > 0), the trainer's step is the loop's
critical path and the inference server, the rollout workers and the trainer all compute at once. Left
to the kernel's scheduler on a small machine, the trainer's thread is moved between cores and shares
its core with the others' bursts of work, and its step gets longer. Given cores of its own, it keeps
its speed: on the 2-core development VM the sample job's ``time/train`` at ``maxStaleness`` 1 went
from 0.22-0.23 s to 0.19 s (the synchronous run's is 0.18 s), and the step from 0.24-0.27 s to
0.22 s (docs/trainer.md, session 31). So :func:`role_cores` gives the trainer's processes ``threads``
cores each and the other roles the rest.

A synchronous run (``maxStaleness`` 0) is not pinned: its roles take turns, and generation is then
free to use every core. Nor is a machine where the trainer could not have a core to itself with one
left for the others, nor a Ray cluster (Ray places the actors; ``rft run --address``), nor a run with
``rft run --no-pin-cores``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

log = logging.getLogger(__name__)


def available_cores() -> frozenset[int]:
    """The cores this process may run on (its affinity: a container's or ``taskset``'s limit)."""
    getter = getattr(os, "sched_getaffinity", None)
    return frozenset(getter(0)) if getter is not None else frozenset()


def role_cores(available: Iterable[int], *, max_staleness: int, trainer_processes: int,
               threads: int) -> dict[str, tuple[int, ...]] | None:
    """The cores of each role's processes (``trainer``, ``inference``, ``rollout``), or None where
    nothing is pinned (see the module): the trainer's ``trainer_processes`` processes of ``threads``
    torch threads get that many cores, the lowest-numbered, and the inference servers and rollout
    workers share the others."""
    cpus = sorted(set(available))
    need = max(1, trainer_processes) * max(1, threads)
    if max_staleness <= 0 or need >= len(cpus):
        return None
    trainer, rest = tuple(cpus[:need]), tuple(cpus[need:])
    return {"trainer": trainer, "inference": rest, "rollout": rest}


def pin_process(cpus: Iterable[int]) -> bool:
    """Keep every thread of this process (threads started later inherit it from theirs) on ``cpus``;
    False, logged, where the system refuses it (then the process runs where it did)."""
    setter = getattr(os, "sched_setaffinity", None)
    cpus = set(cpus)
    if setter is None or not cpus:
        return False
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    try:
        for tid in tids:
            try:
                setter(tid, cpus)
            except ProcessLookupError:  # a thread that ended meanwhile
                pass
    except OSError as e:
        log.warning("could not keep this process on cores %s: %s", sorted(cpus), e)
        return False
    return True
