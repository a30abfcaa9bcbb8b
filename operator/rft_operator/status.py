"""``compute_status``: the whole RFTJob status from the spec, the previous status and the observation.

Pure: no API calls, no clock (the observation carries ``now``). Conditions follow Kubernetes
conventions: one per type (all seven always present, in a fixed order), ``lastTransitionTime`` changes
only when ``status`` changes, ``observedGeneration`` is the generation they were computed from.
``status.observedGeneration`` is the generation whose config every workload's pods run (it waits
for the rollout of an edit).
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Optional

from rft_api.constants import CONDITION_TYPES, OPTIONAL_CONDITION_TYPES
from rft_api.job import RFTJob
from rft_api.progress import Progress
from rft_api.spec import RFTJobSpec
from rft_api.status import (
    Condition,
    ErrorCounts,
    EvaluationRecord,
    FinalModelRecord,
    OutputRecord,
    RFTJobStatus,
    RolesStatus,
    RoleStatus,
)

from . import names
from .observe import (
    CLAIM_BIND_GRACE_S,
    CRASHLOOP_GRACE_S,
    CRASHLOOP_RESTART_LIMIT,
    PULL_ERROR_GRACE_S,
    Observed,
    TrainerObs,
)
from .policies import checkpoint, failure, inputs, retry, suspend
from .policies.admission import Hold
from .policies.phase import PhaseDecision, Signals, is_terminal, next_phase
from .timeutil import format_time, parse_time
from .topology import desired_replicas

MAX_CONDITION_MESSAGE = 4096


def set_condition(previous: list[Condition], ctype: str, status: str, reason: str, message: str,
                  generation: Optional[int], now: str) -> Condition:
    """A condition; its lastTransitionTime is kept from ``previous`` unless its status changed."""
    old = next((c for c in previous if c.type == ctype), None)
    ltt = old.last_transition_time if old is not None and old.status == status and old.last_transition_time else now
    return Condition(type=ctype, status=status, reason=reason, message=message[:MAX_CONDITION_MESSAGE],
                     last_transition_time=ltt, observed_generation=generation)


def _role_condition(role: str, ready: int, desired: int, allowed: bool, why_removed: str) -> tuple[str, str, str]:
    if not allowed:
        return "False", "Removed", f"the {role} workload is removed: {why_removed}"
    if desired == 0:
        return "False", "NoReplicas", f"{role} has 0 replicas"
    if ready >= desired:
        return "True", "Ready", f"{ready}/{desired} {role} replicas ready"
    return "False", "NotReady", f"{ready}/{desired} {role} replicas ready"


def _trainer_condition(t: Optional[TrainerObs], allowed: bool, restarting: bool, why_removed: str,
                       disrupted: tuple[str, ...] = ()) -> tuple[str, str, str]:
    if not allowed:
        return "False", "Removed", f"the trainer Job is removed: {why_removed}"
    if restarting:
        return "False", "Restarting", "the trainer failed; a new attempt resumes from the latest checkpoint"
    if t is None:
        return "False", "NotCreated", "the trainer Job does not exist yet"
    if t.complete:
        return "False", "Completed", "the trainer Job completed"
    if disrupted and (t.failed_condition or t.ready < t.desired):
        return "False", "Disrupted", (f"trainer pod {disrupted[0]}; its pods are recreated without spending a "
                                      f"restart (attempt {t.attempt}) and resume from the latest checkpoint")
    if t.failed_condition:
        return "False", "Failed", f"the trainer Job failed: {t.reason} {t.message}".strip()
    if t.ready > 0:
        return "True", "Running", f"{t.ready}/{t.desired} trainer pods ready (attempt {t.attempt})"
    return "False", "Starting", f"{t.ready}/{t.desired} trainer pods ready (attempt {t.attempt})"


def _removal_reason(spec_suspend: bool, phase: str, hold: Optional[Hold] = None) -> str:
    if spec_suspend:
        return "the job is suspended"
    if hold is not None:
        return f"the job is held: {hold.message}"
    return f"the job is {phase}"


def _deadline_start(prev: RFTJobStatus, suspended: Condition) -> Optional[dt.datetime]:
    """Where ``activeDeadlineSeconds`` counts from: the start, the last resume, or the last retry."""
    start = suspend.clock_start(prev.start_time, suspended)
    if prev.retry is not None and prev.retry.time and start is not None:
        return max(start, parse_time(prev.retry.time))
    return start


def compute_status(job: RFTJob, observed: Observed, config_hash: str = "", hold: Optional[Hold] = None) -> RFTJobStatus:
    """The status to write for ``job`` (whose ``status`` is the previous one) after ``observed``;
    ``config_hash`` is that of the job's rendered config (``status.observedGeneration`` advances to
    the spec's generation only once every workload runs it; ``""``: not compared). ``hold``: Kueue has
    not admitted the job (``policies.admission``): it is suspended as by ``spec.suspend``, for that reason."""
    spec = job.spec
    prev = job.status or RFTJobStatus()
    if job.status is not None and prev.phase == "ValidationFailed":
        return prev  # terminal, and about a spec this one replaced: nothing here is observed any more
    generation = job.metadata.get("generation")
    now = format_time(observed.now)
    again = retry.requested(job)
    if again is not None:  # a Failed job retried in place: it resumes from its latest checkpoint
        prev = retry.reopen(prev, *again, now)
    t = observed.trainer

    # suspend policy first: the Suspended condition (the deadline clock restarts on resume)
    held = spec.suspend or hold is not None
    suspended = set_condition(prev.conditions, "Suspended", *_suspended_condition(spec.suspend, prev, hold),
                              generation, now)

    inputs_state = inputs.state(spec, observed)
    disruption = failure.disruption_record(observed, prev.trainer_disruption, now)
    disrupted = failure.disrupted(observed, disruption)
    disruptions = observed.trainer_disruptions or ((disruption.pod,) if disrupted and disruption is not None else ())
    # failure policy: restart budget, deadline, evaluator, inputs
    if is_terminal(prev.phase) and job.status is not None:
        restarts, budget_failure = prev.restarts, None
    else:
        restarts, budget_failure = failure.next_restarts(
            t, prev.restarts, spec.restart_limit, disrupted=disrupted,
            counted_from=prev.retry.restarts_at_retry if prev.retry is not None else 0)
    restarting = restarts > prev.restarts or (t is not None and t.attempt < restarts)
    fail = (budget_failure
            or (None if held else failure.terminal_failure(observed, restarts))
            or (None if held else failure.crashloop_failure(observed))
            or (None if held else failure.claim_failure(observed))
            or (None if held else failure.deadline_failure(
                spec, _deadline_start(prev, suspended), observed.now))
            or failure.evaluator_failure(spec, observed.progress, attempt=restarts)
            or inputs_state.failure)

    # phase machine
    replicas = desired_replicas(spec)
    ready = {role: w.ready for role, w in observed.workloads.items()}
    signals = Signals(
        suspend=held, failure=fail,
        **({"suspend_reason": hold.reason, "suspend_message": hold.message} if hold and not spec.suspend else {}),
        trainer_succeeded=t is not None and t.complete and t.attempt >= restarts,
        trainer_running=t is not None and t.ready > 0 and not t.finished,
        inference_ready=replicas["inference"] > 0 and ready.get("inference", 0) >= replicas["inference"],
        children_exist=observed.any_children, restarting=restarting)
    decision = next_phase(None if job.status is None else prev.phase, _reason_of(prev), prev.message, signals)
    phase = decision.phase

    roles, values = _roles_and_conditions(spec, phase, decision, replicas, ready, t, restarting, restarts, hold,
                                          disruptions)
    _problem_conditions(values, observed, phase)
    if inputs_state.wanted:
        values["InputsReady"] = inputs_state.condition
    if spec.output is not None:
        values["OutputPushed"] = _output_condition(observed.progress, phase)
    conditions = [suspended if ct == "Suspended" else set_condition(prev.conditions, ct, *values[ct], generation, now)
                  for ct in CONDITION_TYPES if ct == "Suspended" or ct in values]

    # progress and checkpoint view
    p = observed.progress
    checkpoints = checkpoint.retained(p, spec.checkpoint.keep_last, prev.checkpoints)
    evaluation = _evaluation(p) or prev.evaluation
    message = _stopped_early(decision.message, phase, evaluation) + _pulls_note(observed, phase) \
        + _crashloop_note(observed, phase) + _claim_note(observed, phase) + _pending_note(observed, phase)
    if observed.progress_error:
        message = f"{message}; progress ConfigMap ignored: {observed.progress_error}"
    if again is not None and not is_terminal(phase):
        message = f"{prev.message}; {message}"
    started = prev.start_time or (now if phase in ("Provisioning", "Running", "Succeeded", "Failed") else None)
    completed = prev.completion_time or (now if phase in ("Succeeded", "Failed") else None)

    # the spec's generation is observed once the pods that read its config have rolled
    observed_generation = generation if (is_terminal(phase) or held
                                         or observed.rolled_out(config_hash)) else prev.observed_generation
    return RFTJobStatus(
        phase=phase, message=message[:MAX_CONDITION_MESSAGE], observed_generation=observed_generation,
        conditions=conditions, roles=roles,
        step=p.step if p else prev.step,
        total_steps=spec.trainer.max_steps,
        policy_version=p.policy_version if p else prev.policy_version,
        reward_mean=p.reward_mean if p else prev.reward_mean,
        reward_std=p.reward_std if p else prev.reward_std,
        eval_score=p.eval_score if p else prev.eval_score,
        domain_rewards=dict(p.domain_rewards) if p else prev.domain_rewards,
        eval_domain_scores=dict(p.eval_domain_scores) if p else prev.eval_domain_scores,
        evaluation=evaluation,
        last_checkpoint=checkpoint.latest(checkpoints, prev.last_checkpoint),
        checkpoints=checkpoints,
        errors=ErrorCounts(**p.errors.model_dump()) if p else prev.errors,
        final_model=_final_model(job, p) or prev.final_model,
        output=_output(p) or prev.output,
        restarts=restarts,
        trainer_disruption=disruption,
        retry=prev.retry,
        start_time=started,
        completion_time=completed,
    )


def _roles_and_conditions(spec: RFTJobSpec, phase: str, decision: PhaseDecision, replicas: dict[str, int],
                          ready: dict[str, int], t: Optional[TrainerObs], restarting: bool, restarts: int,
                          hold: Optional[Hold] = None, disrupted: tuple[str, ...] = ()
                          ) -> tuple[RolesStatus, dict[str, tuple[str, str, str]]]:
    """Ready/desired per role and the (status, reason, message) of every condition but Suspended."""
    held = spec.suspend or hold is not None
    deploy_ok = suspend.deployments_allowed(held, phase)
    trainer_ok = suspend.trainer_allowed(held, phase) and not (is_terminal(phase) and t is None)
    why = _removal_reason(spec.suspend, phase, hold)

    def role(name: str) -> RoleStatus:
        return RoleStatus(ready=ready.get(name, 0), desired=replicas[name] if deploy_ok else 0)

    roles = RolesStatus(
        inference=role("inference"), reward=role("reward"), rollout=role("rollout"),
        trainer=RoleStatus(ready=t.ready if t else 0,
                           desired=replicas["trainer"] if trainer_ok and not is_terminal(phase) else 0))
    values = {
        "InferenceReady": _role_condition("inference", roles.inference.ready, replicas["inference"], deploy_ok, why),
        "RewardReady": (("True", "NotRequired", "the evaluator scores in the rollout pods")
                        if replicas["reward"] == 0 and deploy_ok else
                        _role_condition("reward", roles.reward.ready, replicas["reward"], deploy_ok, why)),
        "RolloutReady": _role_condition("rollout", roles.rollout.ready, replicas["rollout"], deploy_ok, why),
        "TrainerRunning": _trainer_condition(t, trainer_ok, restarting, why, disrupted),
        "Succeeded": (("True", decision.reason, decision.message) if phase == "Succeeded"
                      else ("False", "NotSucceeded", f"the job is {phase}")),
        "Failed": (("True", decision.reason, decision.message) if phase in ("Failed", "ValidationFailed")
                   else ("False", "NoFailure", f"restarts {restarts}/{spec.restart_limit}")),
    }
    return roles, values


ROLE_CONDITIONS = {"inference": "InferenceReady", "reward": "RewardReady", "rollout": "RolloutReady"}


SCHEDULING_CONDITIONS = {**ROLE_CONDITIONS, "trainer": "TrainerRunning"}


def _problem_conditions(values: dict[str, tuple[str, str, str]], observed: Observed, phase: str) -> None:
    """Each role with a problem its pods show, in its condition (False, in place): a Deployment role's
    crash-looping container (reason ``CrashLoopBackOff``, naming the pod, the container and its last
    termination), then, over it, a pod the scheduler cannot place or pods a Deployment cannot create
    (``Unschedulable``, ``QuotaExceeded``, ``FailedCreate`` and their words)."""
    if is_terminal(phase):
        return
    problems = [*((c.role, "CrashLoopBackOff", c.describe()) for c in reversed(observed.crashloops)),
                *((p.role, p.reason, p.describe()) for p in reversed(observed.pending))]
    for role, reason, text in problems:  # reversed: the first of a role wins
        ctype = SCHEDULING_CONDITIONS.get(role)
        if ctype in values and values[ctype][1] != "Removed":
            values[ctype] = ("False", reason, text)


def _more(items: tuple[object, ...]) -> str:
    return f" (and {len(items) - 1} more)" if len(items) > 1 else ""


def _pending_note(observed: Observed, phase: str) -> str:
    """What the message of a job not yet terminal adds while a pod cannot be placed or created."""
    if is_terminal(phase) or not observed.pending:
        return ""
    return f"; {observed.pending[0].describe()}{_more(observed.pending)}"


def _pulls_note(observed: Observed, phase: str) -> str:
    """What the message of a job not yet terminal adds while a container waits on an image pull the
    kubelet retries (``observe.PULL_ERROR_GRACE_S``): the first such container and its message."""
    if is_terminal(phase) or not observed.pulls:
        return ""
    p = observed.pulls[0]
    return (f"; waiting on an image pull: {p.role} pod {p.pod} container {p.container}: {p.reason}: "
            f"{p.message}{_more(observed.pulls)} (the job fails if it lasts {int(PULL_ERROR_GRACE_S)}s)")


def _crashloop_note(observed: Observed, phase: str) -> str:
    """What the message of a job not yet terminal adds while a role's container crash-loops."""
    if is_terminal(phase) or not observed.crashloops:
        return ""
    return (f"; {observed.crashloops[0].describe()} (the job fails at {CRASHLOOP_RESTART_LIMIT} restarts or "
            f"{int(CRASHLOOP_GRACE_S)}s of crash-looping)")


