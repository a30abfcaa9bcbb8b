"""The trainer's identity: a ServiceAccount, a Role that may get and patch ``<job>-progress`` only
(by resourceNames; no list, no watch, no other object) and the RoleBinding between them.

Nothing grants pods access to RFTJobs: the operator is the only writer of their status.
"""
from __future__ import annotations

from typing import Any

from rft_api.job import RFTJob

from .. import names
from .common import BuildContext, metadata

Obj = dict[str, Any]
ROLE = "trainer"


def service_account(job: RFTJob, ctx: BuildContext) -> Obj:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(job, names.trainer(job.name), ROLE),
            "automountServiceAccountToken": False}


def role(job: RFTJob, ctx: BuildContext) -> Obj:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": metadata(job, names.trainer(job.name), ROLE),
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [names.progress(job.name)],
                   "verbs": ["get", "patch"]}],
    }


def role_binding(job: RFTJob, ctx: BuildContext) -> Obj:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": metadata(job, names.trainer(job.name), ROLE),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": names.trainer(job.name)},
        "subjects": [{"kind": "ServiceAccount", "name": names.trainer(job.name), "namespace": job.namespace}],
    }
