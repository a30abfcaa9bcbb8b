"""Attacks on the code sandbox by the solution it runs (real sandbox processes: namespaces, the
private root, the two-process harness). Each test fails if the attack changes the verdict, reads
what it must not, or exhausts something outside its own run."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from rft_runtime.rewards import Item, Sample
from rft_runtime.rewards.builtins import CodeSandboxEvaluator
from rft_runtime.rewards.sandbox import run_sandboxed
from rft_runtime.rewards.sandbox.policy import DEFAULT_READABLE_PATHS
from rft_runtime.rewards.sandbox.runner import LAUNCHER

from .attacks import ALWAYS_EQUAL, FD3_FORGERY, KILL_THE_JUDGE, PROC_FD_FORGERY, TEST_READER, reader_of

IS_ROOT = os.geteuid() == 0
SANDBOX_UID = 63000 + random.randrange(900)
ADD = Item(ground_truth=["assert add(2, 3) == 5", "assert add(-1, 1) == 0"])
GOOD = "def add(a, b):\n    return a + b\n"
HARNESS = Path(LAUNCHER).with_name("harness.py")


def make(**extra: object) -> CodeSandboxEvaluator:
    return CodeSandboxEvaluator({"timeoutSeconds": 6, "memoryMB": 256, "maxProcesses": 8, "sandboxUid": SANDBOX_UID,
                                 "sandboxGid": SANDBOX_UID, **extra})


@pytest.fixture(scope="module")
def ev() -> CodeSandboxEvaluator:
    return make()


@pytest.fixture(scope="module")
def partial() -> CodeSandboxEvaluator:
    return make(partialCredit=True)


@pytest.fixture
def server_dir() -> Path:
    """Files of 'the reward server': its config and an evaluator file, world-readable (as a
    ConfigMap mounts them), in a directory any uid may enter."""
    path = Path(tempfile.mkdtemp(prefix="rft-sec-server-", dir="/tmp"))
    os.chmod(path, 0o755)
    (path / "config.json").write_text('{"judge": {"apiKey": "CONFIG-SECRET-1"}}')
    (path / "evaluator.py").write_text("SECRET = 'EVALUATOR-SECRET-2'\n")
    for f in path.iterdir():
        os.chmod(f, 0o644)
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def still_honest(ev: CodeSandboxEvaluator) -> None:
    after = await ev.score(Sample(text=GOOD), ADD)
    assert (after.reward, after.error) == (1.0, None), after


# ------------------------------------------------------------------------------ forging the verdict


@pytest.mark.parametrize("attack", [FD3_FORGERY, PROC_FD_FORGERY, ALWAYS_EQUAL, KILL_THE_JUDGE],
                         ids=["fd3", "proc-fd", "always-equal", "kill-harness"])
async def test_a_wrong_solution_cannot_forge_a_pass(ev, partial, attack):
    for evaluator in (ev, partial):
        result = await evaluator.score(Sample(text=attack), ADD)
        assert result.reward == 0.0, (result.reward, result.reason)
    await still_honest(ev)


async def test_partial_credit_stays_in_its_declared_range(partial):
    half = await partial.score(Sample(text="def add(a, b):\n    return 5\n"), ADD)
    assert half.reward == 0.5
    forged = await partial.score(Sample(text=FD3_FORGERY.replace("return -7", "return 5")), ADD)
    assert 0.0 <= forged.reward <= 0.5, forged  # never more than its honest share


async def test_the_tests_are_not_readable_by_the_solution(ev):
    secret_test = Item(ground_truth=["assert magic() == 'S3CR3T-4242'"])
    result = await ev.score(Sample(text=TEST_READER), secret_test)
    assert result.reward == 0.0, result.reason
    assert "S3CR3T-4242" not in result.reason


async def test_the_solution_sees_its_own_files_but_not_the_harness_input(ev):
    run = await run_sandboxed(ev.policy, {"solution.py": "x = 1", "_rft_harness.py": HARNESS.read_text()},
                              ["-c", "import os; print(sorted(os.listdir('.')), sorted(os.listdir('/.rft')))"])
    assert run.exit_code == 0, run.stderr
    assert run.stdout.decode().strip() == "['solution.py'] ['_rft_harness.py']"


# ------------------------------------------------------------------------------ reading the server's files


async def test_server_files_are_not_in_the_sandbox(ev, server_dir):
    import rft_runtime

    paths = [str(server_dir / "config.json"), str(server_dir / "evaluator.py"), str(server_dir),
             rft_runtime.__file__, "/etc/passwd", "/etc/hostname", "/root", "/home",
             "/var/run/secrets/kubernetes.io/serviceaccount/token"]
    run = await run_sandboxed(ev.policy, {"solution.py": reader_of(*paths)}, ["solution.py"])
    out = run.stdout.decode()
    assert run.exit_code == 0, run.stderr
    assert "READ" not in out and out.count("DENIED") == len(paths), out
    assert "CONFIG-SECRET-1" not in out and "EVALUATOR-SECRET-2" not in out


async def test_other_runs_workdirs_are_not_visible(ev):
    holder = ("import time\nopen('other.txt', 'w').write('OTHER-RUN-SECRET')\nprint('written', flush=True)\n"
              "time.sleep(3)\n")
    snoop = ("import os\nhits = []\n"
             "for top in ('/', '/tmp', '/work'):\n"
             "    for root, dirs, files in os.walk(top):\n"
             "        dirs[:] = [d for d in dirs if os.path.join(root, d) not in "
             "('/usr', '/proc', '/dev', '/lib', '/lib64', '/lib32', '/libx32', '/bin', '/sbin')]\n"
             "        for f in files:\n"
             "            try:\n"
             "                if 'OTHER-RUN-' + 'SECRET' in open(os.path.join(root, f), errors='replace').read():\n"
             "                    hits.append(os.path.join(root, f))\n"
             "            except OSError:\n"
             "                pass\n"
             "print('HITS', hits)\n")
    first = asyncio.ensure_future(run_sandboxed(ev.policy, {"solution.py": holder}, ["solution.py"]))
    await asyncio.sleep(1.0)
    second = await run_sandboxed(ev.policy, {"solution.py": snoop}, ["solution.py"])
    holder_run = await first
    assert b"written" in holder_run.stdout
    assert second.stdout.decode().strip() == "HITS []", second.stdout + second.stderr


async def test_the_solution_runs_as_a_uid_that_owns_nothing_of_the_server(ev):
    assert ev.isolation["uid"] not in (0, os.getuid())
    if IS_ROOT and ev.isolation["mode"] == "userns":  # inside uid 65534 is the sandbox uid outside
        run = await run_sandboxed(ev.policy, {"solution.py": "import time; time.sleep(2)"}, ["solution.py"])
        assert run.exit_code == 0


async def test_climbing_out_of_the_private_root_fails(ev):
    code = ("import os\nout = []\n"
            "try:\n    os.mkdir('jail'); os.chroot('jail'); out.append('chrooted')\nexcept OSError as e:\n"
            "    out.append(type(e).__name__)\n"
            "for p in ('/proc/1/root/../../..', '/..', '/proc/self/cwd/../..'):\n"
            "    try:\n        out.append(sorted(os.listdir(p)))\n    except OSError as e:\n"
            "        out.append(type(e).__name__)\n"
            "out.append(open('/proc/self/mountinfo').read().count('/tmp'))\n"
            "print(out)\n")
    run = await run_sandboxed(ev.policy, {"solution.py": code}, ["solution.py"])
    assert run.exit_code == 0, run.stderr
    out = eval(run.stdout.decode())  # noqa: S307 - our own test's printed list
    assert out[0] == "PermissionError"
    for listing in out[1:4]:  # every way up is refused or ends at the private root
        assert listing == "PermissionError" or (
            "work" in listing and ".rft" in listing and "root" not in listing and "home" not in listing), listing
    assert out[4] == 0  # no mount of the server's /tmp is even listed


# ------------------------------------------------------------------------------ exhaustion


async def test_disk_exhaustion_stops_at_the_workdir_quota():
    ev = make(workQuotaMB=8, maxFileSizeMB=4)
    code = ("i = 0\nwhile True:\n    with open(f'f{i}', 'wb') as fh:\n        fh.write(b'x' * (1 << 20))\n"
            "    i += 1\n")
    result = await ev.score(Sample(text=code), ADD)
    assert result.error == "runtime_error" and "No space left on device" in result.reason, result.reason
    await still_honest(ev)


async def test_file_count_exhaustion_stops_at_the_inode_quota():
    ev = make(workMaxFiles=64)
    code = "i = 0\nwhile True:\n    open(f'f{i}', 'w').close()\n    i += 1\n"
    result = await ev.score(Sample(text=code), ADD)
    assert result.error == "runtime_error" and "No space left on device" in result.reason, result.reason
    await still_honest(ev)


async def test_memory_exhaustion_inside_a_tested_call(ev):
    code = "def add(a, b):\n    blocks = []\n    while True:\n        blocks.append(bytearray(1 << 24))\n"
    result = await ev.score(Sample(text=code), ADD)
    assert result.reward == 0.0 and result.error == "runtime_error" and "MemoryError" in result.reason, result
    await still_honest(ev)


async def test_fork_bomb_is_bounded(ev):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = await ev.score(Sample(text=code), ADD)
    assert result.reward == 0.0 and result.error in ("timeout", "runtime_error"), result
    await asyncio.sleep(0.2)
    await still_honest(ev)


async def test_no_network_from_the_sandbox(ev):
    seen: list[object] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(writer.get_extra_info("peername"))
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\ndef add(a, b):\n    return a + b\n"
        result = await ev.score(Sample(text=code), ADD)
        assert result.reward == 0.0 and "OSError" in result.reason or "Error" in result.reason, result.reason
        await asyncio.sleep(0.2)
        assert seen == []
    finally:
        server.close()
        await server.wait_closed()


# ------------------------------------------------------------------------------ as the pods run it


SECCOMP_PROFILE = Path(__file__).resolve().parents[2] / "charts" / "rft-operator" / "files" / "seccomp" / "code-sandbox.json"
LIBSECCOMP = "/usr/lib/x86_64-linux-gnu/libseccomp.so.2"
# Loads the reward pod's seccomp profile (the chart's file) into the driver before it starts the
# launcher: every system call the profile refuses fails with EPERM for the whole sandbox tree.
SECCOMP_PRELUDE = """
import ctypes
lib = ctypes.CDLL({lib!r})
lib.seccomp_init.restype = ctypes.c_void_p
ctx = ctypes.c_void_p(lib.seccomp_init(0x7fff0000))
denied = 0
for rule in json.loads(open({profile!r}).read())["syscalls"]:
    assert rule["action"] == "SCMP_ACT_ERRNO"
    for name in rule["names"]:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr >= 0:
            assert lib.seccomp_rule_add(ctx, 0x00050000 | 1, nr, 0) == 0, name
            denied += 1
