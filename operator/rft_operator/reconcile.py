"""``reconcile``: one level-triggered pass over one RFTJob.

validate → observe children → plan → apply desired children (server-side apply) → delete children
that should not exist → compute status from what the API server answered → write status once, only
if it changed → emit Events for the transitions. Called for every trigger (create, update, resume,
the periodic resync, a child's event); it looks only at the current state, never at what triggered it.

The children (and the pods of the job's workloads) are given by the caller from its watch cache
(``Controller``); without them they are listed. A desired child whose ``rft.dev/applied-hash``
equals the observed child's is not applied again, so reconciling an unchanged job makes no request.
The checkpoint claim is never deleted by a reconcile (only the garbage collector deletes it, with
the job); a retained one stays retained when a job of the same name adopts it (:func:`claim_retained`).
A ``checkpoint.existingClaim`` is marked as used by one live job at a time (:func:`claim_hold`,
``policies.claim``). The token Secret is minted once; missing while the job has workloads, it is
minted anew and its digest on every pod template restarts every role (:func:`ensure_token`). A child
the API server refuses as too large ends the job ValidationFailed (:func:`too_large`).
"""
from __future__ import annotations

import datetime as dt
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any, Optional

from rft_api.constants import TERMINAL_PHASES
from rft_api.job import InvalidSpec, RFTJob, parse_manifest
from rft_api.status import RFTJobStatus

from . import names
from .builders import BuildContext, config_hash, desired_children, key_of, stamp, workload_children
from .builders import secret as secret_builder
from .builders.common import Site
from .builders.workload import Placement, workload_for
from .events import JobEvent, event_object, transition_events
from .kube import Kube, KubeError, child_kinds
from .observe import Observed, observe
from .plan import Plan, TrainerStep, make_plan
from .policies import admission, claim, inputs
from .policies.admission import Hold
from .policies.suspend import WORKLOAD_KINDS
from .status import compute_status, status_dict, validation_failed_status
from .timeutil import format_time
from .timeutil import now as utcnow

log = logging.getLogger(__name__)
Obj = dict[str, Any]
REQUEUE_SOON_S = 1.0


@dataclass
class Outcome:
    """What one reconcile did."""

    phase: Optional[str] = None
    applied: list[tuple[str, str]] = field(default_factory=list)
    deleted: list[tuple[str, str]] = field(default_factory=list)
    status_written: bool = False
    events: list[JobEvent] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    requeue_after: Optional[float] = None
    skipped: str = ""
    current: dict[tuple[str, str], Obj] = field(default_factory=dict)
    """The job's children after this pass (applied ones as the API server answered; deleted ones
    absent)."""
    status_obj: Optional[Obj] = None
    """The RFTJob as the status write returned it (None when not written)."""
    token: Optional[Obj] = None
    """The job's token Secret when this pass learnt of it (read or created), without its data: the
    caller's cache keeps it so later passes neither read nor create it again."""
    token_created: bool = False
    refused: str = ""
    """A child the API server refused as too large (:func:`too_large`): the spec can never run, and the
    job ends ValidationFailed with reason ``ConfigTooLarge``."""
    token_recreated: bool = False
    """The token Secret was missing while the job had workloads: a new token was minted, and the new
    digest on every pod template restarts every role with it."""


def parse_status(raw: Optional[Obj]) -> Optional[RFTJobStatus]:
    """The stored status, or None when absent or unreadable (it is then rewritten)."""
    if not raw:
        return None
    try:
        return RFTJobStatus.model_validate(raw)
    except ValueError:
        return None


def parse_job(job_obj: Obj) -> RFTJob:
    """The RFTJob with its validated spec and previous status; raises InvalidSpec naming the fields."""
    job = parse_manifest(job_obj)
    return job.model_copy(update={"status": parse_status(job_obj.get("status"))})


def controlled_by(obj: Obj, uid: Optional[str]) -> bool:
    """Whether ``obj``'s controller owner reference is the RFTJob with ``uid``."""
    return any(r.get("uid") == uid and r.get("controller") for r in obj["metadata"].get("ownerReferences") or [])


def retained_for(obj: Obj, uid: Optional[str]) -> bool:
    """Whether ``obj`` is the retained checkpoint claim of the RFTJob with ``uid`` (no owner reference)."""
    return obj.get("kind") == "PersistentVolumeClaim" and bool(uid) and \
        (obj["metadata"].get("annotations") or {}).get(names.ANNOTATION_RETAINED_FOR) == uid


