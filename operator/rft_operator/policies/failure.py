"""Failure policy: the trainer restart budget, the active deadline, and an evaluator that always fails.

Restart budget (``spec.restartLimit``). The trainer Job runs with ``backoffLimit: 0``; the operator
owns restarts. Each trainer Job carries the attempt it belongs to (annotation
``rft.dev/trainer-attempt``), and ``status.restarts`` is the attempt that should run. The counting is
level-triggered and survives an operator crash at any point:

1. the Job of attempt ``restarts`` has failed and budget is left → ``status.restarts + 1`` is written
   (the failed Job is left alone in this reconcile);
2. a Job whose attempt is below ``status.restarts`` is stale → deleted;
3. no trainer Job → the Job of attempt ``status.restarts`` is created; its trainer resumes from the
   latest checkpoint.

When the Job of attempt ``restarts`` fails with no budget left (``restarts == restartLimit``) the job
is Failed with reason ``RestartLimitExceeded``.

A Job counts as failed only once it has the ``Failed`` condition *and* no pod is active or
terminating (``observe.observe_job``): a new attempt never shares the checkpoint volume with a pod
still writing its SIGTERM checkpoint. A Job being deleted is waited for (it is deleted in the
foreground, so it exists until its pods are gone).

A disruption does not spend the budget: the trainer Job's ``podFailurePolicy`` ignores a pod with the
``DisruptionTarget`` condition (evicted, preempted, its node drained), and the Job controller recreates
it. With ``trainer.nodes > 1`` the other ranks then fail on their collective and the Job fails; when
the trainer's pods, as observed, include one with that condition, the failure is a disruption
(:func:`disrupted_failure`): the Job is deleted and the same attempt created again, resuming from the
latest checkpoint, and ``status.restarts`` stays (condition ``TrainerRunning`` says why). The
disruption is remembered in ``status.trainerDisruption`` with the uid of the Job its pod belongs to
(:func:`disruption_record`), so a failure of that Job seen after the pod is gone from the API is still a
disruption (:func:`disrupted`); the record goes once that Job is replaced. A disruption the operator
never saw (it was down while the pod was evicted and deleted) counts as a restart.

Terminal errors fail the job at once, without consuming the budget (:func:`terminal_failure`): the
trainer exited with the terminal status (with the reason it gave, such as ``CheckpointLost``,
``CheckpointVolumeFull`` or ``NonFiniteTraining``, else ``TrainerTerminalError``; with its last log
lines), or a
pod of any role cannot start (``PodCannotStart``: an image that does not exist or whose pull is
refused, an invalid image name, a missing ConfigMap or Secret, a transient pull or create error that
outlasted its grace (``observe.PULL_ERROR_GRACE_S``, ``observe.CREATE_ERROR_GRACE_S``), a reward
server that exits at start because its evaluators cannot be built), or a reward pod cannot get the
code sandbox's isolation (``SandboxUnavailable``: the node has no seccomp profile the pod names, or
the server's isolation probe failed). Retrying any of them builds the same pod on the same node.

A Deployment role (inference, reward, rollout) whose container crash-loops fails the job as
``RoleCrashLooping`` (:func:`crashloop_failure`) once it is past ``observe.CRASHLOOP_RESTART_LIMIT``
restarts or has looped ``observe.CRASHLOOP_GRACE_S`` seconds; until then its role's condition says
``CrashLoopBackOff`` with the pod, the container and its last termination message, so the trainer
waiting for episodes is explained at once, not after its own timeout.

The job's own checkpoint claim unbound ``observe.CLAIM_BIND_GRACE_S`` seconds after its creation while
binding was due (a pod waits on the unbound claim, or the scheduler selected a node for it) fails the
job as ``ClaimNotBound`` (:func:`claim_failure`): a missing StorageClass, no default one, a provisioner
that keeps failing; the job's message names the claim meanwhile.

An edit that changes the trainer Job's spec (immutable once created: its template carries the
config hash) recreates the Job at a safe point: it is deleted in the foreground (the trainer gets
SIGTERM and checkpoints its last step) and the same attempt is created again once it is gone.
"""
from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from enum import Enum
from typing import Optional

from rft_api.constants import TRAINER_REASON_PREFIX, TRAINER_TERMINAL_REASONS
from rft_api.progress import Progress
from rft_api.spec import RFTJobSpec
from rft_api.status import DisruptionRecord

from ..observe import CLAIM_BIND_GRACE_S, CRASHLOOP_GRACE_S, CRASHLOOP_RESTART_LIMIT, Observed, TrainerObs