assert ctypes.CDLL(None).prctl(38, 1, 0, 0, 0) == 0 and lib.seccomp_load(ctx) == 0
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
assert libc.syscall(135, ctypes.c_ulong(0xffffffff)) == -1 and ctypes.get_errno() == 1  # personality: refused
"""


@pytest.mark.skipif(not IS_ROOT or shutil.which("setpriv") is None or not os.path.exists("/usr/bin/python3"),
                    reason="needs root (to become uid 1000 without capabilities), setpriv and /usr/bin/python3")
@pytest.mark.parametrize("seccomp", [False, True], ids=["no-seccomp", "pod-seccomp-profile"])
def test_as_an_unprivileged_uid_without_capabilities(seccomp):
    """The reward pod's shape: a non-root uid, every capability dropped (and, when the machine has
    libseccomp, the chart's seccomp profile loaded). The launcher still builds the sandbox (user
    namespace), the fd-3 forgery fails and the worker's own 0600 files (its uid!) are not in the view."""
    if seccomp and not os.path.exists(LIBSECCOMP):
        pytest.skip("libseccomp is not installed here")
    uid = 1000
    base = Path(tempfile.mkdtemp(prefix="rft-sec-pod-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        work = base / "work"
        work.mkdir()
        key = str(base / "server.key")
        (work / "solution.py").write_text(
            FD3_FORGERY + f"try:\n    print('READ', open({key!r}).read())\nexcept OSError as e:\n    print('DENIED', e)\n")
        (work / "_rft_harness.py").write_text(HARNESS.read_text())
        (base / "server.key").write_text("POD-SECRET-3")
        os.chmod(base / "server.key", 0o600)
        shutil.copyfile(LAUNCHER, base / "launcher.py")
        # uid 1000 reads the profile from here: the checkout may sit in a directory only root can
        # enter (a clone in `mktemp -d`, mode 0700), as the launcher might
        shutil.copyfile(SECCOMP_PROFILE, base / "seccomp.json")
        os.chmod(base / "seccomp.json", 0o644)
        for p in (work, work / "solution.py", work / "_rft_harness.py", base / "server.key"):
            os.chown(p, uid, uid)
        os.chmod(work, 0o700)
        cfg = {"workdir": str(work), "argv": ["/usr/bin/python3", "-I", "-B", "/.rft/_rft_harness.py", "tests"],
               "sandbox_uid": 65534, "sandbox_gid": 65534, "limits": {"cpu": 10, "nproc": 32, "as": 512 << 20},
               "mode": "auto", "denied_paths": [], "readable_paths": list(DEFAULT_READABLE_PATHS)}
        driver = base / "driver.py"
        prelude = SECCOMP_PRELUDE.format(lib=LIBSECCOMP, profile=str(base / "seccomp.json")) if seccomp else ""
        driver.write_text(
            "import json, os, subprocess, sys\n" + prelude +
            "r, w = os.pipe()\n"
            f"cfg = dict(json.loads({json.dumps(cfg)!r}), report_fd=w, parent_pid=os.getpid())\n"
            f"p = subprocess.run(['/usr/bin/python3', '-I', '-S', {str(base / 'launcher.py')!r}, json.dumps(cfg)],\n"
            "                   pass_fds=(w,), capture_output=True, timeout=60, env={},\n"
            "                   input=json.dumps({'tests': ['assert add(2, 3) == 5']}).encode())\n"
            "os.close(w)\n"
            "print(json.dumps({'rc': p.returncode, 'out': p.stdout.decode(), 'err': p.stderr.decode(),\n"
            "                  'report': os.read(r, 65536).decode()}))\n")
        os.chmod(driver, 0o644)
        proc = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
                               "--bounding-set=-all", "/usr/bin/python3", str(driver)], capture_output=True, timeout=120)
        assert proc.returncode == 0, proc.stderr.decode()
        outcome = json.loads(proc.stdout)
        reports = [json.loads(line) for line in outcome["report"].splitlines()]
        setup = reports[0]
        if setup.get("kind") == "setup_error":
            pytest.skip(f"unprivileged user namespaces are not allowed here: {setup}")
        assert setup["mode"] == "userns" and setup["root"] == "private", setup
        results = [r for r in reports if r.get("kind") == "result"]
        assert len(results) == 1 and results[0].get("passed", 0) == 0, reports  # an error or 0 passed
        assert "POD-SECRET-3" not in outcome["out"] and "DENIED" in outcome["out"], outcome
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------------------ no sandbox, no server


