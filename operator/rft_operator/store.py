"""The operator's watch cache: RFTJobs, their children and their pods, as the watches last saw them.

Fed by the kopf event handlers (every watched object, with its event type) and by the answers of
the operator's own writes, so a reconcile reads its inputs here instead of listing them: an idle job
costs no API request. Primed once at start with one LIST per watched kind (``Controller.prime``).

Objects are indexed by their job: an RFTJob by ``(namespace, name)``, a child or a pod by
``(namespace, <app.kubernetes.io/instance label>)`` (the reconcile keeps only children controlled by
the RFTJob's uid). An older object never replaces a newer one: resource versions are compared as
integers (what the API server's etcd storage uses; an unreadable one always replaces).
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

from . import names

Obj = dict[str, Any]
Key = tuple[str, str]
MAX_TOMBSTONES = 10000
DELETE_REQUESTED = "requested"  # deletionTimestamp of a child this operator deleted, before the watch tells
ChildKey = tuple[str, str]


def _rv(obj: Optional[Obj]) -> Optional[int]:
    try:
        return int(((obj or {}).get("metadata") or {}).get("resourceVersion", ""))
    except ValueError:
        return None


def newer_or_equal(new: Obj, old: Optional[Obj]) -> bool:
    """Whether ``new`` should replace ``old`` (same object): not older by resource version."""
    a, b = _rv(new), _rv(old)
    return old is None or a is None or b is None or a >= b


def slim(obj: Obj) -> Obj:
    """The object without ``metadata.managedFields`` (nothing here reads them; they are most of a
    small object's size)."""
    meta = obj.get("metadata") or {}
    if "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def job_key_of(obj: Obj) -> Optional[Key]:
    """The job a child or pod belongs to, by its instance label."""
    meta = obj.get("metadata") or {}
    job = (meta.get("labels") or {}).get(names.LABEL_INSTANCE)
    return (meta.get("namespace", ""), job) if job else None


class Store:
    """What the watches saw, by job."""

    def __init__(self) -> None:
        self.jobs: dict[Key, Obj] = {}
        self._children: dict[Key, dict[ChildKey, Obj]] = {}
        self._pods: dict[Key, dict[str, Obj]] = {}
        self._gone: dict[str, None] = {}
        """uids whose DELETED event was seen (bounded, oldest first): a late answer never revives one."""

    # ---------------------------------------------------------------- RFTJobs
    def put_job(self, obj: Obj) -> tuple[Key, bool]:
        """Record an RFTJob; returns its key and whether the cache changed (not an echo of what it
        already holds, such as the answer of the operator's own status write)."""
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        old = self.jobs.get(key)
        changed = old is None or _rv(old) != _rv(obj) or _rv(obj) is None
        if newer_or_equal(obj, old):
            self.jobs[key] = slim(obj)
        return key, changed

    def drop_job(self, key: Key) -> None:
        self.jobs.pop(key, None)

    # ---------------------------------------------------------------- children and pods
    def _bucket(self, obj: Obj) -> tuple[Optional[dict], Any]:
        key = job_key_of(obj)
        if key is None:
            return None, None
        if obj.get("kind") == "Pod":
            return self._pods.setdefault(key, {}), obj["metadata"]["name"]
        return self._children.setdefault(key, {}), (obj.get("kind", ""), obj["metadata"]["name"])

    def put(self, obj: Obj) -> tuple[Optional[Key], bool]:
        """Record a child or a pod; returns its job's key (None when it carries no job label) and
        whether the cache changed (an echo of the operator's own apply does not)."""
        bucket, k = self._bucket(obj)
        if bucket is None:
            return None, False
        old = bucket.get(k)
        changed = old is None or _rv(old) != _rv(obj) or _rv(obj) is None
        if newer_or_equal(obj, old) and obj["metadata"].get("uid") not in self._gone:
            bucket[k] = slim(obj)
        return job_key_of(obj), changed

    def drop(self, obj: Obj) -> Optional[Key]:
        """Forget a deleted child or pod; returns its job's key."""
        bucket, k = self._bucket(obj)
        if bucket is None:
            return None
        old = bucket.get(k)
        uid = obj["metadata"].get("uid")
        if old is not None and (old.get("metadata") or {}).get("uid") in (None, uid):
            bucket.pop(k, None)
        if uid:
            self._gone[uid] = None
            while len(self._gone) > MAX_TOMBSTONES:
                self._gone.pop(next(iter(self._gone)))
        return job_key_of(obj)

    def children(self, key: Key) -> list[Obj]:
        return list(self._children.get(key, {}).values())

    def pods(self, key: Key) -> list[Obj]:
        return list(self._pods.get(key, {}).values())

    def settle(self, key: Key, applied: Iterable[Obj], deleted: Iterable[ChildKey]) -> None:
        """Record a reconcile's writes: the children it applied as the API server answered, and the
        ones it deleted (kept, marked as being deleted, until their DELETED event)."""
        bucket = self._children.setdefault(key, {})
        for obj in applied:
            ck = (obj.get("kind", ""), obj["metadata"]["name"])
            if newer_or_equal(obj, bucket.get(ck)) and obj["metadata"].get("uid") not in self._gone:
                bucket[ck] = slim(obj)
        for ck in deleted:  # being deleted until the watch says DELETED (a Job waits for its pods)
            held = bucket.get(ck)
            if held is not None and not held["metadata"].get("deletionTimestamp"):
                bucket[ck] = {**held, "metadata": {**held["metadata"], "deletionTimestamp": DELETE_REQUESTED}}

    def forget(self, key: Key) -> None:
        """Drop everything of a job that no longer exists (its children's DELETED events follow)."""
        self.jobs.pop(key, None)

    def sizes(self) -> tuple[int, int, int]:
        return (len(self.jobs), sum(len(b) for b in self._children.values()),
                sum(len(b) for b in self._pods.values()))
