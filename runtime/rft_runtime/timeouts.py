"""Time limits of the runtime's HTTP clients inside a job that retry a failed attempt: the trainer's
weight publication, the rollout workers' inference client and coordinator client.

A connection attempt gets at most :data:`CONNECT_S` seconds, whatever the request's own limit. A lost
SYN then costs one short retry instead of the kernel's two minutes of SYN retransmissions before
``connect`` gives up: an e2e run on the node that enforces NetworkPolicies measured exactly that, a
publication stalled 134 s on its first connection to an inference replica that had just come up.
"""

from __future__ import annotations

import httpx

CONNECT_S = 10.0
"""Seconds a TCP connection to a job's server may take (a handshake inside a cluster takes
milliseconds; the kernel's SYN retransmissions at 1, 3 and 7 s still fit)."""


def client_timeout(total_s: float | None) -> httpx.Timeout:
    """``total_s`` for every phase of a request (None: no limit), the connection at most :data:`CONNECT_S`."""
    return httpx.Timeout(total_s, connect=CONNECT_S if total_s is None else min(CONNECT_S, total_s))
