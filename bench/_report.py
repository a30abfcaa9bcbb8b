"""What a benchmark records about the machine it ran on, and how it writes its JSON."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path


def started() -> str:
    """The local time now, as every benchmark's ``started`` records it (call it before the measurements)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def machine(**extra) -> dict:
    """The CPUs, the load average now (call it before the measurements), Python's version and ``extra``."""
    return {"cpus": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(), **extra}


def write(out: str | Path, report: dict, show: dict | None = None) -> Path:
    """Write ``report`` as JSON to ``out`` (its directory made), print ``show`` (else its ratios) and where it went."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["ratios"] if show is None else show, indent=2))
    print(f"wrote {out}")
    return out
