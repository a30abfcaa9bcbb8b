"""Crash safety, idempotence and validation of the operator against a real kube-apiserver.

- an operator process killed in the middle of a reconcile (``os._exit`` between two applies) and a
  new operator leave exactly one of each child;
- reconciling an unchanged job applies nothing (the applied hash is unchanged) and writes no status;
- a spec that does not validate (one an older CRD let through) ends in a terminal ValidationFailed,
  naming the field, with no children.
"""
from __future__ import annotations

import copy
import time

import pytest

from rft_api.job import parse_manifest
from rft_operator import names
from rft_operator.builders import BuildContext, desired_children
from rft_operator.kube import CHILD_KINDS, Kube, KubeError
from rft_operator.reconcile import reconcile
from tests.operator.cluster_support import (  # noqa: F401
    OperatorThread,
    api,
    children,
    crd,
    create_job,
    get_job,
    job_manifest,
    run_operator_process,
    wait_phase,
)
from tests.operator.crashing_operator import ENV, KILLED_EXIT_CODE, MESSAGE
from tests.support.polling import wait_for

pytestmark = pytest.mark.cluster
JOB = "tiny-arith"


def expected_keys(doc: dict, namespace: str) -> set[tuple[str, str]]:
    job = parse_manifest(doc)
    job.metadata.update(namespace=namespace, uid="x")
    return {(o["kind"], o["metadata"]["name"]) for o in desired_children(job, BuildContext())}


def all_named(api: Kube, namespace: str, kind: str) -> list[str]:
    return sorted(o["metadata"]["name"] for o in api.list(kind, namespace))


def test_operator_killed_mid_reconcile_then_restarted(cluster, crd, api, namespace) -> None:
    doc = job_manifest(JOB)
    create_job(api, namespace, doc)
    proc = run_operator_process(cluster.kubeconfig, namespace, {ENV: "4"})
    assert proc.returncode == KILLED_EXIT_CODE, proc.stderr[-3000:]
    assert MESSAGE in proc.stderr
    partial = children(api, namespace, JOB)
    assert 0 < len(partial) < len(expected_keys(doc, namespace)), partial.keys()

    with OperatorThread(cluster.kubeconfig, namespace):
        want = expected_keys(doc, namespace)
        kids = wait_for("every child", lambda: (k := children(api, namespace, JOB)) and set(k) == want and k)
        wait_phase(api, namespace, JOB, "Provisioning")
        uids = {k: o["metadata"]["uid"] for k, o in kids.items()}
    # exactly one of each child, in the whole namespace, and none re-created by the second operator
    for kind in CHILD_KINDS:
        mine = sorted(n for (k, n) in want if k == kind)
        everything = [n for n in all_named(api, namespace, kind) if n.startswith(JOB)]
        assert everything == mine, kind
    assert {k: o["metadata"]["uid"] for k, o in children(api, namespace, JOB).items()} == uids
    # one ReplicaSet per Deployment: no second rollout of an unchanged template
    assert sorted(r["metadata"]["ownerReferences"][0]["name"] for r in api.list("ReplicaSet", namespace)) == [
        names.inference(JOB), names.rollout(JOB)]
    assert len(api.list("Job", namespace)) == 1


def _apply_times(obj: dict) -> list[str]:
    return [m.get("time", "") for m in obj["metadata"].get("managedFields", [])
            if m.get("manager") == names.FIELD_MANAGER and m.get("operation") == "Apply"]


