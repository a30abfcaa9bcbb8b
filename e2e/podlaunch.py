"""How one container instance is launched by the process kubelet (TEST INFRASTRUCTURE).

:class:`ImageEntry` says how an "image" runs here; :func:`launch_spec` builds the JSON spec that
``e2e/podexec.py`` executes: the final environment (the image's PATH/HOME/HOSTNAME and ENV, overridden
by the Kubernetes-defined variables), the command line after ``$(VAR)`` expansion, the bind mounts,
the hosts file and the read-only-root flag.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import podenv
from .podvolumes import Mount

Obj = dict[str, Any]
PODEXEC = Path(__file__).with_name("podexec.py")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class ImageEntry:
    """How an image runs here: its ``bin`` directory goes first on PATH, ``env`` is its ENV, and
    ``paths`` stay visible in the container even under a volume mount (the venv)."""

    bin_dir: str
    env: tuple[tuple[str, str], ...] = ()
    paths: tuple[str, ...] = ()


def launcher() -> list[str]:
    """The podexec command prefix (``run SPEC`` or ``enter PID SPEC`` follow)."""
    return [sys.executable, "-I", "-S", str(PODEXEC)]


def launch_spec(pod: Obj, container: Obj, image: ImageEntry, *, k8s_env: Mapping[str, str], mounts: list[Mount],
                hosts_path: Path, cgroup: Path | None, error_path: Path, enforce_read_only_root: bool) -> Obj:
    """The podexec spec of ``container`` (see ``e2e/podexec.py`` for its fields)."""
    base = {"PATH": f"{image.bin_dir}:{SYSTEM_PATH}", "HOME": "/root",
            "HOSTNAME": (pod["spec"].get("hostname") or pod["metadata"]["name"])[:63], **dict(image.env)}
    sc = container.get("securityContext") or {}
    return {
        "argv": podenv.command_line(container, k8s_env),
        "env": {**base, **k8s_env},
        "cwd": container.get("workingDir") or "/",
        "hosts": str(hosts_path),
        "mounts": [{"source": m.source, "target": m.target, "readOnly": m.read_only} for m in mounts],
        "preserve": list(image.paths),
        "readOnlyRoot": bool(sc.get("readOnlyRootFilesystem")) and enforce_read_only_root,
        "cgroup": str(cgroup) if cgroup else None,
        "parentPid": os.getpid(),
        "errorFile": str(error_path),
    }