@dataclass(frozen=True)
class Failure:
    """Why a job failed: a CamelCase reason and a message."""

    reason: str
    message: str


class TrainerAction(str, Enum):
    """What the reconcile does with the trainer Job."""

    APPLY = "apply"            # create it, or re-apply the current attempt
    DELETE_STALE = "delete"    # a Job of an earlier attempt, or of an outdated spec: delete it, create later
    WAIT = "wait"              # the Job is still being deleted (its pods are terminating)


def fresh_failure(trainer: Optional[TrainerObs], restarts: int, disrupted: bool = False) -> bool:
    """The Job of the current attempt has failed, its pods are gone, and that failure is neither
    counted yet nor terminal, nor a disruption (``disrupted``: a trainer pod has ``DisruptionTarget``)."""
    return (trainer is not None and trainer.failed_condition and not trainer.terminating
            and not trainer.terminal_failure and trainer.attempt >= restarts and not disrupted)


def disruption_record(observed: Observed, prev: Optional[DisruptionRecord], now: str) -> Optional[DisruptionRecord]:
    """What ``status.trainerDisruption`` keeps: a trainer pod disrupted now (its Job's uid; the earlier
    record while it names the same Job), else the earlier record while its Job is not replaced by
    another (kept while no trainer Job exists, dropped once a Job of another uid does)."""
    if observed.trainer_disruptions:
        uid = observed.trainer_disrupted_jobs[0] if observed.trainer_disrupted_jobs else ""
        if prev is not None and prev.job_uid == uid:
            return prev
        return DisruptionRecord(job_uid=uid, pod=observed.trainer_disruptions[0], time=now)
    t = observed.trainer
    if prev is None or (t is not None and t.uid != prev.job_uid):
        return None
    return prev


def disrupted(observed: Observed, record: Optional[DisruptionRecord]) -> bool:
    """Whether the trainer Job's failure is a disruption: a trainer pod has ``DisruptionTarget`` now, or
    the record (:func:`disruption_record`) names the observed Job (the pod may be gone by the time the
    Job's failure is seen)."""
    if observed.trainer_disruptions:
        return True
    t = observed.trainer
    return record is not None and t is not None and bool(t.uid) and t.uid == record.job_uid


def disrupted_failure(trainer: Optional[TrainerObs], restarts: int, disrupted: bool) -> bool:
    """The Job of the current attempt failed because one of its pods was disrupted (evicted or
    preempted): it is recreated, same attempt, without spending a restart."""
    return disrupted and fresh_failure(trainer, restarts)


_TRAINER_REASON = re.compile(re.escape(TRAINER_REASON_PREFIX) + r"([A-Z][A-Za-z]+): ")


def trainer_reason(message: str) -> str:
    """The reason the trainer gave for its terminal exit (``rft trainer: <Reason>: ...``, one of
    :data:`~rft_api.constants.TRAINER_TERMINAL_REASONS`), else ``TrainerTerminalError``."""
    m = _TRAINER_REASON.search(message)
    return m.group(1) if m and m.group(1) in TRAINER_TERMINAL_REASONS else "TrainerTerminalError"


def terminal_failure(observed: Observed, restarts: int) -> Optional[Failure]:
    """A failure that retrying cannot fix: the trainer's terminal exit, or a pod that cannot start."""
    t = observed.trainer
    if t is not None and t.terminal_failure and not t.terminating and t.attempt >= restarts:
        why = "; ".join(observed.trainer_messages) or f"{t.reason}: {t.message}"
        return Failure(trainer_reason(why), f"the trainer stopped with an error that a restart cannot fix: {why}")
    sandbox = [p for p in observed.pod_problems if p.sandbox]
    if sandbox:
        p = sandbox[0]
        return Failure("SandboxUnavailable",
                       f"reward pod {p.pod} cannot isolate the code_sandbox evaluator's untrusted code "
                       f"(container {p.container}: {p.reason}): {p.message}")
    if observed.pod_problems:
        p = observed.pod_problems[0]
        more = f" (and {len(observed.pod_problems) - 1} more)" if len(observed.pod_problems) > 1 else ""
        return Failure("PodCannotStart", f"{p.role} pod {p.pod} container {p.container}: {p.reason}: "
                                         f"{p.message}{more}")
    return None