def belongs_to(obj: Obj, uid: Optional[str]) -> bool:
    """Whether ``obj`` is a child of the RFTJob with ``uid``: controlled by it, or its retained claim."""
    return controlled_by(obj, uid) or retained_for(obj, uid)


def owned_children(api: Kube, job_obj: Obj, kueue: bool = False) -> list[Obj]:
    """The job's children, listed: labelled as its, and controlled by this very RFTJob (uid)."""
    meta = job_obj["metadata"]
    return [obj for kind in child_kinds(kueue) for obj in api.list(kind, meta.get("namespace"), names.job_selector(meta["name"]))
            if belongs_to(obj, meta.get("uid"))]


def job_pods(api: Kube, job_obj: Obj) -> list[Obj]:
    """The pods of the job's workloads, listed (they carry the job's labels)."""
    meta = job_obj["metadata"]
    return api.list("Pod", meta.get("namespace"), names.job_selector(meta["name"]))


def applied_hash(obj: Optional[Obj]) -> str:
    return ((obj or {}).get("metadata", {}).get("annotations") or {}).get(names.ANNOTATION_APPLIED_HASH, "")


def restart_cause(observed: Observed) -> str:
    """What the trainer's failed pods or Job reported (for the TrainerRestarted event)."""
    t = observed.trainer
    if observed.trainer_messages:
        return "; ".join(observed.trainer_messages)[:512]
    if t is not None and t.failed_condition:
        return f"{t.reason}: {t.message}".strip(": ")[:512]
    return ""


def _write_status(api: Kube, job_obj: Obj, new: RFTJobStatus, outcome: Outcome, cause: str = "") -> None:
    prev = parse_status(job_obj.get("status"))
    if prev is not None and status_dict(prev) == status_dict(new) and job_obj.get("status") is not None:
        return
    meta = job_obj["metadata"]
    outcome.status_obj = api.replace_status("RFTJob", meta.get("namespace"), meta["name"], status_dict(new))
    outcome.status_written = True
    outcome.events = transition_events(prev, new, cause)


def _emit(api: Kube, job_obj: Obj, outcome: Outcome, now: str) -> None:
    for ev in outcome.events:
        try:
            api.create(event_object(job_obj, ev, now))
        except KubeError as e:  # an Event is best effort; the status already says it
            log.warning("could not post event %s for %s: %s", ev.reason, job_obj["metadata"]["name"], e)


def _reconcile_invalid(api: Kube, job_obj: Obj, observed_objs: list[Obj], err: InvalidSpec, now: dt.datetime,
                       outcome: Outcome) -> Outcome:
    meta = job_obj["metadata"]
    for obj in observed_objs:
        if obj["kind"] in WORKLOAD_KINDS:
            if api.delete(obj["kind"], meta.get("namespace"), obj["metadata"]["name"], uid=obj["metadata"].get("uid")):
                outcome.deleted.append(key_of(obj))
    status = validation_failed_status(job_obj.get("status"), str(err), meta.get("generation"), format_time(now))
    outcome.phase = status.phase
    _write_status(api, job_obj, status, outcome)
    _emit(api, job_obj, outcome, format_time(now))
    return outcome


def _apply_all(api: Kube, desired: list[Obj], current: dict[tuple[str, str], Obj], outcome: Outcome) -> None:
    """Server-side apply each desired child that differs from the observed one (by applied hash);
    record what the API server answered in ``current``."""
    for obj in desired:
        if applied_hash(current.get(key_of(obj))) == applied_hash(obj):
            continue
        if outcome.refused and obj["kind"] in WORKLOAD_KINDS:
            continue  # its pods would read a config that is not there
        try:
            current[key_of(obj)] = api.apply(obj)
            outcome.applied.append(key_of(obj))
        except KubeError as e:
            if e.transient and not too_large(e):
                raise
            outcome.errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {e}")
            if too_large(e):
                outcome.refused = outcome.refused or (
                    f"the API server refuses {obj['kind']} {obj['metadata']['name']} as too large ({e}): the rendered "
                    "config (the evaluator config, the chat template, the data sources) must fit a ConfigMap's 1 MiB; "
                    "shrink it (e.g. put large evaluator data on a volume) and create the job again")


TOO_LARGE_FRAGMENTS = ("too long: must have at most", "request entity too large", "request is too large",
                       "exceeds the maximum")
"""What the API server (or etcd behind it) says of an object over its size limit: a ConfigMap's data over
1 MiB (422 ``Too long: must have at most 1048576 bytes``), a request body over 3 MiB (413), etcd's
``request is too large``. A retry sends the same object: the job cannot run."""


