"""Startup, readiness and liveness probes of the process kubelet (TEST INFRASTRUCTURE).

Each probe of a running container instance is a :class:`ProbeRunner` thread: it waits
``initialDelaySeconds``, then every ``periodSeconds`` runs the check with ``timeoutSeconds`` and
counts consecutive results against ``successThreshold``/``failureThreshold`` (Kubernetes defaults:
0, 10, 1, 1, 3). Checks: ``httpGet`` (HTTP or HTTPS without verification, 200-399 is success; the
host defaults to the pod IP), ``tcpSocket`` (a connection is success) and ``exec`` (run through
``podexec enter`` inside the container's mount namespace with its environment; exit 0 is success).
``grpc`` probes are not supported and always fail with a message saying so.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Obj = dict[str, Any]
DEFAULTS = {"initialDelaySeconds": 0, "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1,
            "failureThreshold": 3}


@dataclass
class ProbeContext:
    """Where a probe of one container instance connects and how it runs commands."""

    pod_ip: str
    ports: dict[str, int]  # named container ports
    pid: int  # the container's main process (its mount namespace)
    env: dict[str, str]
    cwd: str
    spec_dir: Path  # where exec-probe spec files go
    launcher: list[str]  # [python, -I, -S, podexec.py]


def _port(value: Any, ctx: ProbeContext) -> int:
    if isinstance(value, int):
        return value
    if str(value).isdigit():
        return int(value)
    if value in ctx.ports:
        return ctx.ports[value]
    raise ValueError(f"port {value!r} is neither a number nor a named container port")


def check(probe: Obj, ctx: ProbeContext, name: str) -> tuple[bool, str]:
    """Run one check of ``probe``; returns (success, message)."""
    timeout = float(probe.get("timeoutSeconds") or DEFAULTS["timeoutSeconds"])
    try:
        if "httpGet" in probe:
            hg = probe["httpGet"]
            host, port = hg.get("host") or ctx.pod_ip, _port(hg.get("port"), ctx)
            if str(hg.get("scheme", "HTTP")).upper() == "HTTPS":
                conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                    host, port, timeout=timeout, context=ssl._create_unverified_context())  # noqa: S323
            else:
                conn = http.client.HTTPConnection(host, port, timeout=timeout)
            try:
                headers = {h["name"]: h["value"] for h in hg.get("httpHeaders") or []}
                headers.setdefault("User-Agent", "kube-probe/1.34")
                conn.request("GET", hg.get("path") or "/", headers=headers)
                status = conn.getresponse().status
            finally:
                conn.close()
            ok = 200 <= status < 400
            return ok, f"HTTP probe failed with statuscode: {status}" if not ok else ""
        if "tcpSocket" in probe:
            ts = probe["tcpSocket"]
            with socket.create_connection((ts.get("host") or ctx.pod_ip, _port(ts.get("port"), ctx)), timeout=timeout):
                return True, ""
        if "exec" in probe:
            spec = ctx.spec_dir / f"probe-{name}.json"
            fd = os.open(spec, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the env may hold secrets
            with os.fdopen(fd, "w") as f:
                json.dump({"argv": probe["exec"].get("command") or [], "env": ctx.env, "cwd": ctx.cwd}, f)
            p = subprocess.run([*ctx.launcher, "enter", str(ctx.pid), str(spec)], capture_output=True,
                               timeout=timeout, stdin=subprocess.DEVNULL)
            out = (p.stdout + p.stderr).decode(errors="replace").strip()[-500:]
            return p.returncode == 0, f"exec probe exited {p.returncode}: {out}" if p.returncode else ""
        if "grpc" in probe:
            return False, "grpc probes are not supported by the process kubelet"
        return False, "probe has no handler (httpGet, tcpSocket, exec)"
    except subprocess.TimeoutExpired:
        return False, f"probe timed out after {timeout}s"
    except (OSError, ValueError, http.client.HTTPException) as e:
        return False, f"{type(e).__name__}: {e}"


class ProbeRunner:
    """Runs one probe periodically; ``on_change(kind, success, message)`` is called when the
    probe's verdict changes (readiness: ready/unready; startup and liveness: pass/fail; a failing
    startup or liveness verdict ends the runner)."""

    def __init__(self, kind: str, probe: Obj, ctx: ProbeContext, name: str,
                 on_change: Callable[[str, bool, str], None]) -> None:
        self.kind, self.probe, self.ctx, self.name, self.on_change = kind, probe, ctx, name, on_change
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"probe-{name}-{kind}", daemon=True)

    def _get(self, key: str) -> float:
        value = self.probe.get(key)
        return float(value if value is not None else DEFAULTS[key])

    def start(self) -> ProbeRunner:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> None:
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        if self._stop.wait(self._get("initialDelaySeconds")):
            return
        period = max(self._get("periodSeconds"), 0.1)
        need_ok = max(int(self._get("successThreshold")), 1)
        need_fail = max(int(self._get("failureThreshold")), 1)
        oks = fails = 0
        verdict: bool | None = None
        while not self._stop.is_set():
            ok, msg = check(self.probe, self.ctx, f"{self.name}-{self.kind}")
            if self._stop.is_set():
                return
            oks, fails = (oks + 1, 0) if ok else (0, fails + 1)
            new = True if oks >= need_ok else False if fails >= need_fail else verdict
            if new is not None and new != verdict:
                verdict = new
                self.on_change(self.kind, new, msg)
                if self.kind == "startup" and new:
                    return
                if self.kind in ("startup", "liveness") and not new:
                    return
            elif not ok:
                self.on_change(self.kind + "-miss", False, msg)  # a failure without a new verdict: event only
            self._stop.wait(period)
