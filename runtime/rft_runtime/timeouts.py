"""Time limits of the runtime's HTTP clients inside a job that retry a failed attempt: the trainer's
weight publication, the rollout workers' inference client and coordinator client; the one TLS
context (:func:`tls_context`) that clients opened again and again share; and the rollout worker's
aiohttp sessions (:func:`client_session`, opened when first used by :class:`LazySession`).

A connection attempt gets at most :data:`CONNECT_S` seconds, whatever the request's own limit. A lost
SYN then costs one short retry instead of the kernel's two minutes of SYN retransmissions before
``connect`` gives up: an e2e run on the node that enforces NetworkPolicies measured exactly that, a
publication stalled 134 s on its first connection to an inference replica that had just come up.
"""

from __future__ import annotations

import functools
import ssl
from typing import Iterable

import aiohttp
import httpx

CONNECT_S = 10.0
"""Seconds a TCP connection to a job's server may take (a handshake inside a cluster takes
milliseconds; the kernel's SYN retransmissions at 1, 3 and 7 s still fit)."""


def client_timeout(total_s: float | None) -> httpx.Timeout:
    """``total_s`` for every phase of a request (None: no limit), the connection at most :data:`CONNECT_S`."""
    return httpx.Timeout(total_s, connect=CONNECT_S if total_s is None else min(CONNECT_S, total_s))


def session_timeout(total_s: float | None) -> aiohttp.ClientTimeout:
    """:func:`client_timeout` for an aiohttp request."""
    return aiohttp.ClientTimeout(total=total_s, connect=CONNECT_S if total_s is None else min(CONNECT_S, total_s))


def client_session(urls: Iterable[str], headers: dict[str, str], *, total_s: float | None = None,
                   connections: int = 100) -> aiohttp.ClientSession:
    """An aiohttp session of a rollout worker's client (inference, coordinator, reward role): ``headers``
    on every request, ``total_s`` per request by default, at most ``connections`` open, and
    :func:`tls_context` where one of ``urls`` is ``https``. Open it in the event loop that uses it.
    Proxy variables (``$HTTP_PROXY`` ...) are not read: the job's own servers are reached directly.

    The rollout worker's clients speak aiohttp rather than httpx: its requests share the cores with
    the trainer's computation, and an aiohttp exchange costs about a third of httpx's CPU (an episode
    post: 0.38 ms against 1.05 ms on the reference VM)."""
    tls = tls_context() if any(u.startswith("https") for u in urls) else False
    return aiohttp.ClientSession(headers=headers, timeout=session_timeout(total_s),
                                 connector=aiohttp.TCPConnector(limit=connections, ssl=tls))


class LazySession:
    """The :func:`client_session` of one client, opened at its first request and closed by :meth:`aclose`.

    A session belongs to the event loop it was opened in, and a client is built before any loop runs
    (a rollout worker's clients are configured, then used inside ``asyncio.run``), so it is opened by
    :meth:`get`, inside the loop, not by the client's constructor."""

    def __init__(self, urls: Iterable[str], headers: dict[str, str], *, total_s: float | None = None,
                 connections: int = 100) -> None:
        self._args = (list(urls), headers, total_s, connections)
        self._session: aiohttp.ClientSession | None = None

    def get(self) -> aiohttp.ClientSession:
        """The session (opened now in the running loop when it is not open)."""
        if self._session is None:
            urls, headers, total_s, connections = self._args
            self._session = client_session(urls, headers, total_s=total_s, connections=connections)
        return self._session

    async def aclose(self) -> None:
        """Close the session's connections, if it was opened (a later :meth:`get` opens a new one)."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


@functools.lru_cache(maxsize=None)
def tls_context() -> ssl.SSLContext:
    """The TLS context an ``httpx`` client builds by default (the CA bundle, ``$SSL_CERT_FILE`` /
    ``$SSL_CERT_DIR`` as of the first call), built once per process. Building it loads the whole CA
    bundle, about 20 ms of CPU: a client opened per call (the trainer's publisher, once per step and
    once per re-sync check) passes ``verify=tls_context()`` instead of paying that every time, even for
    ``http://`` URLs, for which ``httpx`` builds it all the same."""
    return httpx.create_ssl_context()
