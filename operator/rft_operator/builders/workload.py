"""The Kueue ``Workload`` of a queued RFTJob, and the placement an admission gives each role (pure).

A job labelled ``kueue.x-k8s.io/queue-name`` is admitted by Kueue as one gang: one Workload with a
pod set per role (``inference``, ``reward`` when the job has a reward role, ``rollout``, ``trainer``),
each with the role's pod count and a pod template reduced to what Kueue reads to account quota and
pick flavors (containers' names, images and resources, node selector, tolerations, affinity,
priority class, runtime class). Nothing that only configures the program (env, args, volumes,
probes) is in it, so editing such a field neither changes the Workload nor requeues the job.

An admission assigns each pod set flavors; each flavor's ``nodeLabels`` and ``tolerations`` are put
on that role's pods (:func:`place`), as Kueue's own job integrations do.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from rft_api.job import RFTJob

from .. import names
from .common import metadata

Obj = dict[str, Any]
API_VERSION = "kueue.x-k8s.io/v1beta2"
PRIORITY_GROUP = "kueue.x-k8s.io"
PRIORITY_KIND = "WorkloadPriorityClass"
POD_SPEC_KEYS = ("nodeSelector", "tolerations", "affinity", "priorityClassName", "runtimeClassName", "overhead")
CONTAINER_KEYS = ("name", "image", "resources")


@dataclass(frozen=True)
class Placement:
    """Where an admission puts one role's pods: the assigned flavors' node labels and tolerations."""

    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[tuple[tuple[str, Any], ...], ...] = ()

    @classmethod
    def of_flavors(cls, flavors: list[Obj]) -> "Placement":
        """The placement of the ResourceFlavor objects ``flavors`` (in the admission's order)."""
        selector: dict[str, str] = {}
        tolerations: list[tuple[tuple[str, Any], ...]] = []
        for flavor in flavors:
            spec = flavor.get("spec") or {}
            selector.update({str(k): str(v) for k, v in (spec.get("nodeLabels") or {}).items()})
            for t in spec.get("tolerations") or []:
                item = tuple(sorted(t.items()))
                if item not in tolerations:
                    tolerations.append(item)
        return cls(tuple(sorted(selector.items())), tuple(tolerations))


def _role_of(obj: Obj) -> str:
    return obj["metadata"]["labels"][names.LABEL_ROLE]


def _count(obj: Obj) -> int:
    spec = obj["spec"]
    return int(spec.get("parallelism", 1) if obj["kind"] == "Job" else spec.get("replicas", 1))


def _reduced_template(template: Obj) -> Obj:
    """The parts of a pod template Kueue reads for quota and flavor assignment."""
    spec = template.get("spec") or {}
    out: Obj = {k: copy.deepcopy(spec[k]) for k in POD_SPEC_KEYS if k in spec}
    for key in ("initContainers", "containers"):
        if spec.get(key):
            out[key] = [{k: copy.deepcopy(c[k]) for k in CONTAINER_KEYS if k in c} for c in spec[key]]
    labels = (template.get("metadata") or {}).get("labels") or {}
    return {"metadata": {"labels": dict(labels)}, "spec": out}


def workload_for(job: RFTJob, role_workloads: list[Obj], priority: Optional[tuple[str, int]] = None) -> Obj:
    """The Workload of ``job``: one pod set per role workload in ``role_workloads`` (the Deployments
    and the trainer Job as built, without placement), queued in the job's LocalQueue. ``priority``:
    the WorkloadPriorityClass named by the job's label and its value."""
    pod_sets = [{"name": _role_of(obj), "count": _count(obj), "template": _reduced_template(obj["spec"]["template"])}
                for obj in role_workloads]
    meta = metadata(job, names.workload(job.name, job.metadata.get("uid", "")), "workload")
    meta["labels"][names.LABEL_KUEUE_JOB_UID] = job.metadata.get("uid", "")
    spec: Obj = {"queueName": job.metadata.get("labels", {})[names.LABEL_QUEUE_NAME], "podSets": pod_sets}
    if priority is not None:
        spec["priorityClassRef"] = {"group": PRIORITY_GROUP, "kind": PRIORITY_KIND, "name": priority[0]}
        spec["priority"] = priority[1]
    return {"apiVersion": API_VERSION, "kind": "Workload", "metadata": meta, "spec": spec}


def place(obj: Obj, placements: Mapping[str, Placement]) -> Obj:
    """``obj`` (a role workload) with its role's placement on its pod template (in place)."""
    p = placements.get(_role_of(obj))
    if p is None or (not p.node_selector and not p.tolerations):
        return obj
    pod = obj["spec"]["template"].setdefault("spec", {})
    if p.node_selector:
        pod["nodeSelector"] = {**(pod.get("nodeSelector") or {}), **dict(p.node_selector)}
    if p.tolerations:
        have = list(pod.get("tolerations") or [])
        pod["tolerations"] = have + [dict(t) for t in p.tolerations if dict(t) not in have]
    return obj
