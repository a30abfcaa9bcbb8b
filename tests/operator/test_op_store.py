"""The watch cache: an older object never replaces a newer one, a deleted one is never revived by a
late answer, and the operator's own deletions stay visible as 'being deleted' until the watch says so."""
from __future__ import annotations

from rft_operator import names
from rft_operator.store import DELETE_REQUESTED, Store


def obj(kind: str, name: str, rv: str, uid: str = "u1", job: str = "j") -> dict:
    return {"kind": kind, "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv, "uid": uid,
                                       "labels": {names.LABEL_INSTANCE: job}}}


def test_newer_wins_and_deleted_stays_deleted() -> None:
    s = Store()
    assert s.put(obj("ConfigMap", "j-config", "5")) == (("ns", "j"), True)
    assert s.put(obj("ConfigMap", "j-config", "5")) == (("ns", "j"), False)  # an echo
    s.put(obj("ConfigMap", "j-config", "4"))  # a late, older event
    assert s.children(("ns", "j"))[0]["metadata"]["resourceVersion"] == "5"
    s.drop(obj("ConfigMap", "j-config", "6"))
    assert s.children(("ns", "j")) == []
    s.settle(("ns", "j"), [obj("ConfigMap", "j-config", "5")], [])  # an answer older than the deletion
    assert s.children(("ns", "j")) == []


def test_own_deletion_is_visible_until_the_watch_confirms() -> None:
    s = Store()
    s.put(obj("Job", "j-trainer", "7"))
    s.settle(("ns", "j"), [], [("Job", "j-trainer")])
    (job,) = s.children(("ns", "j"))
    assert job["metadata"]["deletionTimestamp"] == DELETE_REQUESTED
    s.drop(obj("Job", "j-trainer", "9"))
    assert s.children(("ns", "j")) == []


def test_pods_are_kept_apart_and_unlabelled_objects_ignored() -> None:
    s = Store()
    s.put(obj("Pod", "j-trainer-0-x", "3"))
    assert s.pods(("ns", "j"))[0]["metadata"]["name"] == "j-trainer-0-x" and s.children(("ns", "j")) == []
    assert s.put({"kind": "ConfigMap", "metadata": {"name": "other", "namespace": "ns"}}) == (None, False)
