"""What the operator sees of a job's children, extracted from the Kubernetes objects (pure functions).

``Observed`` is the input of :func:`rft_operator.status.compute_status` and of the reconcile plan; it
is built from plain object dicts (as listed from, or returned by, the API server), so tests build it
from literal dicts.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

from rft_api.progress import Progress, ProgressError, parse

from . import names
from .timeutil import parse_time

Obj = dict[str, Any]


@dataclass(frozen=True)
class WorkloadObs:
    """A role's Deployment."""

    name: str
    desired: int
    ready: int
    config_hash: str = ""
    """``rft.dev/config-hash`` of its pod template."""
    rolled: bool = True
    """The Deployment controller has seen its current spec and no pod of an older template is left."""


@dataclass(frozen=True)
class TrainerObs:
    """The trainer Job."""

    name: str
    attempt: int
    desired: int
    active: int = 0
    ready: int = 0
    succeeded: int = 0
    failed: int = 0
    complete: bool = False
    failed_condition: bool = False
    reason: str = ""
    message: str = ""
    terminating: bool = False
    pods_gone: bool = True
    """No pod of the Job is active or terminating (a pod may still write its SIGTERM checkpoint)."""
    config_hash: str = ""
    template_hash: str = ""
    uid: str = ""

    @property
    def finished(self) -> bool:
        return self.complete or self.failed_condition

    @property
    def terminal_failure(self) -> bool:
        """Failed by its pod failure policy: the trainer exited with the terminal status (retrying
        cannot help)."""
        return self.failed_condition and self.reason == "PodFailurePolicy"


@dataclass(frozen=True)
class PodProblem:
    """A pod of the job that cannot start, or whose container ended with a message."""

    role: str
    pod: str
    container: str
    reason: str
    message: str
    sandbox: bool = False
    """The cause is the code sandbox's isolation: the reward container's seccomp profile cannot be
    loaded on the node, or the reward server's isolation probe failed at start."""


@dataclass(frozen=True)
class CrashLoop:
    """A container of a Deployment role that the kubelet restarts in a loop (``CrashLoopBackOff``)."""

    role: str
    pod: str
    container: str
    restarts: int
    """The container's ``restartCount``."""
    looping_s: float
    """Seconds since the pod's containers stopped being ready (:func:`waiting_since`)."""
    message: str
    """The last termination's reason, exit code and message (its last lines)."""

    @property
    def beyond_grace(self) -> bool:
        """Looping past :data:`CRASHLOOP_RESTART_LIMIT` restarts or :data:`CRASHLOOP_GRACE_S` seconds."""
        return self.restarts >= CRASHLOOP_RESTART_LIMIT or self.looping_s >= CRASHLOOP_GRACE_S

    def describe(self) -> str:
        return (f"{self.role} pod {self.pod} container {self.container} is in CrashLoopBackOff "
                f"({self.restarts} restarts): {self.message}")


@dataclass(frozen=True)
class Pending:
    """A pod of the job the scheduler cannot place, or a role's Deployment whose pods cannot be created
    (a ResourceQuota, a LimitRange, an admission webhook): what the job's status tells while it waits."""

    role: str
    what: str
    """The pod, or the Deployment."""
    reason: str
    """``Unschedulable``, ``QuotaExceeded`` or ``FailedCreate``."""
    message: str
    """The scheduler's or the controller's words."""

    def describe(self) -> str:
        return f"{self.role} {self.what} is {self.reason}: {self.message}"


@dataclass(frozen=True)
class ClaimObs:
    """The job's own checkpoint claim (``<job>-checkpoints``) while it is not bound."""

    name: str
    pending_s: float
    """Seconds since the claim was created."""
    why: str = ""
    """Why binding is due and has not happened: the scheduler's message of a pod that waits on the
    unbound claim, or that a node was selected for it (``WaitForFirstConsumer``); empty while the claim
    merely waits for its first consumer (a pod not yet scheduled for other reasons)."""

    @property
    def beyond_grace(self) -> bool:
        """Binding was due and the claim stayed unbound :data:`CLAIM_BIND_GRACE_S` seconds."""
        return bool(self.why) and self.pending_s >= CLAIM_BIND_GRACE_S

    def describe(self) -> str:
        return (f"checkpoint claim {self.name} is not bound after {int(self.pending_s)}s: {self.why} (kubectl describe "
                f"pvc {self.name} shows the provisioner's ProvisioningFailed events)")


