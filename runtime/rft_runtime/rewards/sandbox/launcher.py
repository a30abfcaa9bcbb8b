"""Sandbox launcher: a standalone script (stdlib only) run as its own process by the runner.

It is started with ``python -I -S launcher.py CONFIG_JSON`` in a new session and builds the
isolation around one untrusted program, then execs it. It imports nothing from ``rft_runtime`` so
it can run before anything else is trusted. Process tree::

    worker ─► L (this script, new session)          writes the uid/gid maps of C
               └─► C  unshare(user?, mnt, net, ipc, uts, pid); private read-only mounts
                    └─► G  pid 1 of the new pid namespace: private /proc, drops to the sandbox uid
                         └─► H  rlimits, empty environment, seccomp filter, exec(argv)   ← untrusted code

Isolation modes (``mode`` in the config):
  * ``userns``: C creates a user namespace too; L (in the parent namespace) maps one inside uid to
    ``sandbox_uid`` when L is root, or to L's own uid otherwise. Works unprivileged where the kernel
    allows user namespaces, and as root. RLIMIT_NPROC is then counted per (namespace, uid).
  * ``root``: C (real root) creates the other namespaces without a user namespace, G setuid()s to
    ``sandbox_uid``.
  * ``auto``: ``userns``, then ``root`` if that fails and we are root.
There is no unisolated mode: a launcher that cannot create the namespaces fails its setup.

Filesystem (C, in the new mount namespace): a fresh root (moved over / and chrooted into) holding only read-only
binds of the system's interpreter and libraries (``readable_paths``: /usr, /bin, /lib*, /etc's
loader cache and time zone), /dev/null, /dev/zero, /dev/full, /dev/random, /dev/urandom, a private
/proc, the harness files read-only under /.rft, and /work: a tmpfs of ``work_quota_bytes`` and
``work_max_files`` inodes, owned by the untrusted uid, that holds the run's files (the outside
workdir is only read). Nothing of the server's (its config, its evaluator files, other runs'
workdirs, /tmp, home directories, service-account tokens) exists in that view, whatever uid the
code has: an unprivileged launcher can map only its own uid into the user namespace, so the view,
not the uid, is what keeps the server's files out of reach.

Every stage writes one JSON line to ``report_fd``: ``{"kind": "setup", ...}`` once the namespaces and
mounts are in place, ``{"kind": "setup_error", "stage", "error"}`` (exit 125) when something required
failed. The program started (the trusted harness) gets that pipe as fd 3; the harness keeps the
untrusted solution in a separate process without it (see harness.py).
Each child sets PR_SET_PDEATHSIG=SIGKILL, so killing L's process group, or L dying, tears the whole
tree down; G's death (pid 1) makes the kernel kill everything left in the pid namespace.

System calls (H, both modes, last thing before the exec): a seccomp filter (:func:`build_filter`,
installed by :func:`install_solution_filter`) refuses with EPERM what the namespaces leave to the
kernel: new namespaces (``unshare``, ``setns``, ``clone`` with a CLONE_NEW* flag; ``clone3`` gets
ENOSYS so the C library falls back to ``clone``), mounts and the new mount API, ``chroot``, ``bpf``,
the keyrings, ``ptrace`` and ``process_vm_*``, modules, kexec, ``perf_event_open``, ``userfaultfd``,
io_uring, handles, swap, ``reboot``, ``acct``, quotas, host and domain names, ``personality``
other than the default or a query, ``AF_PACKET`` sockets and ``AF_NETLINK`` ones other than
NETLINK_ROUTE. It is a deny list on top of the namespaces, the rlimits and the pod's own profile.
It is installed here, not in the harness's child, because a filter is inherited across fork and
execve and cannot be removed: the harness (H after the exec) needs none of these calls (it starts
the solution's process with fork/exec, pipes and prctl(PR_SET_DUMPABLE)), so the solution, anything
it starts and every program run under the launcher (the harness, the probe, direct runs) are
filtered, and the harness itself stays free of ctypes. No filter, no exec: a failure to install it
is a ``setup_error`` at stage ``seccomp``.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import struct
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
MNT_DETACH = 2
MS_MOVE = 8192

MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
SYS_MOUNT_SETATTR = 442  # same number on x86_64 and the asm-generic table (aarch64)

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

SETUP_FAILED_EXIT = 125
INSIDE_ID = 65534  # uid/gid the untrusted code has inside a user namespace

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.syscall.restype = ctypes.c_long


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _b(path: str | None) -> bytes | None:
    return None if path is None else os.fsencode(path)


def mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(_b(src), _b(target), _b(fstype), flags, _b(data)), f"mount {target}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, arg, 0, 0, 0), f"prctl({option})")


def mount_setattr(path: str, flags: int, attr_set: int, attr_clr: int) -> None:
    attr = MountAttr(attr_set, attr_clr, 0, 0)
    ret = _libc.syscall(SYS_MOUNT_SETATTR, ctypes.c_int(AT_FDCWD), _b(path), ctypes.c_uint(flags),
                        ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)))
    _check(0 if ret == 0 else -1, f"mount_setattr {path}")


class Reporter:
    """Writes one JSON line per event to the report pipe."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __call__(self, **obj: object) -> None:
        data = (json.dumps(obj) + "\n").encode()
        try:
            os.write(self.fd, data)
        except OSError:
            pass

    def fail(self, stage: str, exc: BaseException) -> None:
        self(kind="setup_error", stage=stage, error=f"{type(exc).__name__}: {exc}")
        os._exit(SETUP_FAILED_EXIT)


