"""The Kueue admission policy and the Workload builder (pure; the API-server side is
tests/integration/test_kueue.py)."""
from __future__ import annotations

from rft_operator import names
from rft_operator.builders import BuildContext, workload_children
from rft_operator.builders.workload import Placement, place, workload_for
from rft_operator.observe import Observed
from rft_operator.policies import admission
from rft_operator.status import compute_status
from tests.operator.support import T0, make_job, manifest
from tests.support.shared import KUEUE_CRDS_SHA256, kueue_crds


def queued_job(**labels: str):
    doc = manifest()
    doc["spec"]["trainer"]["resources"] = {"requests": {"cpu": "2"}}
    doc["metadata"]["labels"] = {names.LABEL_QUEUE_NAME: "team-a", **labels}
    return make_job(doc)


def wl(*conds: tuple[str, str, str], admitted: bool = False) -> dict:
    status: dict = {"conditions": [{"type": t, "status": s, "reason": r, "message": f"{t} {r}",
                                    "lastTransitionTime": "2025-01-01T00:00:00Z"} for t, s, r in conds]}
    if admitted:
        status["admission"] = {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "trainer", "flavors": {"cpu": "a", "nvidia.com/gpu": "gpu"}}, {"name": "rollout", "flavors": {"cpu": "a"}}]}
    return {"metadata": {"name": "w", "generation": 1}, "status": status}


def test_hold_follows_the_workload_conditions() -> None:
    assert admission.hold("q", None).reason == admission.QUEUED
    waiting = admission.hold("q", wl(("QuotaReserved", "False", "Pending")))
    assert waiting.reason == admission.QUEUED and "QuotaReserved Pending" in waiting.message and "'q'" in waiting.message
    assert admission.hold("q", wl(("QuotaReserved", "True", "QuotaReserved"), ("Admitted", "True", "Admitted"),
                                  admitted=True)) is None
    # quota reserved but admission checks pending: not admitted yet
    assert admission.hold("q", wl(("QuotaReserved", "True", "QuotaReserved"), admitted=True)) is not None
    evicted = wl(("Admitted", "True", "Admitted"), ("Evicted", "True", "Preempted"), admitted=True)
    h = admission.hold("q", evicted)
    assert h.reason == admission.EVICTED and "Preempted" in h.message
    assert admission.must_release(evicted) and not admission.must_release(wl(("Evicted", "True", "Preempted")))


def test_release_and_finish_patches_keep_other_conditions() -> None:
    evicted = wl(("QuotaReserved", "True", "QuotaReserved"), ("Admitted", "True", "Admitted"),
                 ("Evicted", "True", "Preempted"), admitted=True)
    patch = admission.release_patch(evicted, "2025-01-02T00:00:00Z")["status"]
    assert patch["admission"] is None
    by_type = {c["type"]: c for c in patch["conditions"]}
    assert by_type["QuotaReserved"]["status"] == "False" and by_type["QuotaReserved"]["reason"] == "Pending"
    assert by_type["Admitted"]["status"] == "False" and by_type["Evicted"]["status"] == "True"
    done = admission.finished_patch(evicted, True, "ok", "2025-01-02T00:00:00Z")["status"]["conditions"]
    assert {c["type"]: c["status"] for c in done}["Finished"] == "True" and len(done) == 4
    finished = wl(("Finished", "True", "Succeeded"))
    assert admission.finished_patch(finished, True, "ok", "now") is None
    assert admission.assignments(evicted) == {"trainer": ["a", "gpu"], "rollout": ["a"]}


def test_workload_pod_sets_carry_counts_and_requests_only() -> None:
    job = queued_job()
    w = workload_for(job, workload_children(job, BuildContext()), ("high", 7))
    sets = {ps["name"]: ps for ps in w["spec"]["podSets"]}
    assert set(sets) >= {"inference", "rollout", "trainer"} and sets["trainer"]["count"] == job.spec.trainer.nodes
    c = sets["inference"]["template"]["spec"]["containers"][0]
    # the role's own requests, completed by spec.defaultResources: every pod set has requests for Kueue to count
    assert sets["trainer"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "2"
    assert all(c["resources"]["requests"] for ps in sets.values() for c in ps["template"]["spec"]["containers"])
    assert set(c) <= {"name", "image", "resources"}  # no env, args, probes: editing them does not requeue
    assert w["spec"]["queueName"] == "team-a" and w["spec"]["priority"] == 7
    assert w["metadata"]["labels"][names.LABEL_KUEUE_JOB_UID] == job.metadata["uid"]
    # an edit of a field that only configures the program leaves the Workload as it was
    edited = queued_job()
    edited.spec.trainer.max_steps += 1
    assert workload_for(edited, workload_children(edited, BuildContext()))["spec"]["podSets"] == \
        workload_for(job, workload_children(job, BuildContext()))["spec"]["podSets"]


def test_placement_goes_on_the_roles_pods() -> None:
    flavors = [{"spec": {"nodeLabels": {"pool": "a"}, "tolerations": [{"key": "pool", "operator": "Exists"}]}},
               {"spec": {"nodeLabels": {"gpu": "h200"}}}]
    p = Placement.of_flavors(flavors)
    job = queued_job()
    ctx = BuildContext(placements=(("trainer", p),))
    objs = {o["metadata"]["labels"][names.LABEL_ROLE]: o for o in workload_children(job, ctx)}
    pod = objs["trainer"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["pool"] == "a" and pod["nodeSelector"]["gpu"] == "h200"
    assert {"key": "pool", "operator": "Exists"} in pod["tolerations"]
    assert "nodeSelector" not in objs["rollout"]["spec"]["template"]["spec"] or \
        "pool" not in objs["rollout"]["spec"]["template"]["spec"]["nodeSelector"]
    assert place(objs["rollout"], {}) is objs["rollout"]


def test_a_held_job_is_suspended_with_kueues_reason() -> None:
    job = queued_job()
    hold = admission.hold("team-a", wl(("QuotaReserved", "False", "Pending")))
    s = compute_status(job, Observed(now=T0), hold=hold)
    susp = next(c for c in s.conditions if c.type == "Suspended")
    assert s.phase == "Suspended" and susp.status == "True" and susp.reason == admission.QUEUED
    assert s.roles.trainer.desired == 0 and "QuotaReserved Pending" in s.message


def test_the_kueue_crds_the_cluster_tests_install_are_the_pinned_ones():
    """tests/integration/test_kueue.py installs Kueue's CRDs from shared/kueue-crds/ (beside the checkout):
    every file pinned is there with its pinned content (checked here too, without a cluster)."""
    files = kueue_crds()
    assert [f.name for f in files] == sorted(KUEUE_CRDS_SHA256)
