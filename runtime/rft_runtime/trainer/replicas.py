"""Which inference replicas the trainer publishes each policy version to.

On a cluster the inference role is a Deployment of ``inference.replicas`` pods behind a ClusterIP
Service, which spreads rollouts' requests over the ready replicas but delivers a publication to one
of them. The operator therefore also creates a headless Service, ``<job>-inference-pods``, that
selects the same pods but only while they are Ready, and names it in the runtime config
(``endpoints.inference_replicas``). :class:`InferenceReplicas` resolves that name in the cluster DNS
each time it is asked: one address per ready replica, each an endpoint ``http://<pod IP>:<port>``.
No Kubernetes API access is needed (the trainer's Role stays as narrow as it was).

Where nothing resolves (no replica is Ready, or no DNS), a publication first waits for the name to
list a replica (:meth:`InferenceReplicas.wait_listed`, polled every :data:`POLL_S`, at most
``wait_s``): a connection to the ClusterIP Service while it has no endpoint is not refused but hangs,
and its retransmitted SYNs keep the connection-tracking entry made before a replica turned Ready, so
it is never forwarded to it and waits out the whole connect timeout (an e2e run measured 10 s of it,
twice, with the new pod Ready after 5). Only then are the static ``endpoints.inference`` URLs used:
publishing through the Service waits, with the publisher's retries, for a replica to answer. A name
that never listed anything within ``wait_s`` (a cluster without DNS for it) is not waited for again
until it lists a replica. Asked without waiting (the re-sync check of :mod:`.inference_sync`, which
holds the lock a publication needs), a name that lists none gives no replica at all rather than the
Service. :meth:`InferenceReplicas.present` tells the publisher whether a replica it failed to reach
is still listed; one that is gone (its pod deleted or no longer Ready) is skipped instead of holding
the publication until its deadline.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import time
from typing import Callable, Sequence
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

Resolver = Callable[[str, int], list[str]]
"""``resolve(host, port) -> [address, ...]`` (IPv4 or IPv6 literals)."""

POLL_S = 0.25
"""How often :meth:`InferenceReplicas.wait_listed` asks the name again."""


def resolve_addresses(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (TCP), sorted and without repeats; [] when it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    return sorted({str(info[4][0]) for info in infos})


def address_url(scheme: str, address: str, port: int) -> str:
    """``scheme://address:port`` with an IPv6 literal bracketed."""
    host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    return f"{scheme}://{host}:{port}"


class InferenceReplicas:
    """The inference endpoints to publish to: ``discover`` resolved to one URL per ready replica,
    else the ``static`` URLs."""

    def __init__(self, static: Sequence[str], discover: str | None = None, *,
                 resolve: Resolver = resolve_addresses, wait_s: float = 120.0) -> None:
        self.static = [u.rstrip("/") for u in static]
        self.discover = discover.rstrip("/") if discover else None
        self.wait_s = wait_s
        self._resolve = resolve
        self._last: list[str] | None = None
        self._never_listed = False  # a wait_listed found nothing, and nothing was listed since

    def discovered(self) -> list[str]:
        """The URLs of the replicas ``discover`` resolves to now ([] without ``discover``)."""
        if self.discover is None:
            return []
        parts = urlsplit(self.discover)
        if not parts.hostname:
            return []
        port = parts.port or (443 if parts.scheme == "https" else 80)
        found = [address_url(parts.scheme, a, port) for a in self._resolve(parts.hostname, port)]
        if found:
            self._never_listed = False
        return found

    def wait_listed(self) -> list[str]:
        """The discovered replicas once there is one: ``discover`` asked every :data:`POLL_S` for at
        most ``wait_s`` ([] then, or at once without ``discover``, or where a wait found nothing and
        nothing was listed since)."""
        found = self.discovered()
        if found or self.discover is None or self._never_listed:
            return found
        deadline = time.monotonic() + self.wait_s
        log.info("no inference replica is Ready (%s lists none): waiting for one, at most %.0f s",
                 self.discover, self.wait_s)
        while not found and time.monotonic() < deadline:
            time.sleep(POLL_S)
            found = self.discovered()
        self._never_listed = not found
        return found

    def urls(self, wait: bool = False) -> list[str]:
        """Every replica to publish to now: the discovered ones, else the static URLs. ``wait``:
        first wait for a replica to be listed (:meth:`wait_listed`). Without ``wait``, a name that
        lists none gives [] (no replica is Ready, and the Service would only hang) unless a wait found
        that it lists nothing at all (then the static URLs)."""
        found = self.wait_listed() if wait else self.discovered()
        if found or self.discover is None or self._never_listed:
            urls = found or self.static
        else:
            urls = []
        if urls != self._last:
            log.info("inference replicas: %s%s", ", ".join(urls) or "none Ready",
                     "" if found or self.discover is None else f" ({self.discover} lists none)")
            self._last = urls
        return urls

    def present(self, url: str) -> bool:
        """Whether ``url`` is still one of the replicas (a static URL always is)."""
        url = url.rstrip("/")
        return url in self.static or url in self.discovered()
