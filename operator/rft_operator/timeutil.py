"""RFC 3339 timestamps as Kubernetes writes them (UTC, second precision, ``Z``)."""
from __future__ import annotations

import datetime as dt


def now() -> dt.datetime:
    """The current time in UTC, truncated to seconds (what status fields can hold)."""
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0)


def format_time(t: dt.datetime) -> str:
    """``2025-01-02T03:04:05Z``."""
    return t.astimezone(dt.timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(s: str) -> dt.datetime:
    """Parse an RFC 3339 time (``Z`` or an offset); naive times are taken as UTC."""
    t = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)