def _claim_note(observed: Observed, phase: str) -> str:
    """What the message of a job not yet terminal adds while its checkpoint claim is overdue to bind."""
    if is_terminal(phase) or observed.claim is None or not observed.claim.why:
        return ""
    return f"; {observed.claim.describe()} (the job fails at {int(CLAIM_BIND_GRACE_S)}s)"


def _final_model(job: RFTJob, p: Optional[Progress]) -> Optional[FinalModelRecord]:
    """Where the trainer wrote the trained policy (on the checkpoint claim), once it has."""
    if p is None or p.final_model is None:
        return None
    claim = job.spec.checkpoint.existing_claim or names.checkpoints(job.name)
    return FinalModelRecord(claim=claim, path=p.final_model.path, format=p.final_model.format,
                            merged_path=p.final_model.merged_path)


def _evaluation(p: Optional[Progress]) -> Optional[EvaluationRecord]:
    """The held-out evaluation as the trainer reported it (its curve stays in the progress record)."""
    if p is None or p.evaluation is None:
        return None
    return EvaluationRecord(**p.evaluation.model_dump(exclude={"curve"}))


def _stopped_early(message: str, phase: str, evaluation: Optional[EvaluationRecord]) -> str:
    """A Succeeded job's message says when training stopped before trainer.maxSteps, and why."""
    if phase != "Succeeded" or evaluation is None or evaluation.stop_reason is None or "stopped early" in message:
        return message
    why = {"scoreAtLeast": "the evaluation reached evaluation.stopWhen.scoreAtLeast",
           "patience": "the evaluation stopped improving for evaluation.stopWhen.patience evaluations"}
    return f"{message}; stopped early at step {evaluation.step}: {why[evaluation.stop_reason]}"


