"""A list+watch cache of one kind of object, in a thread (the PV provisioner, TEST INFRASTRUCTURE).

:class:`Informer` lists, then watches from the list's resourceVersion (re-watching when the server
ends a watch, re-listing on ``410 Gone`` or errors), keeps ``{(namespace, name): object}`` and calls
``on_change(kind, old, new)`` for every difference (``new`` is ``None`` when the object is gone).
Callbacks run on the informer's thread and must not block for long.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from .kubeapi import ApiError, KubeApi

Obj = dict[str, Any]
OnChange = Callable[[str, "Obj | None", "Obj | None"], None]
log = logging.getLogger("e2e.provisioner")


def key_of(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata", {})
    return meta.get("namespace", ""), meta.get("name", "")


class Informer:
    """Cache of ``kind`` objects matching ``query`` (``fieldSelector``, ``labelSelector``)."""

    def __init__(self, api: KubeApi, kind: str, on_change: OnChange, watch_timeout_s: int = 8, **query: Any) -> None:
        self.api, self.kind, self.on_change, self.query = api, kind, on_change, query
        self.watch_timeout_s = watch_timeout_s
        self._cache: dict[tuple[str, str], Obj] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"informer-{kind}", daemon=True)

    def start(self) -> Informer:
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the thread to end and wait (at most ``timeout``) for the current watch to return."""
        self._stop.set()
        self._thread.join(timeout)

    def wait_synced(self, timeout: float) -> bool:
        """True once the first list has been loaded (False at the deadline)."""
        return self._synced.wait(timeout)

    def items(self) -> list[Obj]:
        with self._lock:
            return list(self._cache.values())

    def get(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            return self._cache.get((namespace, name))

    # ------------------------------------------------------------------------------------------

    def _emit(self, old: Obj | None, new: Obj | None) -> None:
        try:
            self.on_change(self.kind, old, new)
        except Exception:  # noqa: BLE001 - a faulty handler must not kill the informer
            log.exception("%s handler failed", self.kind)

    def _relist(self) -> str:
        lst = self.api.list(self.kind, **self.query)
        fresh = {key_of(o): o for o in lst.get("items", [])}
        with self._lock:
            old_cache, self._cache = self._cache, fresh
        for k, obj in fresh.items():
            old = old_cache.get(k)
            if old is None or old["metadata"].get("resourceVersion") != obj["metadata"].get("resourceVersion"):
                self._emit(old, obj)
        for k, obj in old_cache.items():
            if k not in fresh:
                self._emit(obj, None)
        self._synced.set()
        return lst["metadata"]["resourceVersion"]

    def _apply(self, etype: str, obj: Obj) -> None:
        k = key_of(obj)
        with self._lock:
            old = self._cache.get(k)
            if etype == "DELETED":
                self._cache.pop(k, None)
            else:
                self._cache[k] = obj
        self._emit(old, None if etype == "DELETED" else obj)

    def _run(self) -> None:
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self._relist()
                for ev in self.api.watch(self.kind, rv, timeout_s=self.watch_timeout_s, **self.query):
                    etype, obj = ev.get("type"), ev.get("object") or {}
                    if etype == "ERROR":
                        if obj.get("code") == 410:
                            rv = None
                        else:
                            log.warning("%s watch error: %s", self.kind, obj.get("message"))
                        break
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if etype != "BOOKMARK":
                        self._apply(etype, obj)
                    if self._stop.is_set():
                        break
            except ApiError as e:
                if e.status == 410:
                    rv = None
                    continue
                log.warning("%s list/watch failed: %s", self.kind, e)
                rv = None
                self._stop.wait(1.0)
            except Exception as e:  # noqa: BLE001 - transport errors: retry after a pause
                if self._stop.is_set():
                    break
                log.debug("%s watch interrupted: %s", self.kind, e)
                rv = None
                self._stop.wait(1.0)