def die_with_parent(expected_parent: int) -> None:
    """SIGKILL this process when its parent dies (and exit now if it already did)."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != expected_parent:
        raise OSError(f"parent {expected_parent} is gone")


def wait_status(pid: int) -> int:
    """Waits for ``pid`` and returns a shell-style exit code (128 + signal when killed)."""
    while True:
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            return SETUP_FAILED_EXIT
        if os.WIFEXITED(status):
            return os.WEXITSTATUS(status)
        if os.WIFSIGNALED(status):
            return 128 + os.WTERMSIG(status)


# ----------------------------------------------------------------------------- mounts


def _mountpoints() -> list[tuple[str, set[str]]]:
    """(mount point, per-mount options) of this mount namespace, parents before children."""
    out = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            parts = line.split()
            point = parts[4].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
            out.append((point, set(parts[5].split(","))))
    out.sort(key=lambda p: p[0].count("/") if p[0] != "/" else 0)
    return out


def _readonly_everything(method: str = "auto") -> str:
    """Makes every mount of this namespace read-only and nosuid; returns the method used:
    ``mount_setattr`` (Linux ≥ 5.12, recursive in one call) or, failing that or when asked
    (``method="remount"``), a read-only bind remount of each mount point that keeps its locked flags."""
    if method != "remount":
        try:
            mount_setattr("/", AT_RECURSIVE, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0)
            return "mount_setattr"
        except OSError:
            pass
    keep = {"nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
            "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
    for point, opts in _mountpoints():
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID
        for name, bit in keep.items():
            if name in opts:
                flags |= bit
        try:
            mount(None, point, None, flags)
        except OSError:
            if point == "/":
                raise
    return "remount"


def _deny_paths(paths: list[str], stage_dir: str) -> list[str]:
    """Hides each existing path behind an inaccessible mode-000 tmpfs (directories) or an empty
    mode-000 file (files). ``stage_dir`` is any existing directory, used briefly as a mount point."""
    existing = [p for p in paths if os.path.lexists(p)]
    if not existing:
        return []
    mount("tmpfs", stage_dir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=16k,mode=700")
    blank = os.path.join(stage_dir, "denied")
    fd = os.open(blank, os.O_CREAT | os.O_WRONLY, 0)
    os.close(fd)
    os.chmod(blank, 0)
    denied = []
    for path in existing:
        real = os.path.realpath(path)
        if os.path.isdir(real):
            mount("tmpfs", real, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=000")
        else:
            mount(blank, real, None, MS_BIND)
        denied.append(path)
    _check(_libc.umount2(_b(stage_dir), MNT_DETACH), "umount stage")
    return denied


DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
INSIDE_WORKDIR = "/work"
HARNESS_DIR = "/.rft"


def _bind_into(root: str, path: str) -> bool:
    """Recreates ``path`` under ``root``: a symlink as the same symlink, a directory or file as a
    (recursive) bind mount. Returns False when ``path`` does not exist."""
    dst = root + path
    if os.path.islink(path):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.symlink(os.readlink(path), dst)
        return True
    if os.path.isdir(path):
        os.makedirs(dst, exist_ok=True)
        mount(path, dst, None, MS_BIND | MS_REC)
        return True
    if os.path.exists(path):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.close(os.open(dst, os.O_CREAT | os.O_WRONLY, 0o644))
        mount(path, dst, None, MS_BIND)
        return True
    return False


def setup_mounts(cfg: dict, owner: tuple[int, int]) -> dict:
    """A fresh, read-only root with only the system's binaries and libraries, the harness under
    /.rft and a size-limited tmpfs /work holding the run's files (owned by ``owner``)."""
    outside = cfg["workdir"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # first: nothing below may propagate to the host
    files = {}
    for name in os.listdir(outside):  # the runner's files: read now, the outside dir is never shown
        with open(os.path.join(outside, name), "rb") as fh:
            files[name] = fh.read()
    root = outside
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,nr_inodes=4096,mode=755")
    covered: list[str] = []
    for path in sorted(cfg.get("readable_paths", [])):
        if any(path == c or path.startswith(c.rstrip("/") + "/") for c in covered):
            continue
        if _bind_into(root, path):
            covered.append(path)
    os.makedirs(root + "/dev", exist_ok=True)
    for dev in DEVICES:
        _bind_into(root, dev)
    for d in (HARNESS_DIR, INSIDE_WORKDIR, "/.stage"):
        os.makedirs(root + d, exist_ok=True)
    # The kernel lets a user namespace mount a new proc only where a proc is already fully visible:
    # G mounts the private one (its own pid namespace) over this bind, which nothing can unmount.
    _bind_into(root, "/proc")
    os.symlink(INSIDE_WORKDIR, root + "/tmp")
    work = root + INSIDE_WORKDIR
    quota, inodes = int(cfg.get("work_quota_bytes", 64 << 20)), int(cfg.get("work_max_files", 1024))
    mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV, f"size={quota},nr_inodes={inodes},mode=700")
    for name, data in files.items():
        trusted = name.startswith("_rft_")  # the harness: read-only, outside the writable workdir
        target = os.path.join(root + HARNESS_DIR if trusted else work, name)
        with open(target, "wb") as fh:
            fh.write(data)
        if trusted:
            os.chmod(target, 0o444)
        else:
            os.chown(target, *owner)
    os.chown(work, *owner)
    # switch_root: move the new root over / and chroot into it (pivot_root is refused by the reward
    # pod's seccomp profile). The untrusted code has no CAP_SYS_CHROOT and no descriptor from outside,
    # so it cannot climb back out; its private /proc shows no process rooted elsewhere.
    os.chdir(root)
    mount(root, "/", None, MS_MOVE)
    os.chroot(".")
    os.chdir("/")
    denied = _deny_paths(cfg.get("denied_paths", []), "/.stage")
    method = _readonly_everything(cfg.get("readonly_method", "auto"))
    mount(None, INSIDE_WORKDIR, None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV)
    return {"readonly_root": method, "denied": denied, "root": "private", "work_quota_bytes": quota,
            "work_max_files": inodes}