def _output(p: Optional[Progress]) -> Optional[OutputRecord]:
    """Where the trainer pushed the final model (``spec.output``), once it has."""
    if p is None or p.output is None or p.output.error is not None:
        return None
    o = p.output
    return OutputRecord(uri=o.uri, revision=o.revision, files=o.files, bytes=o.bytes)


def _output_condition(p: Optional[Progress], phase: str) -> tuple[str, str, str]:
    """``OutputPushed``: the push's outcome as the trainer reported it (the model stays on the
    checkpoint claim when it failed)."""
    o = p.output if p is not None else None
    if o is None:
        return ("False", "NotYet" if not is_terminal(phase) else "NotPushed",
                "the final model is pushed when training ends" if not is_terminal(phase)
                else "the trainer did not push the final model")
    if o.error is not None:
        return ("False", o.reason or "PushFailed",
                f"{o.error}; the final model stays on the checkpoint claim (status.finalModel)"[:1024])
    return ("True", "Pushed", f"pushed {o.files} files ({o.bytes} bytes) to {o.uri}"
            + (f" at revision {o.revision}" if o.revision else ""))


def _reason_of(prev: RFTJobStatus) -> str:
    for c in prev.conditions:
        if c.type == ("Succeeded" if prev.phase == "Succeeded" else "Failed") and c.status == "True":
            return c.reason
    return prev.phase


