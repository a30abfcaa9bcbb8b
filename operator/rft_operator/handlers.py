"""Thin kopf handlers: every trigger becomes ``Controller.reconcile(namespace, name)`` of the job.

- create / update / resume of ``rftjobs.rft.dev``: reconcile; an API failure raises
  ``kopf.TemporaryError`` so kopf retries with backoff.
- events of owned Deployments, Jobs and the progress ConfigMap (label-filtered server-side): reconcile
  the owner; failures are left to the periodic resync.
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
from .kube import KubeError

log = logging.getLogger(__name__)
RETRY_DELAY_S = 5.0

# Child resources whose events re-trigger the owner's reconcile, with a server-side label selector.
CHILD_WATCHES: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("apps/v1", "deployments", {names.LABEL_MANAGED_BY: names.MANAGED_BY}),
    ("batch/v1", "jobs", {names.LABEL_MANAGED_BY: names.MANAGED_BY}),
    ("v1", "configmaps", {names.LABEL_MANAGED_BY: names.MANAGED_BY, names.LABEL_ROLE: "progress"}),
)


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


def build_registry(controller: Controller) -> kopf.OperatorRegistry:
    """A fresh kopf registry with the operator's handlers bound to ``controller``."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        # Re-read on every login: a refreshed in-cluster token is picked up.
        return connection_info(controller.api.api_client.configuration)

    async def on_job(namespace: str, name: str, **_: Any) -> None:
        try:
            await controller.reconcile(namespace, name)
        except KubeError as e:
            raise kopf.TemporaryError(f"reconcile of {namespace}/{name} failed: {e}", delay=RETRY_DELAY_S) from None

    resource = (f"{GROUP}/{VERSION}", PLURAL)
    kopf.on.create(*resource, id="reconcile-on-create", registry=registry)(on_job)
    kopf.on.update(*resource, id="reconcile-on-update", registry=registry)(on_job)
    kopf.on.resume(*resource, id="reconcile-on-resume", registry=registry)(on_job)

    async def on_child(body: Any, namespace: str, **_: Any) -> None:
        owner = owner_name(body)
        if owner is None or not namespace:
            return
        try:
            await controller.reconcile(namespace, owner)
        except Exception as e:  # the periodic resync covers it
            log.info("reconcile of %s/%s after a child event failed: %s", namespace, owner, e)

    for group_version, plural, labels in CHILD_WATCHES:
        kopf.on.event(group_version, plural, labels=labels, id=f"owner-of-{plural}", registry=registry)(on_child)
    return registry


def child_label_selectors() -> dict[tuple[str, str], str]:
    """Server-side label selectors for the child watches (``settings.watching.label_selectors``)."""
    return {(gv, plural): ",".join(f"{k}={v}" for k, v in labels.items()) for gv, plural, labels in CHILD_WATCHES}
