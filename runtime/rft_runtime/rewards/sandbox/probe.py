"""Finding out, once per process and policy, which isolation the launcher achieves here."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from .policy import SandboxPolicy
from .runner import run_sandboxed

__all__ = ["SandboxUnavailableError", "probe_isolation"]

_cache: dict[tuple[Any, ...], tuple[SandboxPolicy, dict[str, Any]]] = {}
_lock = threading.Lock()


class SandboxUnavailableError(RuntimeError):
    """The sandbox cannot be built with the required isolation on this machine."""


def _probe_blocking(policy: SandboxPolicy) -> tuple[dict[str, Any] | None, str]:
    """Runs ``python -c pass`` under the launcher in a private event loop (a thread of its own, so
    it also works when called from inside a running loop)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["run"] = asyncio.run(run_sandboxed(policy, {}, ["-c", "pass"]))
        except Exception as exc:  # noqa: BLE001 - reported below
            box["error"] = f"{type(exc).__name__}: {exc}"

    t = threading.Thread(target=target, name="rft-sandbox-probe")
    t.start()
    t.join()
    if "error" in box:
        return None, box["error"]
    run = box["run"]
    if run.setup_error:
        return None, f"{run.setup_error.get('stage')}: {run.setup_error.get('error')}"
    if run.setup is None or run.exit_code != 0:
        detail = run.stderr.decode(errors="replace").strip()[-300:]
        return None, f"probe exited with {run.exit_code}: {detail or 'no output'}"
    return run.setup, ""


def probe_isolation(policy: SandboxPolicy) -> tuple[SandboxPolicy, dict[str, Any]]:
    """The policy to use (mode resolved) and the isolation the launcher reported.

    Raises SandboxUnavailableError when neither a user namespace nor root namespaces can be made
    (there is no unisolated fallback)."""
    key = (policy.python, policy.mode, policy.sandbox_uid, policy.sandbox_gid, policy.denied_paths,
           policy.readable_paths, policy.work_quota_mb, policy.work_max_files, policy.work_root)
    with _lock:
        if key in _cache:
            return _cache[key]
        setup, why = _probe_blocking(policy)
        if setup is not None:
            resolved = policy.with_mode(setup["mode"])
        else:
            raise SandboxUnavailableError(
                "code_sandbox: cannot isolate untrusted code here (no user/network/mount/pid namespace): "
                f"{why}. The reward pod needs the seccomp profile the chart ships "
                "(charts/rft-operator/files/seccomp/code-sandbox.json, installed on the node as "
                "<kubelet root>/seccomp/rft/code-sandbox.json) and a kernel that allows user namespaces; "
                "see docs/code-sandbox.md.")
        _cache[key] = (resolved, setup)
        return resolved, setup
