"""Container launcher of the process kubelet (TEST INFRASTRUCTURE, stdlib only, Linux, root).

``ProcessKubelet`` starts every container as ``python -I -S e2e/podexec.py run SPEC.json``; this
process then becomes the container's main process:

1. joins the container's pids cgroup (when the spec names one), so that every descendant can be
   found and killed later, also ones that leave the process group;
2. asks the kernel to SIGKILL it when the kubelet thread that started it dies (``PR_SET_PDEATHSIG``);
3. enters a private mount namespace (``unshare(CLONE_NEWNS)``, then ``/`` made ``rprivate`` so no
   mount leaks back to the host);
4. opens every mount source (``O_PATH``) *before* mounting anything, so a volume mounted at ``/tmp``
   cannot hide the sources of later mounts (the kubelet's workdir often lives under ``/tmp``), then
   bind-mounts each volume at its mount path (parents first; a missing mount point is created:
   ``mkdir`` is NOT namespaced, so such directories/files stay on the host root file system as
   empty mount points); binds the image's own directories (``preserve``)
   back over any volume that would hide them (an emptyDir at ``/tmp`` over a venv in ``/tmp``) and
   the per-pod hosts file on ``/etc/hosts``; then remounts read-only the volumes so marked and,
   with ``readOnlyRoot``, the root mount itself (``readOnlyRootFilesystem``) — last, so that mount
   points of nested volumes can still be created;
5. changes to the working directory (created when missing, as container runtimes do) and
   ``execve``s the command with exactly the environment in the spec, looked up on the spec's PATH.

A failure before ``execve`` writes one line to ``errorFile`` and exits with :data:`START_ERROR`
(the kubelet reports it as ``StartError``, like containerd).

``python -I -S e2e/podexec.py enter PID SPEC.json`` runs a command (exec probes) inside the mount
namespace of process ``PID`` with the spec's ``env``, ``cwd`` and ``argv``.

Spec (JSON)::

    {"argv": [...], "env": {...}, "cwd": "/", "mounts": [{"source", "target", "readOnly"}],
     "hosts": "/path/hosts" | null, "preserve": ["/image/root", ...], "readOnlyRoot": bool,
     "cgroup": "/sys/fs/cgroup/pids/..." | null, "parentPid": int, "errorFile": "/path/err"}
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

START_ERROR = 128
CLONE_NEWNS = 0x00020000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
PR_SET_PDEATHSIG = 1
O_PATH = getattr(os, "O_PATH", 0o10000000)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p)


class LaunchError(Exception):
    """Setting up the container failed before ``execve``."""


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise LaunchError(f"{what}: {os.strerror(err)} (errno {err})")


def _mount(source: str | None, target: str, flags: int) -> None:
    _check(_libc.mount(source.encode() if source else None, target.encode(), None, flags, None),
           f"mount {source or ''} -> {target} (flags {flags:#x})")


def _mount_flags(path: str) -> int:
    """Per-mount flags (nosuid, nodev, noexec) of the mount holding ``path``: a read-only bind remount
    must repeat them or the kernel refuses it."""
    st = os.statvfs(path)
    flags = 0
    for bit, name in ((MS_NOSUID, "ST_NOSUID"), (MS_NODEV, "ST_NODEV"), (MS_NOEXEC, "ST_NOEXEC")):
        if st.f_flag & getattr(os, name, 0):
            flags |= bit
    return flags


def _remount_read_only(path: str) -> None:
    _mount(None, path, MS_REMOUNT | MS_BIND | MS_RDONLY | _mount_flags(path))


def _ensure_mount_point(target: str, is_dir: bool) -> None:
    if os.path.lexists(target):
        return
    if is_dir:
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target) or "/", exist_ok=True)
        with open(target, "a"):
            pass


def _depth(path: str) -> int:
    return len([p for p in os.path.normpath(path).split("/") if p])


def _join_cgroup(cgroup: str | None) -> None:
    if cgroup:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))


def _die_with_parent(parent: int | None) -> None:
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    if parent and os.getppid() != parent:  # the kubelet died before the prctl took effect
        raise LaunchError(f"parent {parent} is gone")


def _which(cmd: str, env: dict[str, str]) -> str:
    if "/" in cmd:
        if not os.path.exists(cmd):
            raise LaunchError(f'exec: "{cmd}": stat {cmd}: no such file or directory')
        return cmd
    for d in env.get("PATH", "").split(":"):
        cand = os.path.join(d or ".", cmd)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    raise LaunchError(f'exec: "{cmd}": executable file not found in $PATH')


def setup_mounts(spec: dict) -> None:
    """Enter a private mount namespace and mount the spec's volumes, hosts file and read-only root."""
    mounts = sorted(spec.get("mounts", []), key=lambda m: _depth(m["target"]))  # stable: parents first
    # The namespace first: a bind source must be a mount of the caller's namespace. The O_PATH fds
    # taken next keep pointing at the sources even after a later mount covers their paths.
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", MS_REC | MS_PRIVATE)
    fds = []
    for m in mounts:
        try:
            fds.append(os.open(m["source"], O_PATH | os.O_CLOEXEC))
        except OSError as e:
            raise LaunchError(f"volume source {m['source']} for {m['target']}: {e.strerror}") from e
    hosts_fd = os.open(spec["hosts"], O_PATH | os.O_CLOEXEC) if spec.get("hosts") else None
    # Image paths (a venv) that a volume mount would hide, e.g. an emptyDir at /tmp over /tmp/venv.
    targets = [os.path.normpath(m["target"]) for m in mounts]
    keep = [(p, os.open(p, O_PATH | os.O_CLOEXEC)) for p in spec.get("preserve", [])
            if os.path.exists(p) and any(p.startswith(t.rstrip("/") + "/") for t in targets)]

    for m, fd in zip(mounts, fds):
        target = m["target"]
        src = f"/proc/self/fd/{fd}"
        _ensure_mount_point(target, os.path.isdir(src))
        _mount(src, target, MS_BIND | MS_REC)
    for path, fd in keep:
        src = f"/proc/self/fd/{fd}"
        _ensure_mount_point(path, os.path.isdir(src))
        _mount(src, path, MS_BIND | MS_REC)
        fds.append(fd)
    if hosts_fd is not None:
        _mount(f"/proc/self/fd/{hosts_fd}", "/etc/hosts", MS_BIND)
    cwd = spec.get("cwd") or "/"
    if not os.path.isdir(cwd):
        os.makedirs(cwd, exist_ok=True)
    # Read-only last, so that mount points of nested volumes (an emptyDir inside a configMap
    # volume's path) could still be created.
    for m in mounts:
        if m.get("readOnly"):
            _remount_read_only(m["target"])
    if spec.get("readOnlyRoot"):
        _remount_read_only("/")
    for fd in [*fds, *([hosts_fd] if hosts_fd is not None else [])]:
        os.close(fd)


