"""Raw JSON access to the API server for the PV provisioner (TEST INFRASTRUCTURE).

The harness works on plain dicts exactly as the API server sends them (camelCase, no model
conversion): :class:`KubeApi` wraps a ``kubernetes.client.ApiClient``'s authenticated transport with
``request`` (one call, a deadline on every request), ``get`` (``None`` on 404), ``list`` and ``watch``
(a stream of events that ends at the server's ``timeoutSeconds``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlencode

Obj = dict[str, Any]

# kind -> (API prefix, plural, namespaced)
RESOURCES: dict[str, tuple[str, str, bool]] = {
    "Pod": ("/api/v1", "pods", True),
    "Service": ("/api/v1", "services", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Secret": ("/api/v1", "secrets", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims", True),
    "PersistentVolume": ("/api/v1", "persistentvolumes", False),
    "Node": ("/api/v1", "nodes", False),
    "Event": ("/api/v1", "events", True),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases", True),
}


class ApiError(Exception):
    """A non-2xx answer; ``status`` is the HTTP code and ``body`` the server's message."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(f"{status} {reason}: {body[:500]}")
        self.status, self.reason, self.body = status, reason, body


def path_for(kind: str, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
    """The REST path of a collection (``name`` None, ``namespace`` None = all namespaces) or object."""
    prefix, plural, namespaced = RESOURCES[kind]
    p = prefix
    if namespaced and namespace:
        p += f"/namespaces/{quote(namespace)}"
    p += f"/{plural}"
    if name:
        p += f"/{quote(name)}"
    if subresource:
        p += f"/{subresource}"
    return p


class KubeApi:
    """Thread-safe raw client with its own urllib3 pool, built from ``api_client.configuration``
    (server, CA, client certificate, bearer token), independent of the client's generated code."""

    def __init__(self, api_client: Any, timeout: float = 30.0) -> None:
        import urllib3

        cfg = api_client.configuration
        self._cfg = cfg
        self.server = cfg.host.rstrip("/")
        self.timeout = timeout
        kw: dict[str, Any] = {"maxsize": 16, "block": False}
        if self.server.startswith("https"):
            kw["cert_reqs"] = "CERT_REQUIRED" if cfg.verify_ssl else "CERT_NONE"
            if cfg.ssl_ca_cert:
                kw["ca_certs"] = cfg.ssl_ca_cert
            if cfg.cert_file:
                kw["cert_file"], kw["key_file"] = cfg.cert_file, cfg.key_file
            if getattr(cfg, "assert_hostname", None) is not None:
                kw["assert_hostname"] = cfg.assert_hostname
        self._pool = urllib3.PoolManager(num_pools=4, **kw)

    def close(self) -> None:
        """Release the connection pool (watch streams still open fail on their next read)."""
        self._pool.clear()

    def _headers(self, content_type: str | None) -> dict[str, str]:
        hook = getattr(self._cfg, "refresh_api_key_hook", None)
        if hook is not None:
            hook(self._cfg)
        headers = {"Accept": "application/json"}
        auth = self._cfg.auth_settings().get("BearerToken")
        if auth and auth.get("value"):
            headers["Authorization"] = auth["value"]
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
                content_type: str = "application/json", timeout: float | tuple[float, float] | None = None,
                stream: bool = False) -> Any:
        """One call; returns the decoded JSON (or the open urllib3 response with ``stream``).

        Raises :class:`ApiError` on a non-2xx answer, ``urllib3`` errors on transport failures."""
        import urllib3

        url = self.server + path
        if query:
            url += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        t = timeout if timeout is not None else self.timeout
        tmo = urllib3.Timeout(connect=t[0], read=t[1]) if isinstance(t, tuple) else urllib3.Timeout(total=t)
        data = json.dumps(body).encode() if body is not None else None
        resp = self._pool.request(method, url, body=data, headers=self._headers(content_type if data else None),
                                  timeout=tmo, preload_content=not stream, retries=False)
        if not 200 <= resp.status <= 299:
            text = (resp.data if not stream else resp.read()).decode(errors="replace")
            if stream:
                resp.release_conn()
            raise ApiError(resp.status, resp.reason or "", text)
        if stream:
            return resp
        return json.loads(resp.data) if resp.data else None

    def get(self, kind: str, namespace: str | None, name: str) -> Obj | None:
        """The object, or ``None`` when it does not exist."""
        try:
            return self.request("GET", path_for(kind, namespace, name))
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def list(self, kind: str, namespace: str | None = None, **query: Any) -> Obj:
        """The list object (``items``, ``metadata.resourceVersion``)."""
        return self.request("GET", path_for(kind, namespace), query=query)

    def watch(self, kind: str, resource_version: str, timeout_s: int = 10, namespace: str | None = None,
              **query: Any) -> Iterator[Obj]:
        """Events (``{"type", "object"}``) after ``resource_version`` until the server ends the watch
        (``timeout_s``); an ``ERROR`` event is yielded as is (410 = relist)."""
        q = {"watch": "true", "resourceVersion": resource_version, "timeoutSeconds": timeout_s,
             "allowWatchBookmarks": "true", **query}
        resp = self.request("GET", path_for(kind, namespace), query=q, timeout=(10.0, timeout_s + 15.0), stream=True)
        try:
            buf = b""
            for chunk in resp.stream(16384, decode_content=False):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
            if buf.strip():
                yield json.loads(buf)
        finally:
            resp.release_conn()

    def create(self, kind: str, namespace: str | None, obj: Obj) -> Obj:
        return self.request("POST", path_for(kind, namespace), body=obj)

    def patch(self, kind: str, namespace: str | None, name: str, patch: Any, subresource: str | None = None,
              content_type: str = "application/merge-patch+json") -> Obj:
        return self.request("PATCH", path_for(kind, namespace, name, subresource), body=patch,
                            content_type=content_type)

    def replace(self, kind: str, namespace: str | None, name: str, obj: Obj, subresource: str | None = None) -> Obj:
        return self.request("PUT", path_for(kind, namespace, name, subresource), body=obj)

    def delete(self, kind: str, namespace: str | None, name: str, body: Obj | None = None) -> Obj | None:
        """Delete; ``None`` when it was already gone."""
        try:
            return self.request("DELETE", path_for(kind, namespace, name), body=body)
        except ApiError as e:
            if e.status == 404:
                return None
            raise