def crashloop_failure(observed: Observed) -> Optional[Failure]:
    """A Deployment role's container crash-looping past its grace (``observe.CrashLoop.beyond_grace``)."""
    looping = [c for c in observed.crashloops if c.beyond_grace]
    if not looping:
        return None
    more = f" (and {len(looping) - 1} more)" if len(looping) > 1 else ""
    return Failure("RoleCrashLooping", f"{looping[0].describe()}{more}; the job fails after "
                                       f"{CRASHLOOP_RESTART_LIMIT} restarts or {int(CRASHLOOP_GRACE_S)}s of crash-looping")


def claim_failure(observed: Observed) -> Optional[Failure]:
    """The job's checkpoint claim unbound past its grace once binding was due (``observe.ClaimObs``)."""
    c = observed.claim
    if c is None or not c.beyond_grace:
        return None
    return Failure("ClaimNotBound", f"{c.describe()}; the job fails once binding is overdue by "
                                    f"{int(CLAIM_BIND_GRACE_S)}s")


def next_restarts(trainer: Optional[TrainerObs], restarts: int, restart_limit: int,
                  disrupted: bool = False, counted_from: int = 0) -> tuple[int, Optional[Failure]]:
    """The restart count after this observation, and the failure when the budget is spent
    (``disrupted``: a trainer pod has ``DisruptionTarget``; its Job's failure is not counted;
    ``counted_from``: the restart count at the job's last retry, ``policies.retry``, where the budget
    starts again)."""
    if not fresh_failure(trainer, restarts, disrupted):
        return restarts, None
    if restarts - counted_from < restart_limit:
        return restarts + 1, None
    assert trainer is not None
    detail = f": {trainer.reason}: {trainer.message}" if trainer.reason or trainer.message else ""
    since = " since the job was retried" if counted_from else ""
    return restarts, Failure(
        "RestartLimitExceeded",
        f"the trainer failed {restarts - counted_from + 1} time(s){since}; spec.restartLimit is {restart_limit}{detail}")


def trainer_action(trainer: Optional[TrainerObs], persisted_restarts: int, template_hash: str = "",
                   disrupted: bool = False) -> TrainerAction:
    """What to do with the trainer Job, given the restart count already written to status, the
    template hash of the Job that should run (``""``: not compared) and whether a trainer pod was
    disrupted (a failed Job of the current attempt is then recreated, same attempt)."""
    if trainer is None:
        return TrainerAction.APPLY
    if trainer.terminating:
        return TrainerAction.WAIT
    if trainer.attempt < persisted_restarts or disrupted_failure(trainer, persisted_restarts, disrupted):
        return TrainerAction.DELETE_STALE
    if template_hash and trainer.template_hash != template_hash and not trainer.finished:
        return TrainerAction.DELETE_STALE  # its immutable spec changed: recreate, same attempt
    return TrainerAction.APPLY


def deadline_failure(spec: RFTJobSpec, clock_start: Optional[dt.datetime], now: dt.datetime) -> Optional[Failure]:
    """``spec.activeDeadlineSeconds`` exceeded since the clock started (see ``suspend.clock_start``)."""
    limit = spec.active_deadline_seconds
    if limit is None or clock_start is None:
        return None
    elapsed = (now - clock_start).total_seconds()
    if elapsed < limit:
        return None
    return Failure("DeadlineExceeded",
                   f"the job ran {int(elapsed)}s; spec.activeDeadlineSeconds is {limit}")


def min_samples_for_evaluator_verdict(spec: RFTJobSpec) -> int:
    """Samples that must have been scored before an always-failing evaluator fails the job: one step's worth."""
    return spec.rollout.prompts_per_step * spec.rollout.samples_per_prompt


def evaluator_failure(spec: RFTJobSpec, progress: Optional[Progress], attempt: int = 0) -> Optional[Failure]:
    """Every sample scored so far (at least one step's worth) ended in an evaluator timeout or error,
    as the record of trainer attempt ``attempt`` or a later one says (an earlier attempt's record is
    not the verdict on a retried job's fixed evaluator).

    Parse errors do not count: an untrained policy often produces no parsable answer, which is a
    reward of 0, not a broken evaluator.
    """
    if progress is None or progress.attempt < attempt:
        return None
    n = progress.samples_scored
    errs = progress.errors.timeouts + progress.errors.runtime_errors
    if n < max(1, min_samples_for_evaluator_verdict(spec)) or errs < n:
        return None
    return Failure("EvaluatorFailing",
                   f"the evaluator failed on every one of the {n} samples scored "
                   f"({progress.errors.timeouts} timeouts, {progress.errors.runtime_errors} runtime errors)")
