"""Which inference replicas the trainer publishes each policy version to.

On a cluster the inference role is a Deployment of ``inference.replicas`` pods behind a ClusterIP
Service, which spreads rollouts' requests over the ready replicas but delivers a publication to one
of them. The operator therefore also creates a headless Service, ``<job>-inference-pods``, that
selects the same pods but only while they are Ready, and names it in the runtime config
(``endpoints.inference_replicas``). :class:`InferenceReplicas` resolves that name in the cluster DNS
each time it is asked: one address per ready replica, each an endpoint ``http://<pod IP>:<port>``.
No Kubernetes API access is needed (the trainer's Role stays as narrow as it was).

Where nothing resolves (no replica is Ready, or no DNS), the static ``endpoints.inference`` URLs
are used: publishing through the Service then waits, with the publisher's retries, for a replica to
answer. :meth:`InferenceReplicas.present` tells the publisher whether a replica it failed to reach
is still listed; one that is gone (its pod deleted or no longer Ready) is skipped instead of holding
the publication until its deadline.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from typing import Callable, Sequence
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

Resolver = Callable[[str, int], list[str]]
"""``resolve(host, port) -> [address, ...]`` (IPv4 or IPv6 literals)."""


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
                 resolve: Resolver = resolve_addresses) -> None:
        self.static = [u.rstrip("/") for u in static]
        self.discover = discover.rstrip("/") if discover else None
        self._resolve = resolve
        self._last: list[str] | None = None

    def discovered(self) -> list[str]:
        """The URLs of the replicas ``discover`` resolves to now ([] without ``discover``)."""
        if self.discover is None:
            return []
        parts = urlsplit(self.discover)
        if not parts.hostname:
            return []
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return [address_url(parts.scheme, a, port) for a in self._resolve(parts.hostname, port)]

    def urls(self) -> list[str]:
        """Every replica to publish to now: the discovered ones, else the static URLs."""
        found = self.discovered()
        urls = found or self.static
        if urls != self._last:
            log.info("inference replicas: %s%s", ", ".join(urls),
                     "" if found or self.discover is None else f" ({self.discover} lists none)")
            self._last = urls
        return urls

    def present(self, url: str) -> bool:
        """Whether ``url`` is still one of the replicas (a static URL always is)."""
        url = url.rstrip("/")
        return url in self.static or url in self.discovered()
