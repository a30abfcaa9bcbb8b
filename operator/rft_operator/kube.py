"""A small, synchronous Kubernetes API layer over the official client's ``ApiClient``.

Objects are plain dicts (the JSON the API server speaks). Writes of children use server-side apply
(``application/apply-patch+yaml``, one field manager, ``force=true``); status is replaced through the
status subresource with a JSON patch. Calls block: the async handlers run them in ``asyncio.to_thread``.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Optional
from urllib.parse import quote

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from .names import FIELD_MANAGER

Obj = dict[str, Any]
REQUEST_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Kind:
    """Where a kind lives in the REST API."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    def base(self) -> str:
        return f"/api/{self.api_version}" if "/" not in self.api_version else f"/apis/{self.api_version}"


KINDS: dict[str, Kind] = {k.kind: k for k in (
    Kind("v1", "ConfigMap", "configmaps"),
    Kind("v1", "Service", "services"),
    Kind("v1", "ServiceAccount", "serviceaccounts"),
    Kind("v1", "PersistentVolumeClaim", "persistentvolumeclaims"),
    Kind("v1", "Pod", "pods"),
    Kind("v1", "Event", "events"),
    Kind("apps/v1", "Deployment", "deployments"),
    Kind("apps/v1", "ReplicaSet", "replicasets"),
    Kind("batch/v1", "Job", "jobs"),
    Kind("rbac.authorization.k8s.io/v1", "Role", "roles"),
    Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    Kind("v1", "Secret", "secrets"),
    Kind("rft.dev/v1alpha1", "RFTJob", "rftjobs"),
    Kind("coordination.k8s.io/v1", "Lease", "leases"),
    Kind("apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions", namespaced=False),
    # Kueue (used only with the Kueue integration on: ``OperatorConfig.kueue``)
    Kind("kueue.x-k8s.io/v1beta2", "Workload", "workloads"),
    Kind("kueue.x-k8s.io/v1beta2", "ResourceFlavor", "resourceflavors", namespaced=False),
    Kind("kueue.x-k8s.io/v1beta2", "WorkloadPriorityClass", "workloadpriorityclasses", namespaced=False),
)}

# Children kinds, in the order they are observed.
CHILD_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ConfigMap", "PersistentVolumeClaim", "Service",
               "NetworkPolicy", "Deployment", "Job")
# The token Secret is a child too, but neither listed nor watched (the operator may only get and
# create Secrets): the reconcile checks it by name (``reconcile.ensure_token``).
# Children kinds of the Kueue integration (watched and listed only when it is on).
KUEUE_CHILD_KINDS = ("Workload",)


def child_kinds(kueue: bool) -> tuple[str, ...]:
    """The kinds of a job's children the operator observes."""
    return (*CHILD_KINDS, *KUEUE_CHILD_KINDS) if kueue else CHILD_KINDS


class KubeError(Exception):
    """An API call answered with an error status."""

    def __init__(self, status: int, reason: str, message: str = ""):
        self.status, self.reason, self.message = status, reason, message
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def transient(self) -> bool:
        """Worth retrying: throttling, timeouts, server errors, connection failures (status 0)."""
        return self.status in (0, 408, 425, 429) or self.status >= 500


def path_of(kind: str, namespace: Optional[str], name: Optional[str] = None, sub: Optional[str] = None) -> str:
    k = KINDS[kind]
    p = k.base()
    if k.namespaced:
        p += f"/namespaces/{quote(namespace or '', safe='')}"
    p += f"/{k.plural}"
    if name:
        p += f"/{quote(name, safe='')}"
    if sub:
        p += f"/{sub}"
    return p


def load_api_client(kubeconfig: Optional[str] = None) -> k8s_client.ApiClient:
    """An ApiClient from ``kubeconfig``, else ``$KUBECONFIG``/``~/.kube/config``, else in-cluster."""
    cfg = k8s_client.Configuration()
    if kubeconfig:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg, persist_config=False)
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        k8s_config.load_incluster_config(client_configuration=cfg)
    else:
        k8s_config.load_kube_config(client_configuration=cfg, persist_config=False)
    return k8s_client.ApiClient(cfg)