# ----------------------------------------------------------------------------- the solution's seccomp filter

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
X32_SYSCALL_BIT = 0x40000000
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
EPERM, ENOSYS = 1, 38
AF_NETLINK, AF_PACKET, NETLINK_ROUTE = 16, 17, 0
CLONE_NEWCGROUP = 0x02000000
CLONE_NAMESPACES = CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
PER_LINUX, PER_QUERY = 0, 0xFFFFFFFF
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JSET_K, BPF_RET_K = 0x20, 0x15, 0x45, 0x06
# struct seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8 i (the low 32 bits first: both arches
# here are little-endian, and clone's flags, socket's domain and protocol and personality's persona
# are read by the kernel as 32-bit values).
SD_NR, SD_ARCH, SD_ARG0, SD_ARG2 = 0, 4, 16, 32

# Refused outright with EPERM.
DENIED = ("unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree",
          "open_tree_attr", "fsopen", "fsmount", "fsconfig", "fspick", "mount_setattr", "bpf", "keyctl",
          "add_key", "request_key", "ptrace", "process_vm_readv", "process_vm_writev", "kexec_load",
          "kexec_file_load", "init_module", "finit_module", "delete_module", "perf_event_open",
          "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "open_by_handle_at",
          "name_to_handle_at", "swapon", "swapoff", "reboot", "acct", "quotactl", "quotactl_fd",
          "sethostname", "setdomainname")
