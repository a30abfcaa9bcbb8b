"""The job's data-plane credential, once for every server and client of the runtime.

Every data-plane route of the coordinator, the reward server and the builtin inference server
requires ``Authorization: Bearer <job token>``; the token is compared in constant time
(:func:`hmac.compare_digest`) and anything else is answered 401 with a JSON error that never echoes
what was sent. Only ``/health`` and ``/metrics`` stay open (probes and scrapers carry no token;
neither route takes input nor reveals a task, an episode or a reward).

The token comes from ``$RFT_JOB_TOKEN`` (:func:`rft_api.runtime.job_token`): on a cluster the
operator fills it from Secret ``<job>-token``; ``rft run`` generates one per run. A server whose
environment has no token (:func:`server_token`):

- on a cluster (``$KUBERNETES_SERVICE_HOST`` is set in every pod) refuses to start: the operator
  always mounts the token, so its absence is a misbuilt pod, and an open data plane on a shared
  cluster is exactly what this module exists to prevent;
- off a cluster (a developer's machine, in-process tests) serves open and says so in its log.

Clients take the token from the same variable (:func:`client_headers`), so a bundle's code never
handles it.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Optional

from aiohttp import web

from rft_api.runtime import JOB_TOKEN_ENV, job_token

if TYPE_CHECKING:
    from aiohttp.typedefs import Middleware

__all__ = ["JOB_TOKEN_ENV", "OPEN_PATHS", "MissingToken", "client_headers", "middleware", "server_token"]

OPEN_PATHS = frozenset({"/health", "/metrics"})
"""Routes served without the token (exact paths)."""
CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"
UNAUTHORIZED = "missing or wrong job token: send 'Authorization: Bearer <token>' (the job's Secret <job>-token)"

log = logging.getLogger("rft.auth")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class MissingToken(RuntimeError):
    """A server would start on a cluster without the job's token."""


def server_token(role: str, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The token ``role``'s server requires, from the environment (see the module docstring for what
    happens without one). Raises :class:`MissingToken` on a cluster without a token."""
    env = os.environ if environ is None else environ
    token = job_token(dict(env))
    if token:
        return token
    if env.get(CLUSTER_ENV):
        raise MissingToken(f"{role}: ${JOB_TOKEN_ENV} is not set; on a cluster every data-plane server requires "
                           "the job's token (Secret <job>-token, key 'token') and refuses to serve without it")
    log.warning("%s: $%s is not set and this is not a cluster: the data-plane routes are open (local/test mode)",
                role, JOB_TOKEN_ENV)
    return None


def _unauthorized() -> web.Response:
    return web.json_response({"error": {"message": UNAUTHORIZED, "type": "Unauthorized", "code": 401}},
                             status=401, headers={"WWW-Authenticate": 'Bearer realm="rft"'})


def middleware(token: Optional[str]) -> Middleware:
    """aiohttp middleware requiring ``Authorization: Bearer <token>`` on every path but
    :data:`OPEN_PATHS` (unknown paths too: no route enumeration without the token). ``token=None``
    lets everything through (see :func:`server_token`)."""
    expected = f"Bearer {token}".encode() if token else b""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if token and request.path not in OPEN_PATHS:
            got = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(got, expected):
                return _unauthorized()
        return await handler(request)

    return check


def client_headers(token: Optional[str] = None) -> dict[str, str]:
    """The header a client sends: ``token``, else ``$RFT_JOB_TOKEN``; none without either."""
    token = token or job_token()
    return {"Authorization": f"Bearer {token}"} if token else {}