def too_large(e: KubeError) -> bool:
    """The API server refused an object as too large (:data:`TOO_LARGE_FRAGMENTS`, or status 413)."""
    return e.status == 413 or any(f in f"{e.reason} {e.message}".lower() for f in TOO_LARGE_FRAGMENTS)


def _delete_unwanted(api: Kube, namespace: str, observed: list[Obj], keep: set[tuple[str, str]],
                     current: dict[tuple[str, str], Obj], outcome: Outcome) -> None:
    """Delete every observed child not in ``keep`` (only that very object: uid precondition)."""
    for obj in observed:
        key = key_of(obj)
        if key in keep or obj["kind"] == "PersistentVolumeClaim":  # checkpoints: only GC deletes them
            continue
        if obj["metadata"].get("deletionTimestamp"):
            continue  # already being deleted
        # a Job in the foreground: it exists until its pods are gone (a trainer writes its checkpoint)
        propagation = "Foreground" if obj["kind"] == "Job" else "Background"
        if api.delete(obj["kind"], namespace, key[1], propagation=propagation, uid=obj["metadata"].get("uid")):
            outcome.deleted.append(key)
        current.pop(key, None)


TOKEN_BYTES = 32


def _without_data(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    keep = ("name", "namespace", "uid", "resourceVersion", "labels", "annotations", "ownerReferences",
            "creationTimestamp")
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {k: meta[k] for k in keep if k in meta}}


def ensure_token(api: Kube, job: RFTJob, current: dict[tuple[str, str], Obj], outcome: Outcome,
                 missing: bool = False) -> bool:
    """Make sure Secret ``<job>-token`` exists and is this job's; create it (once, with a fresh random
    token) when it does not. Known from the caller's cache: no request, unless ``missing`` (a pod
    reported the Secret not found: it is read again). Returns whether the job has its token (else
    ``outcome.errors`` says why). The token's value is never logged nor put in an error: errors carry
    the API server's status and reason only. An operator restart reads the existing Secret and never
    mints another token while it exists."""
    key = ("Secret", names.token(job.name))
    if missing:
        current.pop(key, None)
    if key in current:
        return True
    try:
        found = api.get("Secret", job.namespace, key[1])
        if found is None:
            try:
                found = api.create(secret_builder.token_secret(job, secrets.token_urlsafe(TOKEN_BYTES)))
                outcome.token_created = True
            except KubeError as e:
                if not e.conflict:  # created by a concurrent pass: read it below
                    raise
                found = api.get("Secret", job.namespace, key[1])
    except KubeError as e:
        if e.transient:
            raise
        outcome.errors.append(f"Secret/{key[1]}: {e.status} {e.reason}")
        return False
    if found is None:  # deleted between create and get: the next pass creates it
        outcome.errors.append(f"Secret/{key[1]}: not found after create")
        return False
    if not controlled_by(found, job.metadata.get("uid")):
        outcome.errors.append(f"Secret/{key[1]} exists and is not controlled by this RFTJob: its pods would take "
                              "their data-plane token from it, so no workload is created; delete it and the "
                              "operator creates the job's own")
        return False
    current[key] = outcome.token = _without_data(found)
    return True


def token_digest(current: dict[tuple[str, str], Obj], job: RFTJob) -> str:
    """The ``rft.dev/token-digest`` of the job's token Secret as known ("" when none)."""
    secret = current.get(("Secret", names.token(job.name))) or {}
    return ((secret.get("metadata") or {}).get("annotations") or {}).get(names.ANNOTATION_TOKEN_DIGEST, "")


def _token_step(api: Kube, job: RFTJob, observed: Observed, observed_objs: list[Obj], current: dict[tuple[str, str], Obj],
                outcome: Outcome) -> bool:
    """:func:`ensure_token`, noting a token minted anew while the job had workloads (its Secret was
    deleted): the Event that says every role restarts with the new token."""
    ok = ensure_token(api, job, current, outcome, missing=observed.token_missing)
    if outcome.token_created and any(o["kind"] in WORKLOAD_KINDS for o in observed_objs):
        outcome.token_recreated = True
    return ok


def key_of_claim(job: RFTJob) -> tuple[str, str]:
    return "PersistentVolumeClaim", names.checkpoints(job.name)