def test_reward_server_refuses_to_start_without_a_sandbox(tmp_path, monkeypatch, capsys):
    """Where the sandbox cannot be built the reward server exits non-zero with one line naming the
    cause (also as the container's termination message) and never offers to run unsandboxed."""
    from rft_api.job import validate_spec
    from rft_runtime.rewards import server
    from tests.support.runtime_config import local_config

    spec = validate_spec({"model": {"base": "builtin:tiny"}, "dataset": {"train": {"builtin": "arithmetic"}},
                          "evaluator": {"builtin": "code_sandbox", "config": {"python": "/nonexistent/python3"}}})
    config = tmp_path / "config.json"
    config.write_text(local_config("reward", spec, inference=["http://127.0.0.1:9"], checkpoints=tmp_path / "ckpt",
                                   output=tmp_path / "out").to_json())
    termination = tmp_path / "termination-log"
    termination.write_text("")
    monkeypatch.setattr(server, "TERMINATION_LOG", str(termination))
    assert server.main(["--config", str(config), "--host", "127.0.0.1", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    reason = termination.read_text()
    assert reason and "\n" not in reason and reason in err
    assert "code_sandbox" in reason and "cannot isolate" in reason
    for advice in ("allowNetworkFallback", "isolation: none", "without namespaces", "unsandboxed"):
        assert advice not in reason


async def test_subclasses_of_plain_types_cross_as_their_value(ev):
    """Honest solutions returning a Counter or a namedtuple still pass; an int subclass that claims
    to equal everything is compared by its value."""
    honest = ("from collections import Counter, namedtuple\nP = namedtuple('P', 'x y')\n"
              "def count(s):\n    return Counter(s)\ndef point():\n    return P(1, 2)\n")
    tests = Item(ground_truth=["assert count('aab') == {'a': 2, 'b': 1}", "assert point() == (1, 2)"])
    result = await ev.score(Sample(text=honest), tests)
    assert (result.reward, result.error) == (1.0, None), result.reason
    liar = ("class Liar(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
            "def add(a, b):\n    return Liar(-7)\n")
    result = await ev.score(Sample(text=liar), ADD)
    assert result.reward == 0.0, result.reason