_SAME_NR = {"open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
            "clone3": 435, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
            "mount_setattr": 442, "quotactl_fd": 443, "open_tree_attr": 467}
# os.uname().machine -> (AUDIT_ARCH_*, system call numbers)
SYSCALLS = {
    "x86_64": (AUDIT_ARCH_X86_64, dict(
        _SAME_NR, unshare=272, setns=308, clone=56, socket=41, personality=135, mount=165, umount2=166,
        pivot_root=155, chroot=161, bpf=321, keyctl=250, add_key=248, request_key=249, ptrace=101,
        process_vm_readv=310, process_vm_writev=311, kexec_load=246, kexec_file_load=320, init_module=175,
        finit_module=313, delete_module=176, perf_event_open=298, userfaultfd=323, open_by_handle_at=304,
        name_to_handle_at=303, swapon=167, swapoff=168, reboot=169, acct=163, quotactl=179,
        sethostname=170, setdomainname=171)),
    "aarch64": (AUDIT_ARCH_AARCH64, dict(
        _SAME_NR, unshare=97, setns=268, clone=220, socket=198, personality=92, mount=40, umount2=39,
        pivot_root=41, chroot=51, bpf=280, keyctl=219, add_key=217, request_key=218, ptrace=117,
        process_vm_readv=270, process_vm_writev=271, kexec_load=104, kexec_file_load=294, init_module=105,
        finit_module=273, delete_module=106, perf_event_open=241, userfaultfd=282, open_by_handle_at=265,
        name_to_handle_at=264, swapon=224, swapoff=225, reboot=142, acct=89, quotactl=60,
        sethostname=161, setdomainname=162)),
}

Insn = tuple[int, int, int, int]  # struct sock_filter: code, jt, jf, k


def _ld(offset: int) -> Insn:
    return (BPF_LD_W_ABS, 0, 0, offset)


def _ret(action: int) -> Insn:
    return (BPF_RET_K, 0, 0, action)


def _guard(nr: int, body: list[Insn]) -> list[Insn]:
    """``body`` (which ends in returns) for system call ``nr``; other calls skip over it."""
    return [(BPF_JEQ_K, 0, len(body), nr), *body]


def _argument_rules(nrs: dict) -> list[Insn]:
    """clone without namespace flags, sockets but AF_PACKET and non-route netlink, the default persona."""
    eperm, allow = _ret(SECCOMP_RET_ERRNO | EPERM), _ret(SECCOMP_RET_ALLOW)
    clone = [_ld(SD_ARG0), (BPF_JSET_K, 0, 1, CLONE_NAMESPACES), eperm, allow]
    sock = [_ld(SD_ARG0), (BPF_JEQ_K, 0, 1, AF_PACKET), eperm, (BPF_JEQ_K, 0, 3, AF_NETLINK),
            _ld(SD_ARG2), (BPF_JEQ_K, 1, 0, NETLINK_ROUTE), eperm, allow]
    persona = [_ld(SD_ARG0), (BPF_JEQ_K, 2, 0, PER_LINUX), (BPF_JEQ_K, 1, 0, PER_QUERY), eperm, allow]
    return _guard(nrs["clone"], clone) + _guard(nrs["socket"], sock) + _guard(nrs["personality"], persona)


def build_filter(machine: str) -> bytes:
    """The solution's seccomp-BPF program for ``machine`` (``os.uname().machine``) as the bytes of a
    ``struct sock_filter`` array. It checks the architecture first (any other, such as 32-bit calls
    on x86-64, kills the process), refuses the x32 ABI on x86-64, then the calls of :data:`DENIED`
    (EPERM), ``clone3`` (ENOSYS) and the argument rules; everything else is allowed. Raises
    ValueError for a machine without a table."""
    if machine not in SYSCALLS:
        raise ValueError(f"no seccomp table for machine {machine!r}")
    arch, nrs = SYSCALLS[machine]
    eperm = _ret(SECCOMP_RET_ERRNO | EPERM)
    prog = [_ld(SD_ARCH), (BPF_JEQ_K, 1, 0, arch), _ret(SECCOMP_RET_KILL_PROCESS), _ld(SD_NR)]
    if arch == AUDIT_ARCH_X86_64:
        prog += [(BPF_JSET_K, 0, 1, X32_SYSCALL_BIT), eperm]
    prog += _guard(nrs["clone3"], [_ret(SECCOMP_RET_ERRNO | ENOSYS)])
    for name in DENIED:
        prog += _guard(nrs[name], [eperm])
    prog += _argument_rules(nrs) + [_ret(SECCOMP_RET_ALLOW)]
    return b"".join(struct.pack("=HBBI", *insn) for insn in prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_solution_filter(machine: str | None = None) -> None:
    """Installs :func:`build_filter`'s program for this machine (or ``machine``) on this thread,
    after PR_SET_NO_NEW_PRIVS. Raises OSError or ValueError: the caller must not exec then."""
    prog = build_filter(machine or os.uname().machine)
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = _SockFprog(len(prog) // 8, ctypes.addressof(buf))
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0), "prctl(PR_SET_SECCOMP)")