@dataclass(frozen=True)
class Observed:
    """A job's children as last seen, plus the time of the observation."""

    now: dt.datetime
    workloads: Mapping[str, WorkloadObs] = field(default_factory=dict)
    trainer: Optional[TrainerObs] = None
    progress: Optional[Progress] = None
    progress_error: Optional[str] = None
    children: frozenset[tuple[str, str]] = frozenset()
    """(kind, name) of every child seen."""
    pod_problems: tuple[PodProblem, ...] = ()
    """Pods that cannot start (image pull, invalid image, config errors)."""
    trainer_messages: tuple[str, ...] = ()
    """Termination messages of the trainer's failed containers (their last log lines)."""
    fetch: Optional[TrainerObs] = None
    """The fetch Job of the job's hf:// and s3:// inputs (``builders.fetch``), when there is one."""
    fetch_messages: tuple[str, ...] = ()
    """What the fetch pods' containers said as they ended (``rft fetch``'s summary or error), newest last."""
    pulls: tuple[PodProblem, ...] = ()
    """Containers waiting on an image pull error still within :data:`PULL_ERROR_GRACE_S` (not yet a
    pod problem): the status says the job waits on them."""
    trainer_disruptions: tuple[str, ...] = ()
    """Trainer pods with a ``DisruptionTarget`` condition (evicted, preempted, their node drained or
    tainted), each as ``pod: reason: message``."""
    trainer_disrupted_jobs: tuple[str, ...] = ()
    """The uids of the trainer Jobs those pods belong to (:func:`owner_job`), in the same order."""
    crashloops: tuple[CrashLoop, ...] = ()
    """Containers of the Deployment roles (inference, reward, rollout) waiting in ``CrashLoopBackOff``
    (:func:`crash_looping`), ordered by role and pod."""
    claim: Optional[ClaimObs] = None
    """The job's checkpoint claim when it exists and is not bound (:func:`observe_claim`)."""
    pending: tuple[Pending, ...] = ()
    """Pods unscheduled for :data:`UNSCHEDULABLE_AFTER_S` or longer and Deployments whose pods cannot be
    created (:func:`unschedulable`, :func:`failed_create`), ordered by role."""
    token_missing: bool = False
    """A pod cannot start because the job's token Secret ``<job>-token`` is missing: the reconcile
    mints a new token and every role restarts with it (``reconcile.ensure_token``), it is no
    ``PodCannotStart``."""

    @property
    def any_children(self) -> bool:
        return bool(self.children)

    def rolled_out(self, config_hash: str) -> bool:
        """Every workload runs pods of the current config: each Deployment's template carries
        ``config_hash`` and has rolled; an unfinished trainer Job's template carries it (always true
        for ``""``)."""
        if not config_hash:
            return True
        if any(w.config_hash != config_hash or not w.rolled for w in self.workloads.values()):
            return False
        t = self.trainer
        return t is None or t.finished or t.config_hash == config_hash


def _cond(obj: Obj, ctype: str) -> Optional[Obj]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype and c.get("status") == "True":
            return c
    return None


