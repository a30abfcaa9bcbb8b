"""Thin kopf handlers: every watch event goes into the cache and triggers ``Controller.reconcile`` of
the job it concerns.

- events of ``rftjobs.rft.dev`` (kopf's ``on.event``: no bookkeeping written to the RFTJob, no
  finalizer; a failed reconcile is retried by the controller with backoff);
- events of the children (Deployments, Jobs, ConfigMaps, Services, ServiceAccounts, Roles,
  RoleBindings, PersistentVolumeClaims, NetworkPolicies; not the token Secret: the operator may not
  list or watch Secrets) and of the workloads' pods, all label-filtered server-side
  (``app.kubernetes.io/managed-by=rft-operator``): the cache is updated and the owner reconciled;
- login: the operator's own kubeconfig / in-cluster credentials.

The periodic resync (the operator's timer) runs beside kopf (``app.run``), not as ``@kopf.timer``:
kopf timers put a finalizer on every RFTJob, which would block deleting jobs while the operator is
down; garbage collection needs no finalizer.
"""
from __future__ import annotations

import logging
from typing import Any, Optional

import kopf
from kubernetes import client as k8s_client

from rft_api.constants import GROUP, KIND, PLURAL, VERSION

from . import names
from .controller import Controller

log = logging.getLogger(__name__)

MANAGED = {names.LABEL_MANAGED_BY: names.MANAGED_BY}
# Watched resources besides RFTJobs (children and pods), with a server-side label selector.
CHILD_WATCHES: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("apps/v1", "deployments", MANAGED),
    ("batch/v1", "jobs", MANAGED),
    ("v1", "configmaps", MANAGED),
    ("v1", "services", MANAGED),
    ("v1", "serviceaccounts", MANAGED),
    ("v1", "persistentvolumeclaims", MANAGED),
    ("rbac.authorization.k8s.io/v1", "roles", MANAGED),
    ("rbac.authorization.k8s.io/v1", "rolebindings", MANAGED),
    ("networking.k8s.io/v1", "networkpolicies", MANAGED),
    ("v1", "pods", MANAGED),
)
# Watched with the Kueue integration on: the jobs' Workloads (their admission).
KUEUE_WATCHES: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("kueue.x-k8s.io/v1beta2", "workloads", MANAGED),
)


def child_watches(kueue: bool) -> tuple[tuple[str, str, dict[str, str]], ...]:
    """The watched kinds besides RFTJobs."""
    return (*CHILD_WATCHES, *KUEUE_WATCHES) if kueue else CHILD_WATCHES


def owner_name(body: Any) -> Optional[str]:
    """The name of the RFTJob controlling a child, if any."""
    for ref in (body.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(f"{GROUP}/") and ref.get("controller"):
            return ref.get("name")
    return None


def connection_info(cfg: k8s_client.Configuration) -> kopf.ConnectionInfo:
    """kopf credentials from the official client's configuration (the same identity for both)."""
    header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    return kopf.ConnectionInfo(
        server=cfg.host, ca_path=cfg.ssl_ca_cert, insecure=not cfg.verify_ssl,
        username=cfg.username or None, password=cfg.password or None, scheme=scheme, token=token,
        certificate_path=cfg.cert_file, private_key_path=cfg.key_file)


KIND_OF_PLURAL = {"deployments": "Deployment", "jobs": "Job", "configmaps": "ConfigMap", "services": "Service",
                  "serviceaccounts": "ServiceAccount", "persistentvolumeclaims": "PersistentVolumeClaim",
                  "roles": "Role", "rolebindings": "RoleBinding", "networkpolicies": "NetworkPolicy", "pods": "Pod",
                  "workloads": "Workload"}


def _plain(body: Any, kind: str, api_version: str) -> dict[str, Any]:
    """A kopf body as the plain dict the reconcile reads (with kind and apiVersion)."""
    obj = dict(body)
    obj.setdefault("kind", kind)
    obj.setdefault("apiVersion", api_version)
    return obj


async def _reconcile(controller: Controller, namespace: str, name: str) -> None:
    try:
        await controller.reconcile(namespace, name)
    except Exception as e:  # retried by the controller with backoff, and by the resync
        log.info("reconcile of %s/%s failed: %s", namespace, name, e)


def build_registry(controller: Controller) -> kopf.OperatorRegistry:
    """A fresh kopf registry with the operator's handlers bound to ``controller``."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        # Re-read on every login: a refreshed in-cluster token is picked up.
        return connection_info(controller.api.api_client.configuration)

    async def on_job(body: Any, type: Optional[str], namespace: str, name: str, **_: Any) -> None:
        obj = _plain(body, KIND, f"{GROUP}/{VERSION}")
        if type == "DELETED":
            controller.store.forget((namespace, name))
            return
        _key, changed = controller.store.put_job(obj)
        if changed:  # not the echo of our own status write
            await _reconcile(controller, namespace, name)

    # kopf types handlers with every keyword it passes; ours take the few they use plus **_
    kopf.on.event(f"{GROUP}/{VERSION}", PLURAL, id="rftjob-events", registry=registry)(on_job)  # type: ignore[arg-type]

    for group_version, plural, labels in child_watches(controller.kueue):
        kind = KIND_OF_PLURAL[plural]

        async def on_child(body: Any, type: Optional[str], _kind: str = kind, _gv: str = group_version,
                           **_: Any) -> None:
            obj = _plain(body, _kind, _gv)
            if type == "DELETED":
                key, changed = controller.store.drop(obj), True
            else:  # an echo of our own apply (already cached from its answer) changes nothing
                key, changed = controller.store.put(obj)
            if changed and key is not None and key in controller.store.jobs:
                await _reconcile(controller, *key)

        kopf.on.event(group_version, plural, labels=labels, id=f"{plural}-events", registry=registry)(on_child)
    return registry


def child_label_selectors(kueue: bool = False) -> dict[tuple[str, str], str]:
    """Server-side label selectors for the child watches (``settings.watching.label_selectors``)."""
    return {(gv, plural): ",".join(f"{k}={v}" for k, v in labels.items())
            for gv, plural, labels in child_watches(kueue)}