def _changed(old: dict, new: dict) -> dict:
    """The status fields that differ, old and new (conditions by type)."""
    def flat(st: dict) -> dict:
        out = {k: v for k, v in st.items() if k != "conditions"}
        out.update({f"conditions[{c['type']}]": c for c in st.get("conditions") or []})
        return out
    a, b = flat(old), flat(new)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def test_reconciling_an_unchanged_job_changes_nothing(crd, api, namespace) -> None:
    create_job(api, namespace, job_manifest(JOB))
    first = reconcile(api, get_job(api, namespace, JOB))
    assert first.status_written and first.phase == "Provisioning" and not first.errors
    second = reconcile(api, get_job(api, namespace, JOB))
    assert not second.errors and not second.deleted

    # Let the controllers finish what they do to new objects, then take a snapshot: every Deployment's
    # and the Job's status written by its controller for the current spec (under load the first status
    # write can come seconds late), and nothing changed for 1.5 s.
    def seen(o: dict) -> bool:
        st = o.get("status") or {}
        if o["kind"] == "Deployment":
            return st.get("observedGeneration") == o["metadata"]["generation"] and \
                st.get("replicas") == o["spec"]["replicas"]
        return o["kind"] != "Job" or bool(st.get("startTime"))

    def settled():
        a = children(api, namespace, JOB)
        time.sleep(1.5)
        b = children(api, namespace, JOB)
        return b if all(seen(o) for o in b.values()) and \
            {k: o["metadata"]["resourceVersion"] for k, o in a.items()} == \
            {k: o["metadata"]["resourceVersion"] for k, o in b.items()} else None
    before = wait_for("children to settle", settled, timeout=60)
    job_rv = get_job(api, namespace, JOB)["metadata"]["resourceVersion"]

    for _ in range(2):
        job = get_job(api, namespace, JOB)
        out = reconcile(api, job)
        # every desired child carries the hash of what was last applied: nothing is applied again
        assert not out.applied and not out.deleted and not out.errors
        assert not out.events
        assert not out.status_written, _changed(job.get("status") or {}, out.status_obj["status"])
    after = children(api, namespace, JOB)
    assert set(after) == set(before)
    for key in before:
        b, a = before[key]["metadata"], after[key]["metadata"]
        assert a["resourceVersion"] == b["resourceVersion"], f"{key} changed"
        assert a.get("generation") == b.get("generation")
        assert _apply_times(after[key]) == _apply_times(before[key])
    assert get_job(api, namespace, JOB)["metadata"]["resourceVersion"] == job_rv


def test_invalid_spec_is_terminal_validation_failed_without_children(crd, api, namespace) -> None:
    bad = job_manifest("bad-job", rollout={"samplesPerPrompt": 1, "promptsPerStep": 4, "maxTokens": 16})
    # The CRD refuses it, naming the field ...
    with pytest.raises(KubeError) as e:
        create_job(api, namespace, bad)
    assert e.value.status == 422 and "samplesPerPrompt" in e.value.message
    # ... and so does the operator when one slips through (an object stored under an older, laxer CRD):
    # the stored object is valid; the operator is handed the same object with the invalid spec.
    stored = create_job(api, namespace, job_manifest("bad-job"))
    slipped = copy.deepcopy(stored)
    slipped["spec"]["rollout"]["samplesPerPrompt"] = 1
    out = reconcile(api, slipped)
    assert out.phase == "ValidationFailed" and out.status_written and not out.applied
    obj = get_job(api, namespace, "bad-job")
    st = obj["status"]
    assert st["phase"] == "ValidationFailed"
    assert "spec.rollout.samplesPerPrompt" in st["message"] and "at least 2" in st["message"]
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and failed["reason"] == "InvalidSpec"
    assert failed["observedGeneration"] == obj["metadata"]["generation"]
    assert children(api, namespace, "bad-job") == {}
    reasons = [e["reason"] for e in api.list("Event", namespace) if e["involvedObject"]["name"] == "bad-job"]
    assert "InvalidSpec" in reasons
    # terminal: reconciling the (valid) stored object again changes nothing
    again = reconcile(api, get_job(api, namespace, "bad-job"))
    assert again.phase == "ValidationFailed" and not again.status_written


def test_running_operator_leaves_a_steady_job_alone(cluster, crd, api, namespace) -> None:
    """Several resyncs, child events and kopf's own bookkeeping later, nothing the operator writes changes."""
    create_job(api, namespace, job_manifest(JOB))
    with OperatorThread(cluster.kubeconfig, namespace, resync_seconds=0.5) as op:
        wait_phase(api, namespace, JOB, "Provisioning")
        quiet_kinds = ("ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service")

        def snapshot():
            return ({k: o["metadata"]["resourceVersion"] for k, o in children(api, namespace, JOB, quiet_kinds).items()},
                    get_job(api, namespace, JOB)["metadata"]["resourceVersion"])

        def steady():
            a = snapshot()
            import time
            time.sleep(1.0)
            return a == snapshot() and a
        before = wait_for("a steady state", steady, timeout=60)
        ok_before = op.metrics.reconciles.labels(result="ok")._value.get()
        wait_for("three more reconciles", lambda: op.metrics.reconciles.labels(result="ok")._value.get() >= ok_before + 3)
        assert snapshot() == before