def claim_adopted(job: RFTJob) -> JobEvent:
    """The Event of a retained claim adopted by a job of the same name (it stays retained)."""
    return JobEvent("Normal", "ClaimAdopted",
                    f"PersistentVolumeClaim {names.checkpoints(job.name)}, retained by an earlier RFTJob of this "
                    "name (checkpoint.retainOnDelete), is adopted and stays retained: deleting this job keeps it")


TOKEN_RECREATED = JobEvent("Warning", "TokenRecreated",
                           "the job's token Secret was missing while its roles ran: a new token was minted and "
                           "every role restarts with it (the trainer resumes from its latest checkpoint), so all "
                           "pods keep sharing one token")


def claim_retained(api: Kube, job: RFTJob, observed_objs: list[Obj], children: Optional[list[Obj]]) -> tuple[bool, bool]:
    """Whether the job's checkpoint claim, as it exists, is retained (``rft.dev/retained-for``), and
    whether it is retained for another uid (a job of the same name that was deleted: this pass adopts
    it). Read from the observed children, else from the caller's cache, else one GET."""
    if job.spec.checkpoint.existing_claim:
        return False, False
    key = ("PersistentVolumeClaim", names.checkpoints(job.name))
    claim = next((o for o in observed_objs if key_of(o) == key), None)
    if claim is None:
        claim = next((o for o in children if key_of(o) == key), None) if children is not None else \
            api.get(key[0], job.namespace, key[1])
    uid = ((claim or {}).get("metadata", {}).get("annotations") or {}).get(names.ANNOTATION_RETAINED_FOR)
    return uid is not None, uid is not None and uid != job.metadata.get("uid")


def template_hash(job: RFTJob, ctx: BuildContext, cfg_hash: str) -> str:
    """The template hash of the trainer Job of ``ctx.trainer_attempt`` (as :func:`desired_children` stamps it)."""
    (obj,) = stamp(workload_children(job, ctx, deployments=False), cfg_hash)
    return obj["metadata"]["annotations"][names.ANNOTATION_TEMPLATE_HASH]


@dataclass
class Gate:
    """What Kueue's admission allows a queued job (``policies.admission``); nothing for other jobs."""

    hold: Optional[Hold] = None
    workload: Optional[Obj] = None
    """The desired Workload (None when the job is not queued, or its priority class is missing)."""
    observed: Optional[Obj] = None
    """The job's Workload as observed."""
    placements: tuple[tuple[str, Placement], ...] = ()
    requeue: bool = False
    """The observed Workload holds an admission for other pod sets than the job's: the job is held
    and, once its pods are gone, the Workload is deleted and a new one queued."""


def _admission(api: Kube, job: RFTJob, observed_objs: list[Obj], kueue: bool) -> Gate:
    queue = (job.metadata.get("labels") or {}).get(names.LABEL_QUEUE_NAME)
    if not queue:
        return Gate()
    if not kueue:
        return Gate(hold=Hold(admission.NOT_QUEUEABLE,
                              f"metadata.labels[{names.LABEL_QUEUE_NAME}] is {queue!r}, but this operator runs "
                              "without the Kueue integration (Helm value kueue.enabled): the job waits unadmitted"))
    observed = next((o for o in observed_objs if o["kind"] == "Workload"), None)
    priority = None
    pclass = (job.metadata.get("labels") or {}).get(names.LABEL_PRIORITY_CLASS)
    if pclass:
        wpc = api.get("WorkloadPriorityClass", None, pclass)
        if wpc is None:
            return Gate(hold=Hold(admission.QUEUED, f"metadata.labels[{names.LABEL_PRIORITY_CLASS}]: "
                                                    f"WorkloadPriorityClass {pclass!r} does not exist"),
                        observed=observed)
        priority = (pclass, int(wpc.get("value", 0)))
    (desired,) = stamp([workload_for(job, workload_children(job, BuildContext()), priority)], "")
    if observed is not None and applied_hash(observed) != applied_hash(desired) \
            and (observed.get("status") or {}).get("admission"):
        return Gate(hold=Hold(admission.QUEUED, "the job's pod sets changed after Kueue admitted them: the job "
                                                "stops and is queued again with a new Workload"),
                    workload=desired, observed=observed, requeue=True)
    gate = Gate(hold=admission.hold(queue, observed), workload=desired, observed=observed)
    if gate.hold is None:
        flavors: dict[str, Obj] = {}
        placements = []
        for role, names_ in sorted(admission.assignments(observed).items()):
            objs = []
            for fname in names_:
                if fname not in flavors:
                    flavors[fname] = api.get("ResourceFlavor", None, fname) or {}
                objs.append(flavors[fname])
            placements.append((role, Placement.of_flavors(objs)))
        gate.placements = tuple(placements)
    return gate