class Kube:
    """Blocking API calls on plain dicts."""

    def __init__(self, api_client: k8s_client.ApiClient, field_manager: str = FIELD_MANAGER):
        self.api_client = api_client
        self.field_manager = field_manager

    @classmethod
    def from_kubeconfig(cls, kubeconfig: Optional[str] = None) -> "Kube":
        return cls(load_api_client(kubeconfig))

    def close(self) -> None:
        self.api_client.close()

    # ------------------------------------------------------------------------------ raw request
    def request(self, method: str, path: str, *, query: Optional[list[tuple[str, str]]] = None,
                body: Any = None, content_type: Optional[str] = None) -> Optional[Obj]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        method_, url, headers_, body_, post = self.api_client.param_serialize(
            method=method, resource_path=path, query_params=query or None, header_params=headers, body=body,
            auth_settings=["BearerToken"])
        try:
            resp = self.api_client.call_api(method_, url, header_params=headers_, body=body_, post_params=post,
                                            _request_timeout=REQUEST_TIMEOUT_S)
        except k8s_client.ApiException as e:  # connection-level failures
            raise KubeError(e.status or 0, str(e.reason or "error")) from None
        except Exception as e:  # urllib3 errors: refused, reset, timed out
            raise KubeError(0, type(e).__name__, str(e)) from None
        data = resp.read()
        if resp.status >= 400:
            message = ""
            try:
                payload = json.loads(data or b"{}")
                message = payload.get("message", "")
                reason = payload.get("reason", "") or resp.reason
            except ValueError:
                reason = resp.reason
            raise KubeError(resp.status, reason or "", message)
        return json.loads(data) if data else None

    # ------------------------------------------------------------------------------ verbs
    def get(self, kind: str, namespace: Optional[str], name: str) -> Optional[Obj]:
        """The object, or None when it does not exist."""
        try:
            return self._typed(kind, self.request("GET", path_of(kind, namespace, name)))
        except KubeError as e:
            if e.not_found:
                return None
            raise

    def list(self, kind: str, namespace: Optional[str], label_selector: Optional[str] = None) -> list[Obj]:
        """Every object of ``kind`` in ``namespace`` (all namespaces when None) matching the selector."""
        query = [("labelSelector", label_selector)] if label_selector else []
        k = KINDS[kind]
        path = path_of(kind, namespace) if namespace or not k.namespaced else f"{k.base()}/{k.plural}"
        out = self.request("GET", path, query=query) or {}
        return [self._typed(kind, o) for o in out.get("items", [])]

    def apply(self, obj: Obj, force: bool = True) -> Obj:
        """Server-side apply ``obj`` with this client's field manager."""
        meta = obj["metadata"]
        query = [("fieldManager", self.field_manager), ("force", "true" if force else "false")]
        out = self.request("PATCH", path_of(obj["kind"], meta.get("namespace"), meta["name"]), query=query,
                           body=obj, content_type="application/apply-patch+yaml")
        return self._typed(obj["kind"], out)

    def replace(self, obj: Obj) -> Obj:
        """PUT ``obj`` (with its ``metadata.resourceVersion``: a concurrent change answers 409)."""
        meta = obj["metadata"]
        return self._typed(obj["kind"], self.request("PUT", path_of(obj["kind"], meta.get("namespace"), meta["name"]),
                                                     body=obj))

    def create(self, obj: Obj) -> Obj:
        meta = obj["metadata"]
        return self._typed(obj["kind"], self.request("POST", path_of(obj["kind"], meta.get("namespace")), body=obj))

    def delete(self, kind: str, namespace: Optional[str], name: str, propagation: str = "Background",
               uid: Optional[str] = None) -> bool:
        """Delete (only the object with ``uid`` when given); False when it was already gone."""
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", path_of(kind, namespace, name), body=body)
            return True
        except KubeError as e:
            if e.not_found or e.conflict:
                return False
            raise

    def replace_status(self, kind: str, namespace: Optional[str], name: str, status: Obj) -> Obj:
        """Replace the whole ``status`` through the status subresource."""
        patch = [{"op": "add", "path": "/status", "value": status}]
        return self._typed(kind, self.request("PATCH", path_of(kind, namespace, name, "status"), body=patch,
                                              content_type="application/json-patch+json"))

    def patch(self, kind: str, namespace: Optional[str], name: str, patch: Obj, subresource: Optional[str] = None) -> Obj:
        """A JSON merge patch."""
        return self._typed(kind, self.request("PATCH", path_of(kind, namespace, name, subresource), body=patch,
                                              content_type="application/merge-patch+json"))

    @staticmethod
    def _typed(kind: str, obj: Optional[Obj]) -> Obj:
        """List items come without apiVersion/kind; put them back."""
        obj = obj or {}
        k = KINDS[kind]
        obj.setdefault("apiVersion", k.api_version)
        obj.setdefault("kind", k.kind)
        return obj
