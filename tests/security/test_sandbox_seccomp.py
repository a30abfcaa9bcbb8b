"""The seccomp filter the launcher installs on the untrusted program (stage H, every isolation mode):
its pure builder, checked instruction by instruction and by a small BPF interpreter for both
architectures, and real sandbox runs where the refused calls fail with the errno the filter gives
(chosen so that, without the filter, the kernel would answer otherwise or succeed) while threads,
fork, subprocesses, route netlink and ordinary sockets keep working."""

from __future__ import annotations

import ast
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

import pytest

from rft_runtime.rewards import Item, Sample
from rft_runtime.rewards.builtins import CodeSandboxEvaluator
from rft_runtime.rewards.sandbox import launcher as L
from rft_runtime.rewards.sandbox import run_sandboxed
from rft_runtime.rewards.sandbox.policy import SandboxPolicy

IS_ROOT = os.geteuid() == 0
SANDBOX_UID = 62000 + random.randrange(900)
EPERM, ENOSYS = 1, 38
MODES = [pytest.param("userns"),
         pytest.param("root", marks=pytest.mark.skipif(not IS_ROOT, reason="the root mode needs root"))]
ON_X86_64 = pytest.mark.skipif(os.uname().machine != "x86_64", reason="the live checks use x86-64 numbers")


# ------------------------------------------------------------------------------ the pure builder


def decode(prog: bytes) -> list[tuple[int, int, int, int]]:
    return [struct.unpack("=HBBI", prog[i:i + 8]) for i in range(0, len(prog), 8)]