def claim_hold(api: Kube, job: RFTJob) -> Optional[Hold]:
    """Mark the job's ``checkpoint.existingClaim`` as used by it, or hold the job while another live
    job uses it; release the mark once the job is terminal (``policies.claim``). A patch that races
    another job's (409) holds the job until the next pass reads the winner."""
    name = job.spec.checkpoint.existing_claim
    if not name:
        return None
    pvc = api.get("PersistentVolumeClaim", job.namespace, name)
    if pvc is None:
        return None  # the pods say the claim is missing
    mine, held_by = claim.mark(job.name, job.metadata.get("uid", "")), claim.holder(pvc)
    terminal = job.status is not None and job.status.phase in TERMINAL_PHASES
    if terminal or (held_by is not None and claim.mark(*held_by) == mine):
        if terminal and held_by is not None and claim.mark(*held_by) == mine:
            _patch_claim(api, job, pvc, None)
        return None
    if held_by is not None and claim.live(api.get("RFTJob", job.namespace, held_by[0]), held_by[1]):
        return claim.in_use(name, held_by[0])
    return None if _patch_claim(api, job, pvc, mine) else claim.in_use(name, "another job (marked just now)")


def _patch_claim(api: Kube, job: RFTJob, pvc: Obj, value: Optional[str]) -> bool:
    """Set or remove the claim's mark; False when another writer changed the claim first (409)."""
    try:
        api.patch("PersistentVolumeClaim", job.namespace, pvc["metadata"]["name"], claim.mark_patch(pvc, value))
        return True
    except KubeError as e:
        if e.conflict:
            return False
        raise


def _settle_workload(api: Kube, job: RFTJob, gate: Gate, phase: Optional[str], message: str,
                     current: dict[tuple[str, str], Obj], pod_objs: list[Obj], now: dt.datetime,
                     outcome: Outcome) -> None:
    """Kueue's side of the job's state: release an evicted (or requeued) Workload's quota once the
    role pods are gone; mark it Finished when the job is terminal."""
    wl = gate.observed
    if wl is None:
        return
    name = wl["metadata"]["name"]
    pods_gone = not pod_objs and not any(k[0] in WORKLOAD_KINDS for k in current)
    if phase in TERMINAL_PHASES:
        patch = admission.finished_patch(wl, phase == "Succeeded", message, format_time(now))
        if patch is not None:
            api.patch("Workload", job.namespace, name, patch, subresource="status")
    elif gate.requeue and pods_gone:
        if api.delete("Workload", job.namespace, name, uid=wl["metadata"].get("uid")):
            outcome.deleted.append(key_of(wl))
            current.pop(key_of(wl), None)
            outcome.requeue_after = REQUEUE_SOON_S
    elif admission.must_release(wl) and pods_gone:
        current[key_of(wl)] = api.patch("Workload", job.namespace, name,
                                        admission.release_patch(wl, format_time(now)), subresource="status")


def _keep(job: RFTJob, desired: list[Obj], observed_objs: list[Obj], token_ok: bool, plan: Plan, gate: Gate
          ) -> set[tuple[str, str]]:
    """The children this pass keeps: the desired ones, the token Secret, the workloads while the token
    is not the job's, everything but workloads when the plan is not stateful, the trainer Job the
    plan keeps, the observed Workload (a requeued one goes only once the pods are gone)."""
    keep = {key_of(o) for o in desired} | {("Secret", names.token(job.name))}
    if not token_ok:
        keep |= {key_of(o) for o in observed_objs if o["kind"] in WORKLOAD_KINDS}
    if not plan.stateful:
        keep |= {key_of(o) for o in observed_objs if o["kind"] not in WORKLOAD_KINDS}
    if plan.trainer == TrainerStep.KEEP:
        keep.add(("Job", names.trainer(job.name)))
    if gate.observed is not None:
        keep.add(key_of(gate.observed))
    return keep


