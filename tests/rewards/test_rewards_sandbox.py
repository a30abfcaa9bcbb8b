"""Builtin ``code_sandbox``: real attacks, each contained, reported with an error flag, and followed
by a normal sample that still scores 1.0 on the same evaluator."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from rft_runtime.rewards import ConfigError, Item, Sample, ScoreResult
from rft_runtime.rewards.builtins import CodeSandboxEvaluator
from rft_runtime.rewards.builtins.code_sandbox import extract_code, parse_tests
from rft_runtime.rewards.sandbox import DEFAULT_DENIED_PATHS, SandboxUnavailableError, probe
from rft_runtime.rewards.sandbox.policy import DEFAULT_READABLE_PATHS, SandboxPolicy

from .conftest import processes_of_uid

ADD_TESTS = Item(ground_truth=["assert add(2, 3) == 5", "assert add(-1, 1) == 0"])
GOOD = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\n"
IS_ROOT = os.geteuid() == 0
SANDBOX_UID = 64000 + random.randrange(900)  # a uid nothing else on this machine runs as


def make(**extra: object) -> CodeSandboxEvaluator:
    config = {"timeoutSeconds": 4, "memoryMB": 256, "maxProcesses": 8, "sandboxUid": SANDBOX_UID,
              "sandboxGid": SANDBOX_UID, **extra}
    return CodeSandboxEvaluator(config)


@pytest.fixture(scope="module")
def sandbox() -> CodeSandboxEvaluator:
    return make()


@pytest.fixture
def open_dir() -> Path:
    """A world-writable directory directly under /tmp (pytest's tmp_path sits below a 0700 directory,
    which would stop the sandbox uid for the wrong reason)."""
    path = Path(tempfile.mkdtemp(prefix="rft-rewards-test-", dir="/tmp"))
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def assert_contained(ev: CodeSandboxEvaluator, result: ScoreResult, kinds: tuple[str, ...]) -> None:
    """The attack was flagged, nothing of it is left running, and the worker still scores normally."""
    assert result.reward == 0.0
    assert result.error in kinds, result
    await asyncio.sleep(0.2)
    if IS_ROOT:
        assert processes_of_uid(SANDBOX_UID) == [], "sandboxed processes survived the run"
    after = await ev.score(Sample(text=GOOD), ADD_TESTS)
    assert (after.reward, after.error) == (1.0, None), after


def test_isolation_achieved_here(sandbox: CodeSandboxEvaluator) -> None:
    iso = sandbox.isolation
    assert iso["net_ns"] and iso["mount_ns"] and iso["pid_ns"], iso
    assert iso["mode"] in ("userns", "root") and iso["readonly_root"] in ("mount_setattr", "remount")
    assert iso["proc"] == "private"
    assert set(DEFAULT_DENIED_PATHS) <= set(sandbox.policy.denied_paths)


async def test_correct_solution_scores_one_and_wrong_zero(sandbox: CodeSandboxEvaluator) -> None:
    good = await sandbox.score(Sample(text=GOOD), ADD_TESTS)
    assert (good.reward, good.error, good.metrics["tests_passed"]) == (1.0, None, 2.0)
    wrong = await sandbox.score(Sample(text="def add(a, b):\n    return a - b\n"), ADD_TESTS)
    assert (wrong.reward, wrong.error) == (0.0, None) and "failed" in wrong.reason
    syntax = await sandbox.score(Sample(text="```python\ndef add(a, b)\n    return\n```"), ADD_TESTS)
    assert (syntax.reward, syntax.error) == (0.0, "parse_error")


async def test_partial_credit_and_stdin_cases() -> None:
    ev = make(partialCredit=True)
    half = await ev.score(Sample(text="def add(a, b):\n    return a + b if a > 0 else 7\n"), ADD_TESTS)
    assert half.reward == 0.5 and half.metrics == {"tests_passed": 1.0, "tests_total": 2.0}
    io_item = Item(ground_truth={"inputs": ["3 4\n", "10 -2\n"], "outputs": ["7\n", "8"]})
    ok = await ev.score(Sample(text="a, b = map(int, input().split())\nprint(a + b)"), io_item)
    assert ok.reward == 1.0
    bad = await ev.score(Sample(text="a, b = map(int, input().split())\nprint(a * b)"), io_item)
    assert bad.reward == 0.0 and "expected '7', got '12'" in bad.reason


async def test_environment_is_empty_and_privileges_are_dropped(sandbox: CodeSandboxEvaluator,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RFT_WORKER_SECRET", "hunter2")
    checks = [
        "import os; assert set(os.environ) <= {'LC_CTYPE'}, dict(os.environ)",  # Python's own locale coercion
        "status = open('/proc/self/status').read()\n"
        "fields = dict(l.split(':', 1) for l in status.splitlines())\n"
        "assert int(fields['CapEff'].strip(), 16) == 0 and int(fields['CapBnd'].strip(), 16) == 0\n"
        "assert fields['NoNewPrivs'].strip() == '1'",
        "import os; assert os.getuid() != 0 and os.getpid() < 10",  # private pid namespace
        "import os; assert not any(p.isdigit() and int(p) > 50 for p in os.listdir('/proc'))",
        "import os; assert os.path.realpath('.') != '/' and os.access('.', os.W_OK)",
    ]
    result = await sandbox.score(Sample(text="x = 1"), Item(ground_truth=checks))
    assert (result.reward, result.error) == (1.0, None), result.reason


async def test_fork_bomb(sandbox: CodeSandboxEvaluator) -> None:
    result = await sandbox.score(Sample(text="import os\nwhile True:\n    os.fork()\n"), ADD_TESTS)
    assert "BlockingIOError" in result.reason or result.error == "timeout", result.reason
    await assert_contained(sandbox, result, ("runtime_error", "timeout"))


async def test_fork_bomb_that_ignores_failures(sandbox: CodeSandboxEvaluator) -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = await sandbox.score(Sample(text=code), ADD_TESTS)
    await assert_contained(sandbox, result, ("timeout",))


async def test_memory_bomb(sandbox: CodeSandboxEvaluator) -> None:
    code = "blocks = []\nwhile True:\n    blocks.append(bytearray(16 * 1024 * 1024))\n"
    result = await sandbox.score(Sample(text=code), ADD_TESTS)
    assert "MemoryError" in result.reason and "256 MB" in result.reason
    await assert_contained(sandbox, result, ("runtime_error",))


async def test_infinite_loop(sandbox: CodeSandboxEvaluator) -> None:
    result = await sandbox.score(Sample(text="while True:\n    pass\n"), ADD_TESTS)
    assert "limit" in result.reason
    await assert_contained(sandbox, result, ("timeout",))


async def test_write_outside_workdir(sandbox: CodeSandboxEvaluator, open_dir: Path) -> None:
    target = open_dir / "escaped.txt"  # file permissions would allow it: the private root has no /tmp of ours
    code = f"with open({str(target)!r}, 'w') as fh:\n    fh.write('escaped')\n"
    result = await sandbox.score(Sample(text=code), ADD_TESTS)
    assert "No such file or directory" in result.reason, result.reason
    assert not target.exists()
    await assert_contained(sandbox, result, ("runtime_error",))
    # what the view does show (the interpreter's /usr) is read-only
    result = await sandbox.score(Sample(text="open('/usr/rft-escape', 'w')\n"), ADD_TESTS)
    assert "Read-only file system" in result.reason, result.reason
    assert not os.path.exists("/usr/rft-escape")


async def test_writes_inside_workdir_work(sandbox: CodeSandboxEvaluator) -> None:
    code = "with open('scratch.txt', 'w') as fh:\n    fh.write('ok')\n"
    result = await sandbox.score(Sample(text=code), Item(ground_truth="assert open('scratch.txt').read() == 'ok'"))
    assert (result.reward, result.error) == (1.0, None), result.reason


async def test_reading_secrets_is_denied(open_dir: Path) -> None:
    secrets = open_dir / "serviceaccount"
    secrets.mkdir()
    os.chmod(secrets, 0o755)
    token = secrets / "token"
    token.write_text("TOKEN-abc123")
    os.chmod(token, 0o644)  # world-readable: only the denied-path mount hides it
    private = open_dir / "private.key"
    private.write_text("KEY-xyz789")
    os.chmod(private, 0o600)  # not listed: the separate uid cannot read it
    ev = make(deniedPaths=[str(secrets)])
    for path in (token, private):  # not in the private root at all (only system paths are)
        code = f"print(open({str(path)!r}).read())\n"
        result = await ev.score(Sample(text=code), ADD_TESTS)
        assert "No such file or directory" in result.reason, result.reason
        assert "TOKEN-abc123" not in result.reason and "KEY-xyz789" not in result.reason
        await assert_contained(ev, result, ("runtime_error",))
    listing = await ev.score(Sample(text=f"import os\nprint(os.listdir({str(secrets)!r}))\n"), ADD_TESTS)
    assert listing.error == "runtime_error" and "No such file or directory" in listing.reason


async def test_opening_a_socket_to_a_local_listener_fails(sandbox: CodeSandboxEvaluator) -> None:
    connections: list[object] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer.get_extra_info("peername"))
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'hi')\n"
        result = await sandbox.score(Sample(text=code), ADD_TESTS)
        assert "OSError" in result.reason or "ConnectionRefusedError" in result.reason, result.reason
        await asyncio.sleep(0.2)
        assert connections == []
        await assert_contained(sandbox, result, ("runtime_error",))
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.skipif(not IS_ROOT, reason="the explicit root mode needs root")
async def test_root_mode_without_user_namespace() -> None:
    ev = make(isolation="root")
    assert ev.isolation["mode"] == "root" and not ev.isolation["user_ns"] and ev.isolation["net_ns"]
    assert ev.isolation["uid"] == SANDBOX_UID
    result = await ev.score(Sample(text="open('/etc/rft-root-mode-escape', 'w')\n"), ADD_TESTS)
    assert not os.path.exists("/etc/rft-root-mode-escape")
    await assert_contained(ev, result, ("runtime_error",))


PROBE_CODE = (
    "import os, socket\nout = {{'uid': os.getuid()}}\n"
    "try:\n    open({secret!r}).read(); out['secret'] = 'read'\nexcept OSError as e:\n    out['secret'] = type(e).__name__\n"
    "try:\n    open({outside!r}, 'w'); out['write'] = 'ok'\nexcept OSError as e:\n    out['write'] = e.strerror\n"
    "try:\n    socket.create_connection(('127.0.0.1', 22), timeout=1); out['net'] = 'ok'\n"
    "except OSError as e:\n    out['net'] = e.strerror\n"
    "print(repr(out))"
)


def run_launcher(workdir: Path, code: str, run_as: int | None = None, **cfg: object) -> tuple[dict, dict]:
    """Runs the launcher directly (as ``run_as`` through setpriv when given) with /usr/bin/python3;
    returns (setup report, {"rc", "out", "err"})."""
    import json
    import subprocess

    from rft_runtime.rewards.sandbox.runner import LAUNCHER as launcher_path

    LAUNCHER = str(launcher_path)

    driver = workdir.parent / f"driver-{os.getpid()}.py"
    if run_as is not None:
        # The checkout may sit in a directory the unprivileged uid cannot enter (a 0700 temp dir):
        # run a world-readable copy of the launcher (it is self-contained, stdlib only).
        copy = workdir.parent / "launcher.py"
        shutil.copyfile(LAUNCHER, copy)
        os.chmod(copy, 0o644)
        LAUNCHER = str(copy)
    config = {"workdir": str(workdir), "argv": ["/usr/bin/python3", "-I", "-c", code], "sandbox_uid": SANDBOX_UID,
              "sandbox_gid": SANDBOX_UID, "limits": {"cpu": 5, "nproc": 16}, "mode": "auto", "denied_paths": [],
              "readable_paths": list(DEFAULT_READABLE_PATHS), **cfg}
    driver.write_text(
        "import json, os, subprocess, sys\n"
        "r, w = os.pipe()\n"
        f"cfg = dict(json.loads({json.dumps(config)!r}), report_fd=w, parent_pid=os.getpid())\n"
        f"p = subprocess.run(['/usr/bin/python3', '-I', '-S', {LAUNCHER!r}, json.dumps(cfg)], pass_fds=(w,),\n"
        "                   capture_output=True, timeout=60, env={})\n"
        "os.close(w)\n"
        "print(json.dumps({'rc': p.returncode, 'out': p.stdout.decode(), 'err': p.stderr.decode(),\n"
        "                  'report': os.read(r, 65536).decode()}))\n")
    os.chmod(driver, 0o644)
    prefix = ["setpriv", f"--reuid={run_as}", f"--regid={run_as}", "--clear-groups"] if run_as is not None else []
    proc = subprocess.run([*prefix, "/usr/bin/python3", str(driver)], capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    outcome = json.loads(proc.stdout)
    return json.loads(outcome.pop("report").splitlines()[0]), outcome


NEEDS_SYSTEM_PYTHON = pytest.mark.skipif(not IS_ROOT or not os.path.exists("/usr/bin/python3"),
                                         reason="needs root and /usr/bin/python3 to drive the launcher directly")


@NEEDS_SYSTEM_PYTHON
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv to start an unprivileged worker")
def test_unprivileged_worker_gets_a_user_namespace(open_dir: Path) -> None:
    """The launcher run by a non-root worker (as in a pod): user, net, mount and pid namespaces."""
    workdir = open_dir / "work"
    workdir.mkdir()
    secret = open_dir / "secret"
    secret.write_text("s3cret")
    os.chmod(secret, 0o644)
    uid = SANDBOX_UID + 1
    os.chown(workdir, uid, uid)
    os.chown(secret, uid, uid)  # owned by the worker uid itself: only the denied-path mount protects it
    outside = open_dir / "escape.txt"
    code = PROBE_CODE.format(secret=str(secret), outside=str(outside))
    setup, outcome = run_launcher(workdir, code, run_as=uid, denied_paths=[str(secret)])
    if setup.get("kind") == "setup_error":
        pytest.skip(f"unprivileged user namespaces are not allowed here: {setup}")
    assert setup["mode"] == "userns" and setup["net_ns"] and setup["mount_ns"] and setup["uid"] == 65534, setup
    assert outcome["rc"] == 0, outcome
    assert "'secret': 'FileNotFoundError'" in outcome["out"]  # the worker's own files are not in the view
    assert "'write': 'No such file or directory'" in outcome["out"]
    assert "'net': 'Network is unreachable'" in outcome["out"]
    assert not outside.exists()


@NEEDS_SYSTEM_PYTHON
@pytest.mark.parametrize("mode", ["userns", "root"])
def test_remount_fallback_for_kernels_without_mount_setattr(open_dir: Path, mode: str) -> None:
    workdir = open_dir / "work"
    workdir.mkdir()
    os.chown(workdir, SANDBOX_UID, SANDBOX_UID)
    code = (PROBE_CODE.format(secret="/usr/lib/os-release", outside="/usr/rft-escape")
            + "\nopen('inside.txt', 'w').write('ok'); print(open('inside.txt').read())")
    setup, outcome = run_launcher(workdir, code, mode=mode, readonly_method="remount",
                                  denied_paths=["/usr/lib/os-release"])
    assert setup["kind"] == "setup" and setup["readonly_root"] == "remount" and setup["mode"] == mode, setup
    assert outcome["rc"] == 0, outcome
    assert "'write': 'Read-only file system'" in outcome["out"] and "'secret': 'PermissionError'" in outcome["out"]
    assert outcome["out"].strip().endswith("ok")  # the private /work stays writable
    assert not (workdir / "inside.txt").exists()  # and nothing reaches the outside workdir
    assert not os.path.exists("/usr/rft-escape")


def test_refusal_when_no_namespace_can_be_made(monkeypatch: pytest.MonkeyPatch) -> None:
    # Simulates a kernel/seccomp profile that refuses namespaces: the probe's launcher outcome.
    def no_namespaces(policy: SandboxPolicy):  # type: ignore[no-untyped-def]
        return None, "namespaces: OSError: cannot create namespaces (userns: EPERM; root: not root)"

    monkeypatch.setattr(probe, "_probe_blocking", no_namespaces)
    monkeypatch.setattr(probe, "_cache", {})
    with pytest.raises(SandboxUnavailableError, match="seccomp profile the chart ships") as refused:
        make(timeoutSeconds=3)
    # The refusal names what to fix, never running untrusted code without isolation.
    assert "allowNetworkFallback" not in str(refused.value) and "without namespaces" not in str(refused.value)
    assert "EPERM" in str(refused.value)


def test_unisolated_modes_were_removed() -> None:
    with pytest.raises(ConfigError, match="'isolation' 'none' was removed"):
        make(isolation="none")
    with pytest.raises(ConfigError, match="'allowNetworkFallback' was removed"):
        make(allowNetworkFallback=True)
    with pytest.raises(ConfigError, match="'allowNetworkFallback' was removed"):
        make(allowNetworkFallback=False)


def test_code_extraction_and_test_parsing() -> None:
    text = "```\nprint(1)\n```\nthen\n```python\nx = 2\n```\n```bash\nls\n```"
    assert extract_code(text) == "x = 2\n"
    assert extract_code("x = 3") == "x = 3"
    assert extract_code("no code", require_block=True) is None
    assert parse_tests("assert f() == 1") == (["assert f() == 1"], [])
    assert parse_tests('[{"input": "1", "output": "2"}]') == ([], [("1", "2")])
    assert parse_tests({"tests": ["a", "b"], "cases": [{"input": "x", "output": "y"}]}) == (["a", "b"], [("x", "y")])
    with pytest.raises(ValueError, match="no tests"):
        parse_tests({})


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match="language"):
        CodeSandboxEvaluator({"language": "rust"})
    with pytest.raises(ConfigError, match="memoryMB"):
        CodeSandboxEvaluator({"memoryMB": 1})
    with pytest.raises(ConfigError, match="deniedPaths"):
        CodeSandboxEvaluator({"deniedPaths": ["relative/path"]})


def test_workdirs_are_private_and_removed(sandbox: CodeSandboxEvaluator) -> None:
    root = sandbox.policy.work_root or "/tmp"
    before = {p for p in os.listdir(root) if p.startswith("rft-sbx-")}
    asyncio.run(sandbox.score(Sample(text=GOOD), ADD_TESTS))
    after = {p for p in os.listdir(root) if p.startswith("rft-sbx-")}
    assert after <= before
    for p in after:  # other concurrent runs' dirs, if any, are private
        assert stat.S_IMODE(os.stat(os.path.join(root, p)).st_mode) == 0o700


async def test_composite_timeout_shorter_than_the_sandbox_cleans_up(open_dir: Path) -> None:
    """The composite cancels the run: the process tree is killed and the workdir removed."""
    from rft_runtime.rewards import CompositeEvaluator, Slot

    ev = make(timeoutSeconds=30, workRoot=str(open_dir))
    comp = CompositeEvaluator([Slot("code", ev, 1.0, timeout_seconds=1.0)])
    big_stdin = Item(ground_truth=[{"input": "x" * (1 << 20), "output": ""}])  # never read by the code
    result = await comp.score(Sample(text="while True:\n    pass\n"), big_stdin)
    assert (result.reward, result.error) == (0.0, "timeout")
    await asyncio.sleep(0.3)
    assert [p for p in os.listdir(open_dir) if p.startswith("rft-sbx-")] == []
    await assert_contained(ev, result, ("timeout",))
    await comp.aclose()
