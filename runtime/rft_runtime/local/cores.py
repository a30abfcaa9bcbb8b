"""Which cores each role's processes run on in a one-machine ``rft run`` (the policy), and pinning a
process to them.

When generation overlaps training (``rollout.maxStaleness`` > 0), the trainer's step is the loop's
critical path and the inference server, the rollout workers and the trainer all compute at once. Left
to the kernel's scheduler on a small machine, the trainer's thread is moved between cores and shares
its core with the others' bursts of work, and its step gets longer. Given cores of its own, it keeps
its speed: on the 2-core development VM the sample job's ``time/train`` at ``maxStaleness`` 1 went
from 0.22-0.23 s to 0.19 s (the synchronous run's is 0.18 s), and the step from 0.24-0.27 s to
0.22 s. So :func:`role_cores` gives the trainer's processes ``threads``
cores each and the other roles the rest.

A synchronous run (``maxStaleness`` 0) is not pinned: its roles take turns, and generation is then
free to use every core. Nor is a machine where the trainer could not have a core to itself with one
left for the others, nor a Ray cluster (Ray places the actors; ``rft run --address``), nor a run with
``rft run --no-pin-cores``.

Several ``rft run`` processes on one machine: each claims its trainer's cores in a registry,
:func:`claimed_role_cores` (a directory of one file per live claim, ``$RFT_CORE_REGISTRY`` or
``<tmp>/rft-cores-<uid>``, read and written under a lock). A run plans on the cores that no other live
run's trainer holds, so two trainers never share a core and no run's other roles sit on another's
trainer cores; where too few are left it is not pinned (and says so). A claim goes with its run, or
with its process when that is killed (a claim whose process is gone, or whose pid now names another
process, counts for nothing and is removed).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)

REGISTRY_ENV = "RFT_CORE_REGISTRY"


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


def registry_dir() -> Path:
    """Where the ``rft run`` processes of this machine (of this user) claim their trainer cores."""
    return Path(os.environ.get(REGISTRY_ENV) or Path(tempfile.gettempdir()) / f"rft-cores-{os.getuid()}")


def _start_time(pid: int) -> str | None:
    """The process's start time (in clock ticks since boot, /proc/<pid>/stat), None where it is gone:
    with the pid it names one process, even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _live_claims(registry: Path) -> set[int]:
    """The cores claimed by runs whose process lives; the files of the others are removed."""
    taken: set[int] = set()
    for f in registry.glob("*.json"):
        try:
            claim = json.loads(f.read_text())
            alive = claim["start"] is not None and _start_time(int(claim["pid"])) == claim["start"]
            cores = {int(c) for c in claim["cores"]}
        except (OSError, ValueError, KeyError, TypeError):
            alive, cores = False, set()
        if alive:
            taken |= cores
        else:
            f.unlink(missing_ok=True)
    return taken


@contextlib.contextmanager
def _locked(registry: Path) -> Iterator[None]:
    import fcntl

    with open(registry / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def claimed_role_cores(available: Iterable[int], *, max_staleness: int, trainer_processes: int, threads: int,
                       registry: Path | None = None) -> Iterator[dict[str, tuple[int, ...]] | None]:
    """:func:`role_cores` on the cores that no other live run's trainer holds, the plan's trainer cores
    claimed for as long as the block runs (see the module). Yields None where nothing is pinned."""
    cpus = set(available)
    if max_staleness <= 0 or not cpus:
        yield None
        return
    registry = registry or registry_dir()
    pid, claim = os.getpid(), None
    try:
        start = _start_time(pid)
        if start is None:
            raise OSError("no /proc to tell a live claim from a dead one")
        registry.mkdir(mode=0o700, parents=True, exist_ok=True)
        with _locked(registry):
            taken = _live_claims(registry)
            plan = role_cores(cpus - taken, max_staleness=max_staleness, trainer_processes=trainer_processes,
                              threads=threads)
            if plan:
                claim = registry / f"{pid}-{uuid.uuid4().hex[:8]}.json"
                claim.write_text(json.dumps({"pid": pid, "start": start, "cores": list(plan["trainer"])}))
    except OSError as e:  # a registry this process cannot use: plan alone
        log.warning("core registry %s unusable (%s): planning without the other runs' claims", registry, e)
        taken = set()
        plan = role_cores(cpus, max_staleness=max_staleness, trainer_processes=trainer_processes, threads=threads)
    if plan is None and taken & cpus:
        log.warning("cores not pinned: %s hold the trainers of other runs on this machine, too few are left",
                    ",".join(map(str, sorted(taken & cpus))))
    try:
        yield plan
    finally:
        if claim is not None:
            claim.unlink(missing_ok=True)
