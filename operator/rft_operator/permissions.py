"""The Kubernetes permissions the operator needs: the rules of its (Cluster)Role.

The Helm chart grants exactly these (a test runs the operator with a ServiceAccount bound to them and
nothing else): in a ClusterRole when the operator watches every namespace, in a Role (and
RoleBinding) per namespace when the chart's ``watchNamespaces`` names them. Notes:

- server-side apply of an object that does not exist yet creates it: both ``create`` and ``patch``;
- ``rftjobs``: ``patch`` for kopf's bookkeeping annotations (its progress and last-handled
  configuration live in annotations, not status); ``rftjobs/status``: the status writes;
  ``rftjobs/finalizers`` ``update``: every child carries an owner reference to its RFTJob with
  ``blockOwnerDeletion``, which the OwnerReferencesPermissionEnforcement admission plugin (OpenShift
  enables it) allows only to a subject that may update the owner's finalizers;
- ``configmaps`` ``get``/``patch`` are also what the per-job trainer Role grants (on one name): the
  API server lets a subject create a Role or RoleBinding only with permissions it holds itself;
- ``events``: the operator's and kopf's Events (core/v1);
- ``pods``: read only (get/list/watch), for the pods' waiting reasons and termination messages
  (terminal errors: image pull failures, the trainer's last log lines);
- ``secrets``: ``get`` and ``create`` only, for the job's token Secret ``<job>-token``, which the
  operator creates once with a random token and then checks by name; no ``list``/``watch`` (the
  operator cannot enumerate Secrets), no ``patch``/``update``/``delete`` (it never rotates nor
  deletes one: the garbage collector deletes it with its job). The evaluators' API-key Secrets
  are only referenced (``secretKeyRef``), never read;
- ``networkpolicies``: the job's NetworkPolicies (``builders.network``).

Leader election needs ``leases`` get/create/update in the operator's own namespace only: a Role
(``LEADER_ELECTION_RULES``), not part of the ClusterRole.

With the Kueue integration on (Helm value ``kueue.enabled``), ``KUEUE_RULES`` are added: the jobs'
Workloads (created, deleted when a job's pod sets change, their status patched to release an evicted
reservation and to mark them Finished, as Kueue's own integrations do), and read access to the
ResourceFlavors an admission names and the WorkloadPriorityClasses jobs name (``KUEUE_CLUSTER_RULES``,
cluster-scoped objects: a ClusterRole of their own).
"""
from __future__ import annotations

from typing import Any

CHILD_VERBS = ["get", "list", "watch", "create", "patch", "delete"]

OPERATOR_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["rft.dev"], "resources": ["rftjobs"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": ["rft.dev"], "resources": ["rftjobs/status"], "verbs": ["get", "patch"]},
    {"apiGroups": ["rft.dev"], "resources": ["rftjobs/finalizers"], "verbs": ["update"]},
    {"apiGroups": [""], "resources": ["configmaps", "services", "serviceaccounts", "persistentvolumeclaims"],
     "verbs": CHILD_VERBS},
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": CHILD_VERBS},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": CHILD_VERBS},
    {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": CHILD_VERBS},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": CHILD_VERBS},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
]

KUEUE_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": CHILD_VERBS},
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads/status"], "verbs": ["get", "patch"]},
]
# Cluster-scoped, so always in a ClusterRole of their own (also when the other rules are namespaced).
KUEUE_CLUSTER_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["resourceflavors", "workloadpriorityclasses"], "verbs": ["get"]},
]

LEADER_ELECTION_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
]
