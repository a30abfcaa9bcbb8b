"""Container processes of the process kubelet (TEST INFRASTRUCTURE): start, find, signal, reap.

A container is the process started through ``e2e/podexec.py`` (its own session and process group)
plus everything it spawns. Its members are found three ways at once, so nothing escapes:

- the container's cgroup in the cgroup-v1 ``pids`` hierarchy (``/sys/fs/cgroup/pids/rft-kubelet-*``)
  when that hierarchy is writable: podexec joins it before ``exec``, so even daemons that call
  ``setsid`` and get re-parented stay in it;
- its process group;
- the descendants of its main process (by ``/proc/*/stat`` parent ids).

When the main process exits, leftovers are SIGKILLed (a container ends with its init process).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

PIDS_HIERARCHY = Path("/sys/fs/cgroup/pids")


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rindex(")") + 2:].split()  # [0] state, [1] ppid, [2] pgrp, [19] starttime


def _snapshot() -> dict[int, tuple[str, int, int]]:
    """``{pid: (state, ppid, pgrp)}`` of every live process."""
    out = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st:
                out[int(entry.name)] = (st[0], int(st[1]), int(st[2]))
    return out


def start_time(pid: int) -> str | None:
    st = _stat(pid)
    return st[19] if st else None


class CgroupRoot:
    """This kubelet's directory in the ``pids`` hierarchy, or an inert stand-in when unavailable."""

    def __init__(self, name: str) -> None:
        self.path: Path | None = PIDS_HIERARCHY / name
        try:
            self.path.mkdir(exist_ok=True)
        except OSError:
            self.path = None

    def child(self, name: str) -> Path | None:
        if self.path is None:
            return None
        p = self.path / name
        try:
            p.mkdir(exist_ok=True)
        except OSError:
            return None
        return p

    def remove(self) -> None:
        if self.path is not None:
            for child in list(self.path.iterdir()) if self.path.exists() else []:
                if child.is_dir():
                    _rmdir(child)
            _rmdir(self.path)


def reap_dead_kubelets() -> list[int]:
    """SIGKILL what is left in the cgroups of process kubelets whose own process is gone (a test
    session that crashed); returns the pids killed. Cgroup roots are named ``rft-kubelet-<pid>-*``."""
    killed: list[int] = []
    if not PIDS_HIERARCHY.is_dir():
        return killed
    for root in PIDS_HIERARCHY.glob("rft-kubelet-*"):
        parts = root.name.split("-")
        if len(parts) < 3 or not parts[2].isdigit() or Path(f"/proc/{parts[2]}").exists():
            continue
        for cg in [*(p for p in root.iterdir() if p.is_dir()), root]:
            try:
                pids = [int(x) for x in (cg / "cgroup.procs").read_text().split()]
            except OSError:
                continue
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5
        for cg in [*(p for p in root.iterdir() if p.is_dir()), root]:
            while time.monotonic() < deadline and cg.exists():
                try:
                    cg.rmdir()
                except OSError:
                    time.sleep(0.05)
    return killed


def _rmdir(path: Path) -> None:
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)


@dataclass
class ContainerProcess:
    """One running (or finished) container instance."""

    popen: subprocess.Popen
    cgroup: Path | None
    started: float  # wall clock

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        """The exit status as Kubernetes reports it (``128 + signal`` when killed), or None."""
        rc = self.popen.poll()
        if rc is None:
            return None
        return 128 - rc if rc < 0 else rc

    def members(self) -> set[int]:
        """Live (non-zombie) processes of this container, the main one included while it runs."""
        procs = _snapshot()
        found: set[int] = set()
        if self.cgroup is not None:
            try:
                found.update(int(x) for x in (self.cgroup / "cgroup.procs").read_text().split())
            except OSError:
                pass
        found.update(p for p, (_, _, pgrp) in procs.items() if pgrp == self.pid)
        children: dict[int, list[int]] = {}
        for p, (_, ppid, _) in procs.items():
            children.setdefault(ppid, []).append(p)
        stack = [self.pid] if self.pid in procs else []
        while stack:
            p = stack.pop()
            found.add(p)
            stack.extend(children.get(p, []))
        return {p for p in found if p in procs and procs[p][0] != "Z"}

    def signal_all(self, sig: int) -> None:
        for p in self.members():
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def gone(self) -> bool:
        self.popen.poll()
        return not self.members()

    def terminate(self, grace_s: float, kill_wait_s: float = 10.0) -> int | None:
        """SIGTERM everything, SIGKILL what is left after ``grace_s``; returns the exit status.

        Raises ``RuntimeError`` naming the pids when processes survive SIGKILL for ``kill_wait_s``."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
            if self.gone():
                break
            self.signal_all(sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and not self.gone():
                time.sleep(0.05)
        if not self.gone():
            raise RuntimeError(f"container processes {sorted(self.members())} survived SIGKILL")
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.release()
        return self.poll()

    def kill_leftovers(self) -> None:
        """After the main process exited: SIGKILL whatever it left running, reap, drop the cgroup."""
        self.terminate(0.0)

    def release(self) -> None:
        if self.cgroup is not None:
            _rmdir(self.cgroup)


def launch(argv: list[str], *, log_path: Path, env: dict[str, str], cgroup: Path | None) -> ContainerProcess:
    """Start ``argv`` (podexec) in its own session, stdout+stderr appended to ``log_path``."""
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                 start_new_session=True, close_fds=True)
    return ContainerProcess(popen, cgroup, time.time())