def _template_hash(obj: Obj, key: str) -> str:
    return ((((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("annotations") or {}).get(key, "")


def observe_deployment(obj: Obj) -> WorkloadObs:
    """Desired and ready replicas of a Deployment, its template's config hash and whether it rolled."""
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    rolled = (int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 0)
              and int(status.get("replicas") or 0) == int(status.get("updatedReplicas") or 0))
    return WorkloadObs(name=meta["name"], desired=int(spec.get("replicas", 1) or 0),
                       ready=int(status.get("readyReplicas") or 0),
                       config_hash=_template_hash(obj, names.ANNOTATION_CONFIG_HASH), rolled=rolled)


def attempt_of(obj: Obj) -> int:
    """The trainer attempt recorded on a trainer Job (0 when absent or unreadable)."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(names.ANNOTATION_ATTEMPT, "0")
    try:
        return max(0, int(raw))
    except (TypeError, ValueError):
        return 0


def observe_job(obj: Obj) -> TrainerObs:
    """Pod counts and terminal conditions of the trainer Job.

    Only ``Failed`` with no pod left active or terminating is a failure: ``FailureTarget`` is set
    while the pods still run (one may be writing its SIGTERM checkpoint), and a new attempt must
    not start on the same checkpoint volume before they are gone."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    pods_gone = int(status.get("active") or 0) == 0 and int(status.get("terminating") or 0) == 0
    failed = _cond(obj, "Failed") if pods_gone else None
    complete = (_cond(obj, "Complete") or _cond(obj, "SuccessCriteriaMet")) if pods_gone else None
    terminal = failed or complete
    annotations = obj["metadata"].get("annotations") or {}
    return TrainerObs(
        name=obj["metadata"]["name"], attempt=attempt_of(obj), desired=int(spec.get("parallelism", 1) or 0),
        active=int(status.get("active") or 0), ready=int(status.get("ready") or 0),
        succeeded=int(status.get("succeeded") or 0), failed=int(status.get("failed") or 0),
        complete=complete is not None and failed is None, failed_condition=failed is not None,
        reason=(terminal or {}).get("reason", "") or "", message=(terminal or {}).get("message", "") or "",
        terminating=bool(obj["metadata"].get("deletionTimestamp")), pods_gone=pods_gone,
        config_hash=_template_hash(obj, names.ANNOTATION_CONFIG_HASH),
        template_hash=annotations.get(names.ANNOTATION_TEMPLATE_HASH, ""), uid=obj["metadata"].get("uid", "") or "",
    )


# Waiting reasons of a container that will not start without a change to the spec or the cluster.
CANNOT_START = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                "CreateContainerError")
# Of those, the two the kubelet also reports for causes it retries by itself: a Secret or ConfigMap it
# has not yet synced on a loaded node ("failed to sync secret cache", "... not registered"), or a
# container runtime slow to answer ("context deadline exceeded"). One of these is a pod that cannot start
# when its message names a permanent cause (:data:`PERMANENT_CREATE_ERRORS`), or once the pod's containers
# have waited :data:`CREATE_ERROR_GRACE_S` without becoming ready: a kubelet message worded in a way this
# list does not know delays the failure, it does not make one.
RETRIED_CREATE_ERRORS = ("CreateContainerConfigError", "CreateContainerError")
PERMANENT_CREATE_ERRORS = ("not found", "couldn't find key", "runAsNonRoot", "no such file or directory",
                           "seccomp")
"""Message fragments of a create error no retry can cure: a missing Secret, ConfigMap or key, a
securityContext the image cannot meet, a file the runtime needs (a seccomp profile) missing on the node."""
CREATE_ERROR_GRACE_S = 120.0
# The same for an image pull: the kubelet retries a pull with a back-off, and a registry may answer 429
# (rate limit), 5xx or time out for minutes. A pull error is a pod that cannot start when its message
# names a permanent cause (:data:`PERMANENT_PULL_ERRORS`), or once the pod's containers have waited
# :data:`PULL_ERROR_GRACE_S` without becoming ready. ``ErrImagePull``'s message is containerd's error;
# ``ImagePullBackOff``'s ("Back-off pulling image ...") names no cause on older kubelets, while newer ones
# append the last pull's error, so a permanent cause is seen at the first pull or in the back-off.
RETRIED_PULL_ERRORS = ("ErrImagePull", "ImagePullBackOff")
PERMANENT_PULL_ERRORS = ("not found", "manifest unknown", "repository does not exist", "unauthorized",
                         "authentication required", "denied", "invalid reference format")
"""Message fragments of a pull error no retry can cure, as containerd and the registries word them: an
image or tag that does not exist (``...: not found``, ``manifest unknown``), credentials missing or
refused (``401 Unauthorized``, ``authentication required``, ``pull access denied``), a malformed name."""
PULL_ERROR_GRACE_S = 600.0
"""How long a pod's containers may wait on a transient pull error (a registry answering 429 or 503)
before the job fails as PodCannotStart: longer than a rate limit's window of a minute or two."""
CLAIM_BIND_GRACE_S = 600.0
"""Seconds the job's checkpoint claim may stay unbound once binding is due (a pod waits on it, or a node
was selected for it) before the job fails as ``ClaimNotBound``: a provisioner creates a volume in
seconds to a minute or two; a StorageClass that does not exist, a cluster without a default one, or a
provisioner that keeps failing never binds it. A claim waiting for its first consumer while the pods wait
for capacity is not counted."""
UNBOUND_CLAIM = "unbound immediate persistentvolumeclaims"
"""What the scheduler's ``PodScheduled`` message says of a pod whose claim (Immediate binding) is unbound."""
SELECTED_NODE = "volume.kubernetes.io/selected-node"
"""The annotation the scheduler puts on a ``WaitForFirstConsumer`` claim once it picked a node for it."""
CRASHLOOP_ROLES = ("inference", "reward", "rollout")
"""The roles whose crash-looping containers the operator watches: their Deployments restart a crashing
container for ever, while the trainer waits for episodes that never come (a trainer's crash fails its
Job and spends a restart instead)."""
CRASHLOOP_RESTART_LIMIT = 5
"""Restarts (``restartCount``) of a container waiting in ``CrashLoopBackOff`` at which the job fails
as ``RoleCrashLooping``: with the kubelet's back-off (10 s doubling) five restarts take about five
minutes, time for a dependency that was briefly down (inference loading its model) to come back."""
CRASHLOOP_GRACE_S = 600.0
"""Seconds a container may crash-loop (its pod's containers not ready, waiting in ``CrashLoopBackOff``)
before the job fails as ``RoleCrashLooping``, whatever its restart count (a long-running container
that crashes after minutes reaches few restarts)."""
# ``rft reward`` exits with this code when its evaluators cannot be built: a bad evaluator config, or
# the code sandbox's isolation probe failed (runtime/rft_runtime/rewards/server.py). A restart builds
# the same evaluators on the same node, so it cannot help.
REWARD_CANNOT_START_EXIT = 2
# What the reward server's message starts with when the code sandbox is the evaluator that failed.
SANDBOX_MESSAGE = "code_sandbox:"


def _localhost_seccomp(obj: Obj, container: str) -> bool:
    """The container (or its pod) names a ``Localhost`` seccomp profile: a file on the node."""
    spec = obj.get("spec") or {}
    for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        if c.get("name") == container:
            prof = ((c.get("securityContext") or {}).get("seccompProfile")
                    or (spec.get("securityContext") or {}).get("seccompProfile") or {})
            return prof.get("type") == "Localhost"
    return False


def _parse_time(value: Any) -> Optional[dt.datetime]:
    """:func:`~.timeutil.parse_time` of a field that may be missing or malformed (None then)."""
    try:
        return parse_time(value) if isinstance(value, str) and value else None
    except ValueError:
        return None


def waiting_since(obj: Obj) -> Optional[dt.datetime]:
    """Since when the pod's containers have not been ready: its ``ContainersReady`` condition's last
    transition when that is ``False`` (a container that restarts waits from then), else the pod's start
    (the kubelet took it), else its creation."""
    status = obj.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "ContainersReady"), None)
    if ready is not None and ready.get("status") == "False":
        t = _parse_time(ready.get("lastTransitionTime"))
        if t is not None:
            return t
    return _parse_time(status.get("startTime")) or _parse_time((obj.get("metadata") or {}).get("creationTimestamp"))