def _suspended_condition(spec_suspend: bool, prev: RFTJobStatus, hold: Optional[Hold] = None) -> tuple[str, str, str]:
    if spec_suspend:
        return "True", "Suspended", "spec.suspend is true"
    if hold is not None:
        return "True", hold.reason, hold.message
    old = next((c for c in prev.conditions if c.type == "Suspended"), None)
    if old is not None and (old.status == "True" or old.reason == suspend.RESUMED):
        return "False", suspend.RESUMED, "resumed from suspension"
    return "False", "NotSuspended", "spec.suspend is false"


def validation_failed_status(previous: Optional[dict[str, Any]], message: str, generation: Optional[int],
                             observed_now: str, reason: str = "InvalidSpec") -> RFTJobStatus:
    """The terminal status of a job whose spec does not validate (its previous status is kept if terminal);
    ``reason``: ``InvalidSpec``, or ``ConfigTooLarge`` when the API server refused a child the spec
    renders as too large (``reconcile.too_large``)."""
    try:
        prev = RFTJobStatus.model_validate(previous) if previous else RFTJobStatus()
    except Exception:  # a previous status we cannot read is replaced
        prev = RFTJobStatus()
    if previous and is_terminal(prev.phase):
        return prev
    values = {ct: ("False", reason, "the spec does not validate") for ct in CONDITION_TYPES
              if ct not in OPTIONAL_CONDITION_TYPES}
    values["Failed"] = ("True", reason, message)
    values["Suspended"] = ("False", "NotSuspended", "the spec does not validate")
    conds = [set_condition(prev.conditions, ct, *values[ct], generation, observed_now) for ct in values]
    return RFTJobStatus(phase="ValidationFailed", message=message[:MAX_CONDITION_MESSAGE],
                        observed_generation=generation, conditions=conds, restarts=prev.restarts,
                        start_time=prev.start_time, completion_time=prev.completion_time or observed_now)


def status_dict(status: RFTJobStatus) -> dict[str, Any]:
    """The status as the API server stores it (camelCase, no nulls)."""
    return status.model_dump(by_alias=True, exclude_none=True, mode="json")
