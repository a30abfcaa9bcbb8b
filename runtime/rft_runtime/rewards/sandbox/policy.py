"""Limits and isolation settings of one sandboxed run."""

from __future__ import annotations

import math
import os
import shutil
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..options import Options

__all__ = ["SandboxPolicy", "DEFAULT_DENIED_PATHS", "DEFAULT_READABLE_PATHS", "MODES", "default_python"]

DEFAULT_DENIED_PATHS = ("/var/run/secrets", "/run/secrets")
# What the sandbox's private root shows (read-only): the interpreter and the system libraries only.
DEFAULT_READABLE_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache",
                          "/etc/localtime")
MODES = ("auto", "userns", "root")
REMOVED = {"allowNetworkFallback": "there is no unisolated fallback any more: where the sandbox cannot be "
                                   "built the reward server refuses to start (see docs/code-sandbox.md)"}


def _world_executable(path: str) -> bool:
    """True when every directory above ``path`` is world-searchable and it is world-executable,
    so an unprivileged sandbox uid can run it."""
    real = os.path.realpath(path)
    if not os.path.isfile(real) or not os.stat(real).st_mode & 0o001:
        return False
    parent = os.path.dirname(real)
    while True:
        if not os.stat(parent).st_mode & 0o001:
            return False
        if parent == "/":
            return True
        parent = os.path.dirname(parent)


def default_python() -> str:
    """The interpreter for untrusted code: ours when the sandbox uid can run it, else the system
    ``python3`` (only the standard library is needed)."""
    candidates = [sys.executable, os.path.realpath(sys.executable), shutil.which("python3") or "",
                  "/usr/local/bin/python3", "/usr/bin/python3"]
    for c in candidates:
        if c and _world_executable(c):
            return os.path.realpath(c)
    return sys.executable


@dataclass(frozen=True)
class SandboxPolicy:
    """What one run may use. ``timeout_seconds`` is wall clock for the whole run (interpreter start
    included); ``cpu_seconds`` is RLIMIT_CPU; ``memory_mb`` is RLIMIT_AS; ``max_processes`` bounds
    RLIMIT_NPROC (counted per user namespace and uid on Linux ≥ 5.14; per uid system-wide in ``root``
    mode, so give concurrent workers distinct ``sandbox_uid``s there)."""

    python: str = field(default_factory=default_python)
    timeout_seconds: float = 10.0
    cpu_seconds: int = 10
    memory_mb: int = 512
    max_file_size_mb: int = 16
    max_processes: int = 16
    max_open_files: int = 64
    max_output_bytes: int = 64 * 1024
    sandbox_uid: int = 65534
    sandbox_gid: int = 65534
    mode: str = "auto"
    denied_paths: tuple[str, ...] = DEFAULT_DENIED_PATHS
    readable_paths: tuple[str, ...] = DEFAULT_READABLE_PATHS
    work_quota_mb: int = 64
    work_max_files: int = 1024
    work_root: str | None = None

    @classmethod
    def from_config(cls, opts: Options) -> "SandboxPolicy":
        """Reads the camelCase sandbox fields of a ``code_sandbox`` config."""
        timeout = opts.number("timeoutSeconds", 10.0, minimum=0.1, maximum=3600)
        cpu = opts.number("cpuSeconds", math.ceil(timeout), minimum=1, maximum=3600, integer=True)
        extra = opts.str_list("deniedPaths", [])
        for p in extra:
            if not os.path.isabs(p):
                raise opts.error("deniedPaths", f"must hold absolute paths, got {p!r}")
        for name, why in REMOVED.items():
            if opts.any(name, None) is not None:
                raise opts.error(name, f"was removed: {why}")
        if opts.any("isolation", None) == "none":
            raise opts.error("isolation", "'none' was removed: untrusted code always runs in namespaces "
                                          f"(one of {', '.join(MODES)})")
        mode = opts.str("isolation", "auto", choices=MODES)
        readable = opts.str_list("readablePaths", [])
        for p in readable:
            if not os.path.isabs(p):
                raise opts.error("readablePaths", f"must hold absolute paths, got {p!r}")
        python = opts.str("python", None) or default_python()
        work_root = opts.str("workRoot", None)
        return cls(
            python=python,
            timeout_seconds=timeout,
            cpu_seconds=cpu,
            memory_mb=opts.number("memoryMB", 512, minimum=32, maximum=1 << 20, integer=True),
            max_file_size_mb=opts.number("maxFileSizeMB", 16, minimum=1, integer=True),
            max_processes=opts.number("maxProcesses", 16, minimum=1, maximum=4096, integer=True),
            max_open_files=opts.number("maxOpenFiles", 64, minimum=16, maximum=65536, integer=True),
            max_output_bytes=opts.number("maxOutputBytes", 64 * 1024, minimum=1024, integer=True),
            sandbox_uid=opts.number("sandboxUid", 65534, minimum=1, maximum=2**32 - 2, integer=True),
            sandbox_gid=opts.number("sandboxGid", 65534, minimum=1, maximum=2**32 - 2, integer=True),
            mode=mode,
            denied_paths=tuple(DEFAULT_DENIED_PATHS) + tuple(extra),
            readable_paths=tuple(DEFAULT_READABLE_PATHS) + tuple(readable),
            work_quota_mb=opts.number("workQuotaMB", 64, minimum=1, maximum=1 << 16, integer=True),
            work_max_files=opts.number("workMaxFiles", 1024, minimum=16, maximum=1 << 20, integer=True),
            work_root=work_root,
        )

    def launcher_limits(self) -> dict[str, Any]:
        """The rlimits the launcher applies (bytes and counts)."""
        return {
            "cpu": self.cpu_seconds,
            "as": self.memory_mb << 20,
            "fsize": self.max_file_size_mb << 20,
            "nproc": self.max_processes + 1,  # + the pid-1 supervisor
            "nofile": self.max_open_files,
        }

    def view_paths(self) -> list[str]:
        """The paths the sandbox's root shows read-only: ``readable_paths`` plus the installation
        prefix of :attr:`python` (its standard library) when that lies elsewhere."""
        prefix = os.path.dirname(os.path.dirname(os.path.realpath(self.python)))
        paths = list(self.readable_paths)
        if prefix not in ("", "/") and not any(prefix == p or prefix.startswith(p.rstrip("/") + "/") for p in paths):
            paths.append(prefix)
        return paths

    def with_mode(self, mode: str) -> "SandboxPolicy":
        """A copy with another isolation mode."""
        from dataclasses import replace

        return replace(self, mode=mode)

    def describe(self) -> Mapping[str, Any]:
        """Settings for logs and reasons (no secrets here)."""
        return {"python": self.python, "timeoutSeconds": self.timeout_seconds, "cpuSeconds": self.cpu_seconds,
                "memoryMB": self.memory_mb, "maxProcesses": self.max_processes, "isolation": self.mode,
                "workQuotaMB": self.work_quota_mb}
