"""Deterministic names and labels of an RFTJob's children.

Every child name is ``<job>-<suffix>``; job names are at most 40 characters (``rft_api.job``), so the
longest child name (``<job>-inference-pods``) is 55 characters: a valid DNS-1035 label (Services need
that) and short enough for the controllers' generated pod names.
"""
from __future__ import annotations

import re

from rft_api.layout import CONFIG_KEY as CONFIG_KEY
from rft_api.progress import PROGRESS_KEY as PROGRESS_KEY

MANAGED_BY = "rft-operator"
FIELD_MANAGER = "rft-operator"
APP_NAME = "rft"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_ROLE = "rft.dev/role"
# The trainer attempt a trainer Job belongs to (0 for the first, +1 per restart).
ANNOTATION_ATTEMPT = "rft.dev/trainer-attempt"
# Hash of the rendered runtime config (``<job>-config``) on every pod template: an edit of the config
# changes the template, so the pods that read it roll.
ANNOTATION_CONFIG_HASH = "rft.dev/config-hash"
# Hash of the trainer Job's spec (immutable once created): a different one means the Job is recreated.
ANNOTATION_TEMPLATE_HASH = "rft.dev/template-hash"
# Hash of the whole child as last applied: an equal desired child is not applied again.
ANNOTATION_APPLIED_HASH = "rft.dev/applied-hash"
# Kueue: the LocalQueue an RFTJob is queued in, and its WorkloadPriorityClass (labels on the RFTJob, as
# Kueue's own integrations read them), and the job uid Kueue's integrations put on their Workloads.
LABEL_QUEUE_NAME = "kueue.x-k8s.io/queue-name"
LABEL_PRIORITY_CLASS = "kueue.x-k8s.io/priority-class"
LABEL_KUEUE_JOB_UID = "kueue.x-k8s.io/job-uid"
# A checkpoint claim kept when its RFTJob is deleted (checkpoint.retainOnDelete) carries no owner
# reference; this annotation names the uid of the job it serves.
ANNOTATION_RETAINED_FOR = "rft.dev/retained-for"
# On the job's token Secret and on every role's pod template: a digest of the token (never the token),
# so a token minted anew (its Secret was deleted) changes every template and restarts every role with it.
ANNOTATION_TOKEN_DIGEST = "rft.dev/token-digest"
# On an existing claim (checkpoint.existingClaim): the uid of the live job that writes into it.
ANNOTATION_USED_BY = "rft.dev/used-by"
# On the pods that share a ReadWriteOnce checkpoint claim: they are scheduled onto one node together.
LABEL_SHARES_CHECKPOINTS = "rft.dev/shares-checkpoints"
# Label the job controller puts on the pods of an Indexed Job.
LABEL_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

# Server-side label selector of everything the operator creates (children) and its pods.
MANAGED_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY}"

ROLES = ("config", "progress", "inference", "reward", "rollout", "trainer", "checkpoints", "token", "network")

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def config(job: str) -> str:
    """ConfigMap with the resolved runtime config (``config.json``)."""
    return f"{job}-config"


def progress(job: str) -> str:
    """ConfigMap the trainer patches with its progress (``progress.json``)."""
    return f"{job}-progress"


def inference(job: str) -> str:
    """Inference Deployment and Service."""
    return f"{job}-inference"


def inference_pods(job: str) -> str:
    """Headless Service (no cluster IP, ready pods only) whose DNS name resolves to the address of every
    ready inference replica: how the trainer publishes each policy version to all of them."""
    return f"{job}-inference-pods"


def reward(job: str) -> str:
    """Reward Deployment and Service."""
    return f"{job}-reward"


def rollout(job: str) -> str:
    """Rollout Deployment."""
    return f"{job}-rollout"


def trainer(job: str) -> str:
    """Trainer Job, its headless coordinator Service, and the trainer ServiceAccount/Role/RoleBinding."""
    return f"{job}-trainer"


def token(job: str) -> str:
    """Secret holding the job's data-plane token (key ``token``; created once, never rotated)."""
    return f"{job}-token"


def fetch_prefix(job: str) -> str:
    """The fetch Jobs' names: this prefix and a hash of the Job's spec (``builders.fetch``)."""
    return f"{job[:40]}-fetch-"


def checkpoints(job: str) -> str:
    """Checkpoint PersistentVolumeClaim (unless ``spec.checkpoint.existingClaim``)."""
    return f"{job}-checkpoints"


def workload(job: str, uid: str) -> str:
    """The Kueue Workload of a queued job (the uid's first characters tell a recreated job's apart)."""
    return f"rftjob-{job}-{uid.replace('-', '')[:5]}".rstrip("-")


def all_names(job: str) -> list[str]:
    """Every child name of a job (used by the name-length test)."""
    return [config(job), progress(job), inference(job), inference_pods(job), reward(job), rollout(job), trainer(job),
            checkpoints(job), token(job)]


def labels(job: str, role: str) -> dict[str, str]:
    """Labels on every child (and every pod) of ``job`` in ``role``."""
    return {
        LABEL_NAME: APP_NAME,
        LABEL_INSTANCE: job,
        LABEL_ROLE: role,
        LABEL_MANAGED_BY: MANAGED_BY,
    }


def selector(job: str, role: str) -> dict[str, str]:
    """The (immutable) pod selector of a role's workload."""
    return {LABEL_INSTANCE: job, LABEL_ROLE: role}


def job_selector(job: str) -> str:
    """Label selector (string form) matching every child of ``job``."""
    return f"{LABEL_INSTANCE}={job},{LABEL_MANAGED_BY}={MANAGED_BY}"