# ----------------------------------------------------------------------------- stages


def set_limits(lim: dict) -> None:
    """The untrusted process's rlimits (no core files, ever)."""
    if "cpu" in lim:
        resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu"], lim["cpu"] + 1))
    if "as" in lim:
        resource.setrlimit(resource.RLIMIT_AS, (lim["as"], lim["as"]))
    if "fsize" in lim:
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim["fsize"], lim["fsize"]))
    if "nproc" in lim:
        resource.setrlimit(resource.RLIMIT_NPROC, (lim["nproc"], lim["nproc"]))
    if "nofile" in lim:
        resource.setrlimit(resource.RLIMIT_NOFILE, (lim["nofile"], lim["nofile"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def stage_h(cfg: dict, rep: Reporter) -> None:
    """The untrusted process: rlimits, fds, empty environment, seccomp filter, exec."""
    set_limits(cfg["limits"])
    if rep.fd != 3:
        os.dup2(rep.fd, 3)
        rep.fd = 3  # the report pipe's other descriptors are closed below: failures go to fd 3
    os.closerange(4, 65536)
    os.set_inheritable(3, True)
    os.chdir(INSIDE_WORKDIR)
    try:  # seccomp_machine: set by tests only, to see the refusal; any name but ours fails the run
        install_solution_filter(cfg.get("seccomp_machine"))
    except (OSError, ValueError) as exc:
        rep.fail("seccomp", exc)
    os.execve(cfg["argv"][0], cfg["argv"], {})


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """Empties the bounding, ambient, effective, permitted and inheritable capability sets."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:
            break  # EINVAL: past the last capability this kernel knows
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)


def clear_capability_sets() -> None:
    """capset() with all sets empty (after setuid, which does not clear them inside a userns)."""
    hdr = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(hdr), data), "capset")


def drop_privileges(cfg: dict, in_userns: bool) -> None:
    """Become the sandbox uid/gid with no supplementary groups, no capabilities and no way to
    regain privileges."""
    uid = INSIDE_ID if in_userns else cfg["sandbox_uid"]
    gid = INSIDE_ID if in_userns else cfg["sandbox_gid"]
    if os.geteuid() == 0 or in_userns:
        drop_capabilities()
    if os.geteuid() == 0 or in_userns:
        try:
            os.setgroups([])
        except OSError:
            if not in_userns or cfg.get("outside_root"):
                raise  # unprivileged user namespaces refuse setgroups; groups stay the caller's own
        os.setgid(gid)
        os.setuid(uid)
    clear_capability_sets()
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def stage_g(cfg: dict, rep: Reporter, parent: int, info: dict) -> None:
    """pid 1 of the new pid namespace: private /proc, drop privileges, run H, exit with its status."""
    try:
        die_with_parent(0 if info["pid_ns"] else parent)  # C lives outside our pid namespace
        if info["pid_ns"] and info["mount_ns"]:
            try:
                mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
                info["proc"] = "private"
            except OSError:
                mount("tmpfs", "/proc", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k,mode=555")
                info["proc"] = "hidden"
        drop_privileges(cfg, info["user_ns"])
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a credential change clears it
        info["uid"], info["gid"] = os.getuid(), os.getgid()
        rep(kind="setup", **info)
    except Exception as exc:  # noqa: BLE001 - reported to the runner
        rep.fail("drop_privileges", exc)
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            die_with_parent(me)
            stage_h(cfg, rep)
        except Exception as exc:  # noqa: BLE001
            rep.fail("exec", exc)
    os._exit(wait_status(pid))


def unshare_namespaces(mode: str) -> dict:
    """Creates the namespaces for ``mode``; returns which were created."""
    base = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID
    errors = []
    if mode in ("auto", "userns"):
        try:
            unshare(CLONE_NEWUSER | base)
            return {"mode": "userns", "user_ns": True}
        except OSError as exc:
            errors.append(f"userns: {exc}")
    if mode in ("auto", "root"):
        try:
            if os.geteuid() != 0:
                raise PermissionError("not root")
            unshare(base)
            return {"mode": "root", "user_ns": False}
        except OSError as exc:
            errors.append(f"root: {exc}")
    raise OSError("cannot create namespaces (" + "; ".join(errors) + ")")


def stage_c(cfg: dict, rep: Reporter, parent: int, sync_w: int, sync_r: int) -> None:
    """Creates namespaces, waits for L to write the id maps, mounts, forks G."""
    mode = cfg.get("mode", "auto")
    info: dict = {"mode": "none", "user_ns": False, "mount_ns": False, "net_ns": False,
                  "pid_ns": False, "proc": "shared", "readonly_root": None, "denied": []}
    try:
        die_with_parent(parent)
        before = os.readlink("/proc/self/ns/mnt")
        info.update(unshare_namespaces(mode))
        if os.readlink("/proc/self/ns/mnt") == before:  # never touch the host's mounts
            raise OSError("mount namespace was not created")
        info.update(mount_ns=True, net_ns=True, pid_ns=True)
        os.write(sync_w, json.dumps(info).encode())
        os.close(sync_w)
        if os.read(sync_r, 16) != b"ok":
            raise OSError("parent could not write the id maps")
        owner = (INSIDE_ID, INSIDE_ID) if info["user_ns"] else (cfg["sandbox_uid"], cfg["sandbox_gid"])
        info.update(setup_mounts(cfg, owner))
    except Exception as exc:  # noqa: BLE001
        rep.fail("namespaces", exc)
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        stage_g(cfg, rep, me, info)
    os._exit(wait_status(pid))


def write_id_maps(pid: int, cfg: dict) -> None:
    """Maps INSIDE_ID in C's user namespace to the sandbox ids (root) or to our own ids."""
    if os.geteuid() == 0:
        # C stays real root (inside 0 = outside 0) so it can set up mounts and create files on
        # them; the untrusted code runs as INSIDE_ID = the unprivileged sandbox uid.
        uid_map = f"0 0 1\n{INSIDE_ID} {cfg['sandbox_uid']} 1\n"
        gid_map = f"0 0 1\n{INSIDE_ID} {cfg['sandbox_gid']} 1\n"
    else:
        uid_map = f"{INSIDE_ID} {os.geteuid()} 1\n"
        gid_map = f"{INSIDE_ID} {os.getegid()} 1\n"
        with open(f"/proc/{pid}/setgroups", "w") as fh:
            fh.write("deny")
    with open(f"/proc/{pid}/uid_map", "w") as fh:
        fh.write(uid_map)
    with open(f"/proc/{pid}/gid_map", "w") as fh:
        fh.write(gid_map)


OOM_SCORE_ADJ = 1000


def first_to_die() -> None:
    """Make this run (L and everything it starts inherit it) the kernel's first choice when the pod or
    node runs out of memory: a run over budget is killed, never the reward server that started it.
    Raising one's own score needs no privilege; where /proc refuses the write the run goes on."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(OOM_SCORE_ADJ))
    except OSError:
        pass


def main() -> None:
    cfg = json.loads(sys.argv[1])
    rep = Reporter(cfg["report_fd"])
    try:
        die_with_parent(cfg["parent_pid"])
    except Exception as exc:  # noqa: BLE001
        rep.fail("launcher", exc)
    cfg["outside_root"] = os.geteuid() == 0
    first_to_die()
    up_r, up_w = os.pipe()
    down_r, down_w = os.pipe()
    me = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(up_r)
        os.close(down_w)
        stage_c(cfg, rep, me, up_w, down_r)
    os.close(up_w)
    os.close(down_r)
    raw = os.read(up_r, 4096)
    try:
        info = json.loads(raw) if raw else None
        if info and info["user_ns"]:
            write_id_maps(pid, cfg)
        os.write(down_w, b"ok")
    except Exception as exc:  # noqa: BLE001
        rep(kind="setup_error", stage="id_maps", error=f"{type(exc).__name__}: {exc}")
        os.write(down_w, b"no")
    os.close(down_w)
    os._exit(wait_status(pid))


if __name__ == "__main__":
    main()