def run_bpf(prog: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """Evaluates the program on one ``struct seccomp_data`` (only what the builder emits)."""
    args = tuple(args) + (0,) * (6 - len(args))
    data = struct.pack("=iIQ6Q", nr, arch, 0, *args)
    insns, pc, acc = decode(prog), 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == L.BPF_LD_W_ABS:
            acc, pc = struct.unpack_from("=I", data, k)[0], pc + 1
        elif code == L.BPF_JEQ_K:
            pc += 1 + (jt if acc == k else jf)
        elif code == L.BPF_JSET_K:
            pc += 1 + (jt if acc & k else jf)
        else:
            assert code == L.BPF_RET_K, code
            return k


ALLOW, KILL = L.SECCOMP_RET_ALLOW, L.SECCOMP_RET_KILL_PROCESS
DENY, NOSYS = L.SECCOMP_RET_ERRNO | EPERM, L.SECCOMP_RET_ERRNO | ENOSYS


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_architecture_is_checked_first(machine):
    arch, _ = L.SYSCALLS[machine]
    insns = decode(L.build_filter(machine))
    assert insns[0] == (L.BPF_LD_W_ABS, 0, 0, L.SD_ARCH)
    assert insns[1] == (L.BPF_JEQ_K, 1, 0, arch) and insns[2] == (L.BPF_RET_K, 0, 0, KILL)
    assert insns[3] == (L.BPF_LD_W_ABS, 0, 0, L.SD_NR) and insns[-1] == (L.BPF_RET_K, 0, 0, ALLOW)
    assert len(insns) < 4096
    for i, (code, jt, jf, _k) in enumerate(insns):  # every jump lands inside the program
        if code == L.BPF_RET_K:
            assert (jt, jf) == (0, 0)
        else:
            assert i + 1 + max(jt, jf) < len(insns)
    other = L.AUDIT_ARCH_AARCH64 if arch == L.AUDIT_ARCH_X86_64 else L.AUDIT_ARCH_X86_64
    assert run_bpf(L.build_filter(machine), 0, other) == KILL
    assert run_bpf(L.build_filter(machine), 0, 0x40000003) == KILL  # i386 calls on x86-64


def test_an_unknown_machine_has_no_filter():
    with pytest.raises(ValueError, match="no seccomp table"):
        L.build_filter("riscv64")


CASES = [  # (name, args, expected action)
    ("unshare", (0x10000000,), DENY), ("setns", (3, 0), DENY), ("mount", (), DENY), ("bpf", (), DENY),
    ("keyctl", (), DENY), ("ptrace", (), DENY), ("open_tree_attr", (), DENY), ("clone3", (), NOSYS),
    ("clone", (L.CLONE_NEWUSER | 17,), DENY), ("clone", (L.CLONE_NEWNS,), DENY),
    ("clone", (0x01200011,), ALLOW),  # fork: CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD
    ("clone", (0x003D0F00,), ALLOW),  # a pthread
    ("socket", (17, 3, 0x300), DENY), ("socket", (16, 3, 12), DENY), ("socket", (16, 3, 0), ALLOW),
    ("socket", (2, 1, 0), ALLOW), ("socket", (1, 1, 0), ALLOW),
    ("personality", (0,), ALLOW), ("personality", (0xFFFFFFFF,), ALLOW), ("personality", (0x0040000,), DENY),
]


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_decisions_for_each_architecture(machine):
    arch, nrs = L.SYSCALLS[machine]
    prog = L.build_filter(machine)
    for name, args, expected in CASES:
        assert run_bpf(prog, nrs[name], arch, args) == expected, (machine, name, args)
    for name in L.DENIED:
        assert run_bpf(prog, nrs[name], arch) == DENY, name
    denied = {nrs[n] for n in (*L.DENIED, "clone3", "clone", "socket", "personality")}
    for nr in set(range(500)) - denied:  # read, write, openat, execve, wait4, ...: untouched
        assert run_bpf(prog, nr, arch, (L.CLONE_NEWUSER, 17, 12)) == ALLOW, nr
    x32 = run_bpf(prog, L.X32_SYSCALL_BIT | 39, arch)
    assert x32 == (DENY if machine == "x86_64" else ALLOW)  # there is no x32 on aarch64


# ------------------------------------------------------------------------------ in the sandbox

PROBE = """
import ctypes, json, os, socket, subprocess, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def err(ret):
    return 0 if ret >= 0 else ctypes.get_errno()
def sc(nr, *args):
    return err(libc.syscall(ctypes.c_long(nr), *[ctypes.c_ulong(a & (2**64 - 1)) for a in args]))
def sock(*args):
    try:
        socket.socket(*args).close()
        return 0
    except OSError as e:
        return e.errno
def alone(check):
    # each check in a child of its own: a call that got through changes nothing for the next
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, str(check()).encode())
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    return int(os.read(r, 64) or b"-1")
def clone_newuser():
    ret = libc.syscall(ctypes.c_long(56), ctypes.c_ulong(0x10000000 | 17), 0, 0, 0, 0)
    if ret == 0:
        os._exit(0)  # the clone's child (there is none with the filter)
    if ret > 0:
        os.waitpid(ret, 0)
    return err(ret)
checks = {
    "unshare_user_net": lambda: err(libc.unshare(0x10000000 | 0x40000000)),
    "unshare_ns": lambda: err(libc.unshare(0x00020000)),
    "unshare_raw_user": lambda: sc(272, 0x10000000),
    "clone_newuser": clone_newuser,
    "clone3": lambda: sc(435, 0, 0),
    "x32": lambda: sc(0x40000000 | 39),
    "netlink_netfilter": lambda: sock(16, 3, 12),
    "packet_raw": lambda: sock(17, 3, 0x300),
    "packet_bad_type": lambda: sock(17, 99, 0),
    "mount": lambda: err(libc.mount(b"none", b"/nonexistent", b"tmpfs", 0, None)),
    "bpf": lambda: sc(321, 999, 0, 0),
    "keyctl": lambda: sc(250, 0, -3, 0),
    "personality_no_aslr": lambda: sc(135, 0x0040000),
}
out = {name: alone(check) for name, check in checks.items()}
out["netlink_route"] = sock(16, 3, 0)
out["inet"] = sock(2, 1, 0)
box = []
t = threading.Thread(target=lambda: box.append(1))
t.start()
t.join()
out["thread"] = box == [1]
out["subprocess"] = subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True).stdout.decode()
pid = os.fork()
if pid == 0:
    os._exit(7)
out["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
out["oom_score_adj"] = int(open("/proc/self/oom_score_adj").read())
print(json.dumps(out))
"""

# Without the filter (measured in both modes on this kernel) every one of these but unshare_ns and
# packet_raw (EPERM anyway: no capability) succeeds or fails otherwise (EINVAL, ENOENT, ENOSYS).
REFUSED = {"unshare_user_net": EPERM, "unshare_ns": EPERM, "unshare_raw_user": EPERM, "clone_newuser": EPERM,
           "clone3": ENOSYS, "x32": EPERM, "netlink_netfilter": EPERM, "packet_raw": EPERM,
           "packet_bad_type": EPERM, "mount": EPERM, "bpf": EPERM, "keyctl": EPERM, "personality_no_aslr": EPERM}
# oom_score_adj: the run is the kernel's first choice when the pod runs out of memory, not the server
WORKS = {"netlink_route": 0, "inet": 0, "thread": True, "subprocess": "1\n", "fork": 7, "oom_score_adj": 1000}
ADD = Item(ground_truth=["assert add(2, 3) == 5", "assert add(-1, 1) == 0"])


def make(mode: str) -> CodeSandboxEvaluator:
    return CodeSandboxEvaluator({"timeoutSeconds": 10, "memoryMB": 256, "maxProcesses": 8, "isolation": mode,
                                 "sandboxUid": SANDBOX_UID, "sandboxGid": SANDBOX_UID})


@ON_X86_64
@pytest.mark.parametrize("mode", MODES)
async def test_the_solution_is_refused_what_the_filter_denies(mode):
    ev = make(mode)
    assert ev.isolation["mode"] == mode
    run = await run_sandboxed(ev.policy, {"solution.py": PROBE}, ["solution.py"])
    assert run.exit_code == 0 and run.setup_error is None, (run.stderr, run.reports)
    out = json.loads(run.stdout.decode().strip().splitlines()[-1])
    assert {k: out[k] for k in REFUSED} == REFUSED
    assert {k: out[k] for k in WORKS} == WORKS


@ON_X86_64
@pytest.mark.parametrize("mode", MODES)
async def test_the_solution_behind_the_harness_is_filtered_and_still_scores(mode):
    """Through the two-process harness: the solution's own process gets EPERM, and a correct
    solution still scores 1.0 (a wrong one 0.0)."""
    ev = make(mode)
    good = await ev.score(Sample(text="def add(a, b):\n    return a + b\n"), ADD)
    assert (good.reward, good.error) == (1.0, None), good.reason
    wrong = await ev.score(Sample(text="def add(a, b):\n    return a - b\n"), ADD)
    assert (wrong.reward, wrong.error) == (0.0, None), wrong.reason
    solution = ("import ctypes, socket\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                "r = libc.unshare(0x10000000 | 0x40000000)\nUNSHARE = (r, ctypes.get_errno())\n"
                "try:\n    socket.socket(16, 3, 12)\n    NETFILTER = 0\nexcept OSError as e:\n    NETFILTER = e.errno\n"
                "def add(a, b):\n    return a + b\n")
    tests = Item(ground_truth=["assert UNSHARE == (-1, 1), UNSHARE", "assert NETFILTER == 1, NETFILTER",
                               "assert add(2, 3) == 5"])
    result = await ev.score(Sample(text=solution), tests)
    assert (result.reward, result.error) == (1.0, None), result.reason


@pytest.mark.skipif(not IS_ROOT, reason="drives the launcher directly as root")
def test_no_filter_no_exec(tmp_path):
    """A filter that cannot be installed (here: a machine without a table) is a setup_error at stage
    seccomp, and the program never runs."""
    policy = SandboxPolicy(sandbox_uid=SANDBOX_UID, sandbox_gid=SANDBOX_UID)
    work = tempfile.mkdtemp(prefix="rft-sbx-seccomp-", dir="/tmp")
    try:
        os.chown(work, SANDBOX_UID, SANDBOX_UID)
        r, w = os.pipe()
        cfg = {"workdir": work, "argv": [policy.python, "-I", "-c", "print('RAN')"], "sandbox_uid": SANDBOX_UID,
               "sandbox_gid": SANDBOX_UID, "limits": policy.launcher_limits(), "mode": "auto", "denied_paths": [],
               "readable_paths": policy.view_paths(), "report_fd": w, "parent_pid": os.getpid(),
               "seccomp_machine": "riscv64"}
        proc = subprocess.run([sys.executable, "-I", "-S", L.__file__, json.dumps(cfg)], pass_fds=(w,),
                              capture_output=True, timeout=60, env={})
        os.close(w)
        with os.fdopen(r, "rb") as fh:
            reports = [json.loads(line) for line in fh.read().splitlines()]
    finally:
        subprocess.run(["rm", "-rf", work], check=False)
    assert proc.returncode == L.SETUP_FAILED_EXIT and b"RAN" not in proc.stdout, proc
    errors = [rep for rep in reports if rep["kind"] == "setup_error"]
    assert errors and errors[0]["stage"] == "seccomp" and "riscv64" in errors[0]["error"], reports


def test_the_launcher_stays_standalone():
    """The filter lives in the launcher itself (copied alone into pods' and tests' directories)."""
    tree = ast.parse(open(L.__file__).read())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names), imported