def _retried(reason: str) -> Optional[tuple[tuple[str, ...], float]]:
    """The permanent message fragments and the grace of a waiting reason the kubelet retries (None
    for one it does not: that is a pod that cannot start at once)."""
    if reason in RETRIED_CREATE_ERRORS:
        return PERMANENT_CREATE_ERRORS, CREATE_ERROR_GRACE_S
    if reason in RETRIED_PULL_ERRORS:
        return PERMANENT_PULL_ERRORS, PULL_ERROR_GRACE_S
    return None


def _cannot_start(waiting: Obj, obj: Obj, now: dt.datetime) -> bool:
    """A container waiting for a reason in :data:`CANNOT_START` that a retry by the kubelet cannot cure
    (see :data:`RETRIED_CREATE_ERRORS` and :data:`RETRIED_PULL_ERRORS`)."""
    reason = waiting.get("reason")
    if reason not in CANNOT_START:
        return False
    retried = _retried(reason)
    if retried is None:
        return True
    permanent, grace = retried
    msg = (waiting.get("message") or "").lower()
    if any(m.lower() in msg for m in permanent):
        return True
    since = waiting_since(obj)
    return since is None or (now - since).total_seconds() >= grace


def observe_pod(obj: Obj, now: dt.datetime) -> tuple[list[PodProblem], list[str]]:
    """A pod's containers that cannot start, and the termination messages of its failed containers.

    A reward container is also one that cannot start when it exited with
    :data:`REWARD_CANNOT_START_EXIT` (now, or before its current restart back-off). Either is marked
    ``sandbox`` when the code sandbox's isolation is the cause: its Localhost seccomp profile cannot
    be loaded, or the server's message is the sandbox's."""
    meta, status = obj["metadata"], obj.get("status") or {}
    role = (meta.get("labels") or {}).get(names.LABEL_ROLE, "")
    problems: list[PodProblem] = []
    messages: list[str] = []
    if meta.get("deletionTimestamp"):
        return problems, messages
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        cname = cs.get("name", "")
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if _cannot_start(waiting, obj, now):
            msg = (waiting.get("message") or "")[:512]
            sandbox = role == "reward" and "seccomp" in msg.lower() and _localhost_seccomp(obj, cname)
            problems.append(PodProblem(role, meta["name"], cname, waiting["reason"], msg, sandbox))
        elif role == "reward":
            for st in ((cs.get("state") or {}).get("terminated"), (cs.get("lastState") or {}).get("terminated")):
                if st and st.get("exitCode") == REWARD_CANNOT_START_EXIT:
                    msg = (st.get("message") or "").strip()[-512:]
                    problems.append(PodProblem(role, meta["name"], cname, f"ExitedAtStart({st['exitCode']})",
                                               msg or "(no message)", SANDBOX_MESSAGE in msg))
                    break
        term = (cs.get("state") or {}).get("terminated") or {}
        if term.get("exitCode") not in (None, 0) and (term.get("message") or term.get("reason") not in (None, "Error")):
            why = f" ({term['reason']})" if term.get("reason") not in (None, "Error") else ""
            tail = f": {term['message'].strip()[-1024:]}" if term.get("message") else ""
            messages.append(f"{meta['name']}/{cs.get('name', '')} exited {term['exitCode']}{why}{tail}")
    return problems, messages


