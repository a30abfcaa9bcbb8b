"""A tiny local-directory PersistentVolume provisioner for the local cluster (TEST INFRASTRUCTURE).

The scheduler does not place a pod whose claim is unbound, and no storage driver exists here. For
every Pending PersistentVolumeClaim (any namespace) without ``volumeName``, ``dataSource`` or
``selector``, :class:`HostPathProvisioner` creates a ``hostPath`` PersistentVolume
``pvc-<claim uid>`` under ``<workdir>/pv/`` with the claim's requested capacity, access modes,
volume mode and storage class (``""`` when it has none) and a ``claimRef`` to the claim; the
controller-manager's PV binder then binds the two. Reclaim policy is ``Retain`` (no hostPath deleter
runs here): when the claim is gone, the provisioner deletes the PV and its directory itself.
"""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path
from typing import Any

from .informer import Informer
from .kubeapi import ApiError, KubeApi

Obj = dict[str, Any]
log = logging.getLogger("e2e.provisioner")
PROVISIONED_BY = "rft.dev/provisioned-by"


def pv_for_claim(pvc: Obj, root: Path, owner: str) -> Obj:
    """The PersistentVolume pre-bound to ``pvc`` (pure)."""
    meta, spec = pvc["metadata"], pvc.get("spec") or {}
    name = f"pvc-{meta['uid']}"
    storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
    return {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {PROVISIONED_BY: owner},
                     "annotations": {"pv.kubernetes.io/provisioned-by": "rft.dev/local-dir"}},
        "spec": {
            "capacity": {"storage": storage},
            "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
            "volumeMode": spec.get("volumeMode") or "Filesystem",
            "storageClassName": spec.get("storageClassName") or "",
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": str(root / name), "type": "DirectoryOrCreate"},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": meta["namespace"],
                         "name": meta["name"], "uid": meta["uid"]},
        },
    }


def wants_volume(pvc: Obj) -> bool:
    """A claim this provisioner serves: Pending, unbound, not being deleted, no source or selector."""
    meta, spec = pvc["metadata"], pvc.get("spec") or {}
    return ((pvc.get("status") or {}).get("phase", "Pending") == "Pending" and not spec.get("volumeName")
            and not meta.get("deletionTimestamp") and not spec.get("dataSource") and not spec.get("dataSourceRef")
            and not spec.get("selector"))


class HostPathProvisioner:
    """Watches claims; creates and deletes the hostPath PVs described in the module docstring."""

    def __init__(self, api: KubeApi, root: Path, owner: str) -> None:
        self.api, self.root, self.owner = api, Path(root), owner
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._informer = Informer(api, "PersistentVolumeClaim", self._on_change)

    def start(self, timeout: float = 30.0) -> HostPathProvisioner:
        self._informer.start()
        self._informer.wait_synced(timeout)
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Stop watching (the current watch request ends on its own, at most seconds later)."""
        self._informer.stop(timeout)

    def _on_change(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        with self._lock:
            if new is not None and wants_volume(new):
                self._provision(new)
            elif new is None and old is not None:
                self._release(old)

    def _provision(self, pvc: Obj) -> None:
        pv = pv_for_claim(pvc, self.root, self.owner)
        path = Path(pv["spec"]["hostPath"]["path"])
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o777)
        try:
            self.api.create("PersistentVolume", None, pv)
        except ApiError as e:
            if e.status != 409:
                log.warning("provisioning %s for %s/%s failed: %s", pv["metadata"]["name"],
                            pvc["metadata"]["namespace"], pvc["metadata"]["name"], e)

    def _release(self, pvc: Obj) -> None:
        name = f"pvc-{pvc['metadata']['uid']}"
        pv = self.api.get("PersistentVolume", None, name)
        if pv is None or (pv["metadata"].get("labels") or {}).get(PROVISIONED_BY) != self.owner:
            return
        try:
            self.api.delete("PersistentVolume", None, name)
        except ApiError as e:
            log.warning("deleting %s failed: %s", name, e)
            return
        shutil.rmtree(self.root / name, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m e2e.provisioner --kubeconfig K --root DIR --owner NAME``: serve claims until killed."""
    import argparse
    import signal
    import sys

    from kubernetes import config

    ap = argparse.ArgumentParser(prog="python -m e2e.provisioner", description=__doc__.split("\n")[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--root", required=True, type=Path)
    ap.add_argument("--owner", required=True)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    api = KubeApi(config.new_client_from_config(config_file=a.kubeconfig))
    prov = HostPathProvisioner(api, a.root, a.owner).start(timeout=60)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    log.info("provisioning claims under %s", a.root)
    stop.wait()
    prov.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