def reconcile(api: Kube, job_obj: Obj, *, now: Optional[dt.datetime] = None,
              children: Optional[list[Obj]] = None, pods: Optional[list[Obj]] = None,
              kueue: bool = False, dns_ports: Optional[tuple[int, ...]] = None,
              dns_cidrs: tuple[str, ...] = (), site: Site = Site()) -> Outcome:
    """Bring one RFTJob's children and status in line with its spec (idempotent).

    ``children`` and ``pods``: the job's children and pods as the caller's watch cache holds them
    (listed when None). ``Outcome.current`` holds the children as they are after this pass.
    ``dns_ports``: where the cluster's DNS pods listen (default :class:`BuildContext`'s); ``dns_cidrs``:
    DNS servers that are not pods. ``site``: the operator's default images and scrape peers.
    Transient API errors propagate (the caller retries with backoff); a child the API server refuses
    (e.g. an immutable field changed) is reported in ``Outcome.errors`` and the rest proceeds.
    """
    now = now or utcnow()
    outcome = Outcome()
    meta = job_obj["metadata"]
    if meta.get("deletionTimestamp"):
        outcome.skipped = "being deleted: the garbage collector removes the children"
        return outcome
    observed_objs = owned_children(api, job_obj, kueue) if children is None else \
        [o for o in children if belongs_to(o, meta.get("uid"))]
    outcome.current = {key_of(o): o for o in observed_objs}
    try:
        job = parse_job(job_obj)
    except InvalidSpec as e:
        return _reconcile_invalid(api, job_obj, observed_objs, e, now, outcome)

    pod_objs = job_pods(api, job_obj) if pods is None else pods
    observed = observe(job.name, [*observed_objs, *pod_objs], now)
    persisted_restarts = job.status.restarts if job.status else 0
    cfg_hash = config_hash(job, BuildContext(trainer_attempt=persisted_restarts))
    gate = _admission(api, job, observed_objs, kueue)
    if gate.hold is None:
        gate.hold = claim_hold(api, job)
    first = compute_status(job, observed, cfg_hash, gate.hold)
    current = outcome.current
    token_ok = True
    if first.phase != "ValidationFailed":  # plan.stateful; before the workloads: their pods read the token
        token_ok = _token_step(api, job, observed, observed_objs, current, outcome)
    retained, adopted = claim_retained(api, job, observed_objs, children)
    ctx = BuildContext(trainer_attempt=persisted_restarts, placements=gate.placements,
                       dns_ports=dns_ports or BuildContext.dns_ports, dns_cidrs=dns_cidrs,
                       token_digest=token_digest(current, job), retained_claim=retained,
                       runtime_image=site.runtime_image, vllm_image=site.vllm_image, scrape_from=site.scrape_from,
                       image_pull_policy=site.image_pull_policy, image_pull_secrets=site.image_pull_secrets)
    trainer_hash = template_hash(job, ctx, cfg_hash)
    plan = make_plan(job.spec.suspend or gate.hold is not None, first.phase, observed, persisted_restarts, trainer_hash,
                     inputs.state(job.spec, observed), first.trainer_disruption)

    desired = desired_children(job, ctx, deployments=plan.deployments, trainer_job=plan.trainer == TrainerStep.APPLY,
                               fetch_job=plan.fetch) if plan.stateful else []
    if gate.workload is not None and plan.stateful and not gate.requeue:
        desired.insert(0, gate.workload)
    if not token_ok:  # no new workload whose pods would read a token that is not the job's
        desired = [o for o in desired if o["kind"] not in WORKLOAD_KINDS]
    _apply_all(api, desired, current, outcome)
    _delete_unwanted(api, job.namespace, observed_objs, _keep(job, desired, observed_objs, token_ok, plan, gate),
                     current, outcome)

    final = compute_status(job, observe(job.name, [*current.values(), *pod_objs], now), cfg_hash, gate.hold)
    _settle_workload(api, job, gate, final.phase, final.message, current, pod_objs, now, outcome)
    if outcome.errors:
        final = final.model_copy(update={"message": f"{final.message}; not applied: {'; '.join(outcome.errors)}"[:4096]})
    if outcome.refused:
        final = validation_failed_status(job_obj.get("status"), outcome.refused, meta.get("generation"),
                                         format_time(now), reason="ConfigTooLarge")
    outcome.phase = final.phase
    _write_status(api, job_obj, final, outcome, restart_cause(observed))
    if outcome.status_written:  # once per distinct error, not once per resync
        outcome.events += [JobEvent("Warning", "ApplyFailed", err) for err in outcome.errors]
    outcome.events += ([TOKEN_RECREATED] if outcome.token_recreated else []) + \
        ([claim_adopted(job)] if adopted and key_of_claim(job) in outcome.applied else [])
    _emit(api, job_obj, outcome, format_time(now))
    if plan.trainer == TrainerStep.DELETE or (job.status is not None and (
            final.phase != job.status.phase or final.restarts != job.status.restarts)):
        outcome.requeue_after = REQUEUE_SOON_S
    return outcome