def pulling(obj: Obj, now: dt.datetime) -> list[PodProblem]:
    """A pod's containers waiting on a pull error the kubelet retries, still within the grace (see
    :data:`RETRIED_PULL_ERRORS`)."""
    meta = obj["metadata"]
    if meta.get("deletionTimestamp"):
        return []
    role = (meta.get("labels") or {}).get(names.LABEL_ROLE, "")
    status = obj.get("status") or {}
    out = []
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in RETRIED_PULL_ERRORS and not _cannot_start(waiting, obj, now):
            out.append(PodProblem(role, meta["name"], cs.get("name", ""), waiting["reason"],
                                  (waiting.get("message") or "")[:512]))
    return out


def _last_termination(cs: Obj) -> str:
    """``reason (exit N): message`` of a container's last termination (its message's last lines)."""
    term = (cs.get("lastState") or {}).get("terminated") or {}
    if not term:
        return "(no termination recorded)"
    msg = (term.get("message") or "").strip()[-512:]
    head = f"{term.get('reason') or 'Terminated'} (exit {term.get('exitCode')})"
    return f"{head}: {msg}" if msg else head


def crash_looping(obj: Obj, now: dt.datetime) -> list[CrashLoop]:
    """A pod's containers of a :data:`CRASHLOOP_ROLES` role waiting in ``CrashLoopBackOff``."""
    meta = obj["metadata"]
    role = (meta.get("labels") or {}).get(names.LABEL_ROLE, "")
    if role not in CRASHLOOP_ROLES or meta.get("deletionTimestamp"):
        return []
    since = waiting_since(obj)
    looping = (now - since).total_seconds() if since is not None else 0.0
    out = []
    for cs in (obj.get("status") or {}).get("containerStatuses") or []:
        if ((cs.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff":
            out.append(CrashLoop(role, meta["name"], cs.get("name", ""), int(cs.get("restartCount") or 0),
                                 looping, _last_termination(cs)))
    return out


def _scheduled(pod: Obj) -> Optional[Obj]:
    """The pod's ``PodScheduled`` condition (whatever its status)."""
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"), None)


def unbound_claim(pod: Obj) -> str:
    """The scheduler's message of a pod that cannot be scheduled because its claim is unbound, else ""."""
    c = _scheduled(pod)
    msg = (c or {}).get("message") or ""
    return msg[:512] if c and c.get("status") == "False" and UNBOUND_CLAIM in msg.lower() else ""


def observe_claim(obj: Optional[Obj], waiting: str, now: dt.datetime) -> Optional[ClaimObs]:
    """The checkpoint claim when it exists and is not bound; ``waiting``: a pod's :func:`unbound_claim`."""
    if obj is None or (obj.get("status") or {}).get("phase") == "Bound" or obj["metadata"].get("deletionTimestamp"):
        return None
    created = _parse_time(obj["metadata"].get("creationTimestamp"))
    node = (obj["metadata"].get("annotations") or {}).get(SELECTED_NODE)
    why = waiting or (f"the scheduler selected node {node} for it" if node else "")
    return ClaimObs(obj["metadata"]["name"], (now - created).total_seconds() if created else 0.0, why)


UNSCHEDULABLE_AFTER_S = 20.0
"""Seconds a pod may wait unscheduled before the job's status says so: the scheduler retries, and a
short wait (a node scaling up, a preemption in progress) is normal."""


def unschedulable(pod: Obj, now: dt.datetime) -> Optional[Pending]:
    """A pod of the job the scheduler has not placed for :data:`UNSCHEDULABLE_AFTER_S`, with its message
    (a pod waiting on the unbound checkpoint claim is left to :func:`observe_claim`)."""
    c = _scheduled(pod)
    if c is None or c.get("status") != "False" or c.get("reason") != "Unschedulable" or pod["metadata"].get("deletionTimestamp"):
        return None
    msg = (c.get("message") or "").strip()
    since = _parse_time(c.get("lastTransitionTime"))
    if UNBOUND_CLAIM in msg.lower() or (since is not None and (now - since).total_seconds() < UNSCHEDULABLE_AFTER_S):
        return None
    role = (pod["metadata"].get("labels") or {}).get(names.LABEL_ROLE, "")
    return Pending(role, f"pod {pod['metadata']['name']}", "Unschedulable", msg[:512] or "(no message)")


def failed_create(deployment: Obj) -> Optional[Pending]:
    """A Deployment whose ReplicaSet cannot create pods (its ``ReplicaFailure`` condition): ``QuotaExceeded``
    when a ResourceQuota refused them, else ``FailedCreate``."""
    c = _cond(deployment, "ReplicaFailure")
    if c is None:
        return None
    msg = (c.get("message") or "").strip()
    reason = "QuotaExceeded" if "exceeded quota" in msg.lower() else "FailedCreate"
    role = (deployment["metadata"].get("labels") or {}).get(names.LABEL_ROLE, "")
    return Pending(role, f"Deployment {deployment['metadata']['name']}", reason, msg[:512] or "(no message)")


def token_missing(obj: Obj, job_name: str) -> bool:
    """A container of the pod waits in ``CreateContainerConfigError`` because the job's token Secret
    does not exist (the kubelet's message names it)."""
    secret = f'"{names.token(job_name)}"'
    status = obj.get("status") or {}
    return any(_names_missing_token(cs, secret)
               for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []))


def _names_missing_token(cs: Obj, secret: str) -> bool:
    waiting = (cs.get("state") or {}).get("waiting") or {}
    msg = waiting.get("message") or ""
    return waiting.get("reason") == "CreateContainerConfigError" and secret in msg and "not found" in msg


def disruption(obj: Obj) -> Optional[str]:
    """``pod: reason: message`` of a pod's ``DisruptionTarget`` condition (status True), else None: the
    pod is being evicted, preempted or deleted by the taint manager, or the kubelet evicted it."""
    c = _cond(obj, "DisruptionTarget")
    if c is None:
        return None
    return f"{obj['metadata']['name']}: {c.get('reason') or 'DisruptionTarget'}: {c.get('message') or ''}".strip(": ")[:512]


def owner_job(pod: Obj) -> str:
    """The uid of the Job that owns ``pod``: its controller reference, else the Job controller's label."""
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "Job" and ref.get("controller"):
            return str(ref.get("uid") or "")
    return str((pod["metadata"].get("labels") or {}).get(JOB_UID_LABEL, ""))


JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
"""The label the Job controller puts on each of its pods: the Job's uid."""


def observe_progress(obj: Optional[Obj]) -> tuple[Optional[Progress], Optional[str]]:
    """The parsed progress record, or the reason it could not be parsed."""
    if obj is None:
        return None, None
    try:
        return parse(obj.get("data")), None
    except ProgressError as e:
        return None, str(e)


def observe(job_name: str, objects: Iterable[Obj], now: dt.datetime) -> Observed:
    """Fold a job's child objects (any kinds) into an :class:`Observed`."""
    workloads: dict[str, WorkloadObs] = {}
    trainer = None
    progress_obj = None
    children = set()
    problems: list[PodProblem] = []
    messages: list[str] = []
    fetch, fetch_said = None, []
    pulls: list[PodProblem] = []
    disrupted: list[tuple[str, str]] = []
    loops: list[CrashLoop] = []
    pending: list[Pending] = []
    no_token = False
    claim_obj, unbound = None, ""
    for obj in objects:
        kind, name = obj.get("kind", ""), obj["metadata"]["name"]
        role = (obj["metadata"].get("labels") or {}).get(names.LABEL_ROLE, "")
        if kind == "Pod":  # not a child (the controllers own pods), only what they tell
            p, m = observe_pod(obj, now)
            if token_missing(obj, job_name):  # not a pod problem: the reconcile mints a new token
                no_token = True
                p = [x for x in p if x.reason != "CreateContainerConfigError"]
            problems += p
            loops += crash_looping(obj, now)
            pending += [x for x in (unschedulable(obj, now),) if x]
            unbound = unbound or unbound_claim(obj)
            pulls += pulling(obj, now)
            if role == "trainer":
                messages += m
                disrupted += [(d, owner_job(obj)) for d in (disruption(obj),) if d]
            elif role == "fetch":
                fetch_said += _ended_with(obj)
            continue
        children.add((kind, name))
        if kind == "Deployment":
            workloads[role] = observe_deployment(obj)
            pending += [x for x in (failed_create(obj),) if x]
        elif kind == "Job" and name == names.trainer(job_name):
            trainer = observe_job(obj)
        elif kind == "Job" and name.startswith(names.fetch_prefix(job_name)):
            fetch = observe_job(obj)
        elif kind == "ConfigMap" and name == names.progress(job_name):
            progress_obj = obj
        elif kind == "PersistentVolumeClaim" and name == names.checkpoints(job_name):
            claim_obj = obj
    progress, error = observe_progress(progress_obj)
    disrupted.sort()
    return Observed(now=now, workloads=workloads, trainer=trainer, progress=progress, progress_error=error,
                    children=frozenset(children), pod_problems=tuple(sorted(problems, key=lambda p: (p.role, p.pod))),
                    trainer_messages=tuple(sorted(messages)), fetch=fetch,
                    fetch_messages=tuple(m for _, m in sorted(fetch_said)),
                    pulls=tuple(sorted(pulls, key=lambda p: (p.role, p.pod))), trainer_disruptions=tuple(d for d, _ in disrupted),
                    trainer_disrupted_jobs=tuple(u for _, u in disrupted),
                    crashloops=tuple(sorted(loops, key=lambda c: (c.role, c.pod, c.container))), token_missing=no_token,
                    pending=tuple(sorted(pending, key=lambda x: (x.role, x.what))),
                    claim=observe_claim(claim_obj, unbound, now))


def _ended_with(pod: Obj) -> list[tuple[str, str]]:
    """``(finishedAt, message)`` of each container of ``pod`` that ended with a termination message."""
    out = []
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or {}
        if term.get("message"):
            out.append((str(term.get("finishedAt") or ""), term["message"].strip()[-1024:]))
    return out
