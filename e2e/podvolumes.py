"""A pod's volumes as local directories (process kubelet, TEST INFRASTRUCTURE).

Supported: ``emptyDir`` (a directory, also for ``medium: Memory``), ``configMap``, ``secret``
(``items``, ``defaultMode``/``mode``, ``optional``), ``downwardAPI``, ``projected`` (``secret``,
``configMap``, ``downwardAPI``, ``serviceAccountToken`` through the TokenRequest API bound to the pod
and refreshed at 80 % of its lifetime), ``persistentVolumeClaim`` (the bound PV's ``hostPath`` or
``local`` path), generic ``ephemeral`` volumes (the claim ``<pod>-<volume>``) and ``hostPath``.
ConfigMap, Secret, downward-API and projected volumes are refreshed by :meth:`PodVolumes.refresh`
(atomic per file: write + rename) and are mounted read-only, as a kubelet does; ``subPath`` mounts of
them are not refreshed (as in Kubernetes). Ownership (``fsGroup``) is not applied.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import podenv
from .kubeapi import ApiError, KubeApi, path_for

Obj = dict[str, Any]
DEFAULT_MODE = 0o644
READ_ONLY_KINDS = ("configMap", "secret", "downwardAPI", "projected")


class VolumeError(Exception):
    """A volume cannot be set up yet (missing object, unbound claim, unsupported type): the message
    says which volume and why (reported as a ``FailedMount`` event, the pod stays Pending)."""


@dataclass(frozen=True)
class Mount:
    """One bind mount of the container: host ``source`` at ``target``."""

    source: str
    target: str
    read_only: bool = False


def _rel(path: str, what: str) -> str:
    norm = posixpath.normpath(path)
    if not path or path.startswith("/") or norm == ".." or norm.startswith("../"):
        raise VolumeError(f"{what} {path!r} must be a relative path inside the volume")
    return norm


class PodVolumes:
    """The volumes of one pod under ``root`` (``<root>/<volume name>``)."""

    def __init__(self, pod: Obj, root: Path, api: KubeApi, *, pod_ip: str | None, host_ip: str,
                 allocatable: dict[str, str]) -> None:
        self.pod, self.root, self.api = pod, Path(root), api
        self.pod_ip, self.host_ip, self.allocatable = pod_ip, host_ip, allocatable
        self.namespace = pod["metadata"]["namespace"]
        self._paths: dict[str, str] = {}  # volume name -> host path
        self._written: dict[str, set[str]] = {}  # generated volumes: files written
        self._tokens: dict[tuple[str, str], float] = {}  # (volume, path) -> refresh deadline (monotonic)

    # ------------------------------------------------------------------------------------------ setup

    def prepare(self) -> None:
        """Create every volume; raises :class:`VolumeError` (nothing is half-mounted: retry later)."""
        self.root.mkdir(parents=True, exist_ok=True)
        for vol in self.pod["spec"].get("volumes") or []:
            if vol["name"] not in self._paths:
                self._paths[vol["name"]] = self._setup(vol)

    def refresh(self) -> None:
        """Re-render ConfigMap, Secret, downward-API and projected volumes (tokens near expiry too)."""
        for vol in self.pod["spec"].get("volumes") or []:
            if vol["name"] in self._paths and any(k in vol for k in READ_ONLY_KINDS):
                self._setup(vol, refresh=True)

    def cleanup(self) -> None:
        """Remove the pod's own volume directories (PV and hostPath data stay)."""
        shutil.rmtree(self.root, ignore_errors=True)

    def _setup(self, vol: Obj, refresh: bool = False) -> str:
        name = vol["name"]
        d = self.root / name
        if "emptyDir" in vol:
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o777)
            return str(d)
        if "hostPath" in vol:
            return self._host_path(vol["hostPath"], name)
        if "persistentVolumeClaim" in vol:
            return self._claim_path(vol["persistentVolumeClaim"]["claimName"], name)
        if "ephemeral" in vol:
            return self._claim_path(f"{self.pod['metadata']['name']}-{name}", name)
        files: dict[str, tuple[bytes, int]] | None
        if "configMap" in vol:
            files = self._object_files("ConfigMap", vol["configMap"], name)
        elif "secret" in vol:
            src = dict(vol["secret"])
            src["name"] = src.pop("secretName", "")
            files = self._object_files("Secret", src, name)
        elif "downwardAPI" in vol:
            files = self._downward_files(vol["downwardAPI"], vol["downwardAPI"].get("defaultMode", DEFAULT_MODE), name)
        elif "projected" in vol:
            files = self._projected_files(vol["projected"], name, refresh)
        else:
            kinds = sorted(k for k in vol if k != "name")
            raise VolumeError(f"volume {name!r}: type {kinds} is not supported by the process kubelet")
        if files is not None:
            self._write_files(name, d, files)
        return str(d)

    def _host_path(self, hp: Obj, name: str) -> str:
        path, kind = hp.get("path", ""), hp.get("type", "")
        p = Path(path)
        if kind == "DirectoryOrCreate":
            p.mkdir(parents=True, exist_ok=True)
        elif kind == "FileOrCreate":
            p.parent.mkdir(parents=True, exist_ok=True)
            p.touch(exist_ok=True)
        elif kind in ("Directory", "File", "Socket", "CharDevice", "BlockDevice") and not p.exists():
            raise VolumeError(f"volume {name!r}: hostPath {path} ({kind}) does not exist")
        return path

    def _claim_path(self, claim: str, name: str) -> str:
        pvc = self.api.get("PersistentVolumeClaim", self.namespace, claim)
        if pvc is None:
            raise VolumeError(f"volume {name!r}: persistentvolumeclaim {self.namespace}/{claim} not found")
        pv_name = (pvc.get("spec") or {}).get("volumeName")
        if not pv_name or (pvc.get("status") or {}).get("phase") != "Bound":
            raise VolumeError(f"volume {name!r}: persistentvolumeclaim {self.namespace}/{claim} is not bound")
        pv = self.api.get("PersistentVolume", None, pv_name)
        if pv is None:
            raise VolumeError(f"volume {name!r}: persistentvolume {pv_name} not found")
        spec = pv.get("spec") or {}
        src = spec.get("hostPath") or spec.get("local")
        if not src or not src.get("path"):
            raise VolumeError(f"volume {name!r}: persistentvolume {pv_name} is neither hostPath nor local")
        Path(src["path"]).mkdir(parents=True, exist_ok=True)
        return src["path"]

    # ------------------------------------------------------------------------------------------ contents

    def _object_files(self, kind: str, src: Obj, vol: str, default_mode: int | None = None
                      ) -> dict[str, tuple[bytes, int]] | None:
        mode = src.get("defaultMode", default_mode if default_mode is not None else DEFAULT_MODE)
        obj = self.api.get(kind, self.namespace, src.get("name", ""))
        if obj is None:
            if src.get("optional"):
                return {}
            raise VolumeError(f"volume {vol!r}: {kind.lower()} {self.namespace}/{src.get('name')} not found")
        data = podenv.object_data(kind, obj)
        items = src.get("items")
        if not items:
            return {k: (v, mode) for k, v in data.items()}
        out = {}
        for it in items:
            key = it["key"]
            if key not in data:
                if src.get("optional"):
                    continue
                raise VolumeError(f"volume {vol!r}: key {key!r} not found in {kind.lower()} "
                                  f"{self.namespace}/{src.get('name')}")
            out[_rel(it.get("path") or key, "items[].path")] = (data[key], it.get("mode", mode))
        return out

    def _downward_files(self, src: Obj, mode: int, vol: str) -> dict[str, tuple[bytes, int]]:
        out = {}
        for it in src.get("items") or []:
            if "fieldRef" in it:
                try:
                    value = podenv.field_value(self.pod, it["fieldRef"].get("fieldPath", ""),
                                               pod_ip=self.pod_ip, host_ip=self.host_ip)
                except podenv.EnvError as e:
                    raise VolumeError(f"volume {vol!r}: {e}") from e
            elif "resourceFieldRef" in it:
                ref = it["resourceFieldRef"]
                containers = self.pod["spec"].get("containers", [])
                target = next((c for c in containers if c["name"] == ref.get("containerName")), None)
                if target is None:
                    raise VolumeError(f"volume {vol!r}: resourceFieldRef.containerName {ref.get('containerName')!r}"
                                      " names no container")
                value = podenv.resource_value(target, ref, self.allocatable)
            else:
                raise VolumeError(f"volume {vol!r}: downwardAPI item {it.get('path')!r} has no fieldRef")
            out[_rel(it["path"], "downwardAPI items[].path")] = (value.encode(), it.get("mode", mode))
        return out

    def _projected_files(self, proj: Obj, vol: str, refresh: bool) -> dict[str, tuple[bytes, int]] | None:
        mode = proj.get("defaultMode", DEFAULT_MODE)
        out: dict[str, tuple[bytes, int]] = {}
        for src in proj.get("sources") or []:
            if "configMap" in src:
                out.update(self._object_files("ConfigMap", src["configMap"], vol, mode) or {})
            elif "secret" in src:
                out.update(self._object_files("Secret", src["secret"], vol, mode) or {})
            elif "downwardAPI" in src:
                out.update(self._downward_files(src["downwardAPI"], mode, vol))
            elif "serviceAccountToken" in src:
                sat = src["serviceAccountToken"]
                path = _rel(sat.get("path", ""), "serviceAccountToken.path")
                key = (vol, path)
                if refresh and key in self._tokens and time.monotonic() < self._tokens[key]:
                    existing = self.root / vol / path
                    out[path] = (existing.read_bytes() if existing.exists() else b"", mode)
                    continue
                out[path] = (self._token(sat, key), mode)
            else:
                kinds = sorted(src)
                raise VolumeError(f"volume {vol!r}: projected source {kinds} is not supported")
        return out

    def _token(self, sat: Obj, key: tuple[str, str]) -> bytes:
        meta = self.pod["metadata"]
        sa = self.pod["spec"].get("serviceAccountName") or "default"
        ttl = int(sat.get("expirationSeconds") or 3600)
        spec: Obj = {"expirationSeconds": ttl,
                     "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": meta["name"], "uid": meta["uid"]}}
        if sat.get("audience"):
            spec["audiences"] = [sat["audience"]]
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        try:
            resp = self.api.request("POST", path_for("ServiceAccount", self.namespace, sa, "token"), body=body)
        except ApiError as e:
            raise VolumeError(f"volume {key[0]!r}: token for serviceaccount {self.namespace}/{sa}: {e}") from e
        granted = int(resp.get("spec", {}).get("expirationSeconds") or ttl)
        self._tokens[key] = time.monotonic() + 0.8 * granted
        return resp["status"]["token"].encode()

    def _write_files(self, vol: str, d: Path, files: dict[str, tuple[bytes, int]]) -> None:
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o755)
        for rel, (data, mode) in files.items():
            target = d / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                if target.read_bytes() == data and (target.stat().st_mode & 0o777) == mode:
                    continue
            except OSError:
                pass
            tmp = target.with_name(f".{target.name}.tmp")
            tmp.write_bytes(data)
            os.chmod(tmp, mode)
            os.replace(tmp, target)
        for rel in self._written.get(vol, set()) - set(files):
            (d / rel).unlink(missing_ok=True)
        self._written[vol] = set(files)

    # ------------------------------------------------------------------------------------------ mounts

    def mounts(self, container: Obj, env: dict[str, str]) -> list[Mount]:
        """The bind mounts of ``container`` (call after :meth:`prepare`)."""
        vols = {v["name"]: v for v in self.pod["spec"].get("volumes") or []}
        out = []
        for vm in container.get("volumeMounts") or []:
            name = vm["name"]
            if name not in self._paths:
                raise VolumeError(f"volumeMounts {name!r}: no such volume in the pod")
            vol = vols[name]
            source = self._paths[name]
            sub = vm.get("subPath") or (podenv.expand(vm["subPathExpr"], env) if vm.get("subPathExpr") else "")
            if sub:
                source = os.path.join(source, _rel(sub, f"volumeMounts {name!r} subPath"))
                if not os.path.exists(source):
                    if any(k in vol for k in READ_ONLY_KINDS):
                        raise VolumeError(f"volumeMounts {name!r}: subPath {sub!r} does not exist in the volume")
                    os.makedirs(source, exist_ok=True)
                    os.chmod(source, 0o777)
            read_only = (bool(vm.get("readOnly")) or any(k in vol for k in READ_ONLY_KINDS)
                         or bool((vol.get("persistentVolumeClaim") or {}).get("readOnly")))
            out.append(Mount(source, vm["mountPath"], read_only))
        return out