def _setns(pid: int) -> None:
    fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc.setns(fd, CLONE_NEWNS), f"setns(mount namespace of {pid})")
    finally:
        os.close(fd)


def _exec(spec: dict) -> None:
    env = {str(k): str(v) for k, v in spec["env"].items()}
    argv = [str(a) for a in spec["argv"]]
    if not argv:
        raise LaunchError("no command: the container has neither command nor args and the image has no entrypoint")
    os.chdir(spec.get("cwd") or "/")
    exe = _which(argv[0], env)
    try:
        os.execve(exe, argv, env)
    except OSError as e:
        raise LaunchError(f'exec: "{argv[0]}": {e.strerror}') from e


def _fail(spec: dict | None, message: str) -> int:
    sys.stderr.write(f"podexec: {message}\n")
    sys.stderr.flush()
    path = (spec or {}).get("errorFile")
    if path:
        try:
            with open(path, "w") as f:
                f.write(message)
        except OSError:
            pass
    return START_ERROR


def main(argv: list[str]) -> int:
    """``run SPEC`` or ``enter PID SPEC`` (see the module docstring)."""
    spec = None
    try:
        if len(argv) == 2 and argv[0] == "run":
            with open(argv[1]) as f:
                spec = json.load(f)
            _join_cgroup(spec.get("cgroup"))
            _die_with_parent(spec.get("parentPid"))
            setup_mounts(spec)
            _exec(spec)
        elif len(argv) == 3 and argv[0] == "enter":
            with open(argv[2]) as f:
                spec = json.load(f)
            _setns(int(argv[1]))
            _exec(spec)
        else:
            return _fail(None, "usage: podexec.py run SPEC.json | enter PID SPEC.json")
    except (LaunchError, OSError, ValueError, KeyError) as e:
        return _fail(spec, str(e))
    return _fail(spec, "execve returned")  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
