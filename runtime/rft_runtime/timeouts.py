"""Time limits of the runtime's HTTP clients inside a job that retry a failed attempt: the trainer's
weight publication, the rollout workers' inference client and coordinator client; and the one TLS
context (:func:`tls_context`) that clients opened again and again share.

A connection attempt gets at most :data:`CONNECT_S` seconds, whatever the request's own limit. A lost
SYN then costs one short retry instead of the kernel's two minutes of SYN retransmissions before
``connect`` gives up: an e2e run on the node that enforces NetworkPolicies measured exactly that, a
publication stalled 134 s on its first connection to an inference replica that had just come up.
"""

from __future__ import annotations

import functools
import ssl

import httpx

CONNECT_S = 10.0
"""Seconds a TCP connection to a job's server may take (a handshake inside a cluster takes
milliseconds; the kernel's SYN retransmissions at 1, 3 and 7 s still fit)."""


def client_timeout(total_s: float | None) -> httpx.Timeout:
    """``total_s`` for every phase of a request (None: no limit), the connection at most :data:`CONNECT_S`."""
    return httpx.Timeout(total_s, connect=CONNECT_S if total_s is None else min(CONNECT_S, total_s))


@functools.lru_cache(maxsize=None)
def tls_context() -> ssl.SSLContext:
    """The TLS context an ``httpx`` client builds by default (the CA bundle, ``$SSL_CERT_FILE`` /
    ``$SSL_CERT_DIR`` as of the first call), built once per process. Building it loads the whole CA
    bundle, about 20 ms of CPU: a client opened per call (the trainer's publisher, once per step and
    once per re-sync check) passes ``verify=tls_context()`` instead of paying that every time, even for
    ``http://`` URLs, for which ``httpx`` builds it all the same."""
    return httpx.create_ssl_context()
