"""Running one untrusted program under the launcher, asynchronously.

:func:`run_sandboxed` writes the files into a fresh working directory, starts ``launcher.py`` in a
new session, reads stdout/stderr (capped) and the report pipe, enforces the wall-clock timeout by
killing the launcher's whole process group (which tears down the pid namespace), and removes the
working directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from .policy import SandboxPolicy

__all__ = ["SandboxRun", "run_sandboxed", "LAUNCHER", "SETUP_FAILED_EXIT"]

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launcher.py")
SETUP_FAILED_EXIT = 125
_DRAIN_GRACE = 2.0


@dataclass
class SandboxRun:
    """What happened: exit code (128+N when killed by signal N), whether our wall-clock timeout
    fired, captured output, and the report lines (setup info, setup errors, harness results)."""

    exit_code: int | None
    timed_out: bool
    stdout: bytes
    stderr: bytes
    output_truncated: bool
    reports: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def setup(self) -> dict[str, Any] | None:
        """The launcher's ``setup`` report (isolation achieved), if it got that far."""
        return next((r for r in self.reports if r.get("kind") == "setup"), None)

    @property
    def setup_error(self) -> dict[str, Any] | None:
        """The first ``setup_error`` report, if any."""
        return next((r for r in self.reports if r.get("kind") == "setup_error"), None)

    @property
    def result(self) -> dict[str, Any] | None:
        """The harness's last ``result`` report, if any."""
        results = [r for r in self.reports if r.get("kind") == "result"]
        return results[-1] if results else None


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> tuple[bytes, bool]:
    """Reads to EOF keeping at most ``cap`` bytes (the rest is drained and dropped)."""
    kept = bytearray()
    truncated = False
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return bytes(kept), truncated
        room = cap - len(kept)
        if room > 0:
            kept += chunk[:room]
        if len(chunk) > room:
            truncated = True


def _prepare_workdir(policy: SandboxPolicy, files: Mapping[str, str | bytes]) -> str:
    workdir = tempfile.mkdtemp(prefix="rft-sbx-", dir=policy.work_root)
    for name, content in files.items():
        if os.path.basename(name) != name:
            raise ValueError(f"sandbox file name {name!r} must be a plain file name")
        data = content.encode() if isinstance(content, str) else content
        with open(os.path.join(workdir, name), "wb") as fh:
            fh.write(data)
    os.chmod(workdir, 0o700)  # only the launcher reads it: the code sees a private tmpfs copy at /work
    return workdir


def _remove_workdir(path: str) -> None:
    def retry(func: Any, p: str, _exc: Any) -> None:
        try:
            os.chmod(os.path.dirname(p), stat.S_IRWXU)
            os.chmod(p, stat.S_IRWXU)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)


def _parse_reports(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for line in raw.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


async def run_sandboxed(policy: SandboxPolicy, files: Mapping[str, str | bytes], args: list[str],
                        stdin: bytes | None = None) -> SandboxRun:
    """Runs ``policy.python -I -B *args`` in the sandbox with ``files`` in its working directory
    (``/work`` inside; files named ``_rft_*`` are placed read-only in ``/.rft`` instead)."""
    workdir = _prepare_workdir(policy, files)
    report_r, report_w = os.pipe()
    config = {
        "workdir": workdir,
        "argv": [policy.python, "-I", "-B", *args],
        "sandbox_uid": policy.sandbox_uid,
        "sandbox_gid": policy.sandbox_gid,
        "limits": policy.launcher_limits(),
        "mode": policy.mode,
        "denied_paths": list(policy.denied_paths),
        "readable_paths": policy.view_paths(),
        "work_quota_bytes": policy.work_quota_mb << 20,
        "work_max_files": policy.work_max_files,
        "report_fd": report_w,
        "parent_pid": os.getpid(),
    }
    started = time.monotonic()
    loop = asyncio.get_running_loop()
    report_stream = asyncio.StreamReader(limit=1 << 20)
    transport = None
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", LAUNCHER, json.dumps(config),
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            pass_fds=(report_w,), start_new_session=True, env={},
        )
    except BaseException:
        os.close(report_r)
        os.close(report_w)
        _remove_workdir(workdir)
        raise
    os.close(report_w)
    tasks: list[asyncio.Future[Any]] = []
    try:
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(report_stream), os.fdopen(report_r, "rb", buffering=0))
        assert proc.stdout is not None and proc.stderr is not None
        readers = [
            asyncio.ensure_future(_read_capped(proc.stdout, policy.max_output_bytes)),
            asyncio.ensure_future(_read_capped(proc.stderr, policy.max_output_bytes)),
            asyncio.ensure_future(_read_capped(report_stream, 1 << 20)),
        ]
        tasks += readers
        if stdin is not None and proc.stdin is not None:
            tasks.append(asyncio.ensure_future(_feed(proc.stdin, stdin)))
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), timeout=policy.timeout_seconds)
        except asyncio.TimeoutError:
            timed_out = True
        finally:
            if proc.returncode is None:  # still ours (also when cancelled): kill the whole group
                _kill_group(proc.pid)
                await proc.wait()
        done, pending = await asyncio.wait(readers, timeout=_DRAIN_GRACE)
        if pending:
            # Only without a pid namespace can something outlive the launcher and hold our pipes;
            # it keeps the process group (and so its id) alive, so killing the group is safe.
            _kill_group(proc.pid)
            done, pending = await asyncio.wait(readers, timeout=_DRAIN_GRACE)
        outputs = [t.result() if t in done else (b"", True) for t in readers]
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        if transport is not None:
            transport.close()
        _remove_workdir(workdir)
    (out, out_cut), (err, err_cut), (rep, _) = outputs
    code = proc.returncode
    if code is not None and code < 0:
        code = 128 - code
    return SandboxRun(exit_code=code, timed_out=timed_out, stdout=out, stderr=err,
                      output_truncated=out_cut or err_cut, reports=_parse_reports(rep),
                      seconds=time.monotonic() - started)


async def _feed(stream: asyncio.StreamWriter, data: bytes) -> None:
    """Writes stdin and closes it; a child that stops reading simply ends the feeding."""
    try:
        stream.write(data)
        await stream.drain()
        stream.close()
    except (BrokenPipeError, ConnectionResetError):
        pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
