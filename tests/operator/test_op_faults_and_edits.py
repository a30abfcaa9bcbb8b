"""Faults and edits seen through pure observation and policies: a Job in FailureTarget is not failed
while its pods run, terminal errors fail at once without consuming the restart budget, an edit of
the trainer's immutable spec recreates it (same attempt), and observedGeneration waits for the
rollout of an edit."""
from __future__ import annotations

import pytest

from rft_operator import names
from rft_operator import observe as observe_mod
from rft_operator.builders import BuildContext, config_hash, desired_children
from rft_operator.observe import observe, observe_job
from rft_operator.plan import TrainerStep, make_plan
from rft_operator.policies import failure
from rft_operator.policies.failure import TrainerAction
from rft_operator.reconcile import template_hash
from rft_operator.status import compute_status
from tests.operator.support import at, make_job


def _job_obj(conditions, active=0, terminating=0, attempt="0", deleting=False, uid="job-uid-1"):
    meta = {"name": "tiny-arith-trainer", "uid": uid, "annotations": {names.ANNOTATION_ATTEMPT: attempt}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"kind": "Job", "metadata": meta, "spec": {"parallelism": 1},
            "status": {"active": active, "terminating": terminating,
                       "conditions": [{"type": t, "status": "True", "reason": r, "message": m}
                                      for t, r, m in conditions]}}


def test_failure_target_is_not_failed_while_the_pod_still_runs() -> None:
    target = [("FailureTarget", "BackoffLimitExceeded", "")]
    t = observe_job(_job_obj(target, active=1))
    assert not t.failed_condition and not t.finished
    assert failure.next_restarts(t, 0, 3) == (0, None)
    t = observe_job(_job_obj(target + [("Failed", "BackoffLimitExceeded", "")], terminating=1))
    assert not t.failed_condition  # Failed, but a pod is still terminating (writing its checkpoint)
    t = observe_job(_job_obj(target + [("Failed", "BackoffLimitExceeded", "")]))
    assert t.failed_condition and failure.next_restarts(t, 0, 3) == (1, None)


def test_a_job_being_deleted_is_waited_for() -> None:
    t = observe_job(_job_obj([("Failed", "BackoffLimitExceeded", "")], deleting=True))
    assert failure.trainer_action(t, 1) is TrainerAction.WAIT
    assert failure.next_restarts(t, 0, 3) == (0, None)  # a deletion's failure is not a new one


def _observed(job_objs, pods=()):
    return observe("tiny-arith", [*job_objs, *pods], at(0))


def test_terminal_trainer_exit_fails_at_once_without_the_budget() -> None:
    job = make_job()
    j = _job_obj([("Failed", "PodFailurePolicy", "Container trainer for pod x failed with exit code 2")])
    pod = {"kind": "Pod", "metadata": {"name": "tiny-arith-trainer-0-abc", "labels": {names.LABEL_ROLE: "trainer"}},
           "status": {"containerStatuses": [{"name": "trainer", "state": {"terminated": {
               "exitCode": 2, "message": "rft trainer: resume: dataset changed under the job\n"}}}]}}
    obs = _observed([j], [pod])
    s = compute_status(job, obs)
    assert s.phase == "Failed" and s.restarts == 0
    failed = next(c for c in s.conditions if c.type == "Failed")
    assert failed.reason == "TrainerTerminalError" and "dataset changed under the job" in failed.message


@pytest.mark.parametrize("line, reason", [
    ("rft trainer: CheckpointLost: /checkpoints holds no checkpoint, yet ...", "CheckpointLost"),
    ("rft trainer: CheckpointVolumeFull: the checkpoint volume is full", "CheckpointVolumeFull"),
    ("rft trainer: NonFiniteTraining: 3 steps in a row", "NonFiniteTraining"),
    ("rft trainer: NoSuchReason: made up", "TrainerTerminalError"),
    ("Traceback ... rft trainer: spec: bad", "TrainerTerminalError"),
])
def test_the_trainers_terminal_reason_becomes_the_jobs(line: str, reason: str) -> None:
    job = make_job()
    j = _job_obj([("Failed", "PodFailurePolicy", "Container trainer for pod x failed with exit code 2")])
    pod = {"kind": "Pod", "metadata": {"name": "tiny-arith-trainer-0-abc", "labels": {names.LABEL_ROLE: "trainer"}},
           "status": {"containerStatuses": [{"name": "trainer", "state": {"terminated": {
               "exitCode": 2, "message": f"some log\n{line}\n"}}}]}}
    s = compute_status(job, _observed([j], [pod]))
    failed = next(c for c in s.conditions if c.type == "Failed")
    assert s.phase == "Failed" and s.restarts == 0 and failed.reason == reason and line.split("rft trainer: ")[1][:20] \
        in failed.message


def _pulling_pod(reason: str, message: str, started: float = 0.0, role: str = "reward") -> dict:
    return {"kind": "Pod", "metadata": {"name": f"tiny-arith-{role}-1", "labels": {names.LABEL_ROLE: role},
                                        "creationTimestamp": at(started - 5).isoformat()},
            "status": {"startTime": at(started).isoformat().replace("+00:00", "Z"),
                       "containerStatuses": [{"name": role, "state": {"waiting": {"reason": reason, "message": message}}}]}}


def test_a_pod_whose_image_does_not_exist_fails_the_job_at_once_naming_the_image() -> None:
    """containerd's words for an image that is not there, or whose pull is refused: no retry brings it."""
    job = make_job()
    for reason, message in [
        ("ErrImagePull", 'failed to pull and unpack image "docker.io/library/nope:1": failed to resolve reference '
                         '"docker.io/library/nope:1": docker.io/library/nope:1: not found'),
        ("ErrImagePull", 'rpc error: code = NotFound desc = failed to pull and unpack image "r.example/nope:1": '
                         'manifest unknown'),
        ("ErrImagePull", 'failed to pull and unpack image "r.example/p/nope:1": failed to resolve reference: '
                         "pull access denied, repository does not exist or may require authorization: "
                         "server message: insufficient_scope: authorization failed"),
        ("ErrImagePull", 'failed to authorize: failed to fetch anonymous token: unexpected status: 401 Unauthorized'),
        ("ImagePullBackOff", 'Back-off pulling image "r.example/nope:1": ErrImagePull: failed to pull and unpack '
                             'image "r.example/nope:1": r.example/nope:1: not found'),  # newer kubelets say why
        ("InvalidImageName", 'Failed to apply default image tag "nope:1:": couldn\'t parse image reference '
                             '"nope:1:": invalid reference format'),
    ]:
        s = compute_status(job, observe("tiny-arith", [_pulling_pod(reason, message)], at(1)))
        failed = next(c for c in s.conditions if c.type == "Failed")
        assert s.phase == "Failed" and s.restarts == 0 and failed.reason == "PodCannotStart", (message, s.message)
        assert "reward pod tiny-arith-reward-1" in failed.message and message in failed.message


def test_a_transient_pull_error_is_waited_for_the_pull_grace_then_fails() -> None:
    """Issue #55: a registry answering 429 for a minute on day 3 must not end the run. A pull error that
    names no permanent cause (429, 5xx, a timeout, and ImagePullBackOff's own "Back-off pulling image")
    fails the job only once the pod's containers have waited PULL_ERROR_GRACE_S; until then the job's
    message says what it waits on."""
    job = make_job()
    grace = observe_mod.PULL_ERROR_GRACE_S
    assert grace >= 300  # a rate limit of a couple of minutes passes
    for reason, message in [
        ("ErrImagePull", 'failed to pull and unpack image "r.example/rft:1": failed to copy: httpReadSeeker: '
                         "failed open: unexpected status code https://r.example/v2/rft/blobs/sha256:ab: "
                         "429 Too Many Requests"),
        ("ErrImagePull", "toomanyrequests: You have reached your pull rate limit."),
        ("ErrImagePull", 'failed to do request: Head "https://r.example/v2/rft/manifests/1": dial tcp '
                         "10.1.2.3:443: i/o timeout"),
        ("ImagePullBackOff", 'Back-off pulling image "r.example/rft:1"'),
    ]:
        for waited in (1, 120, grace - 1):
            s = compute_status(job, observe("tiny-arith", [_pulling_pod(reason, message)], at(waited)))
            assert s.phase != "Failed", (message, waited, s.message)
            assert "waiting on an image pull: reward pod tiny-arith-reward-1" in s.message and message in s.message
        s = compute_status(job, observe("tiny-arith", [_pulling_pod(reason, message)], at(grace + 1)))
        failed = next(c for c in s.conditions if c.type == "Failed")
        assert s.phase == "Failed" and s.restarts == 0 and failed.reason == "PodCannotStart", (message, s.message)
        assert message in failed.message and "waiting on an image pull" not in s.message


def test_a_disrupted_trainer_pod_does_not_spend_a_restart() -> None:
    """A trainer pod evicted or preempted (DisruptionTarget) is ignored by the Job's pod failure policy;
    with several nodes the other ranks then fail and the Job fails: that failure is recreated, same
    attempt, without spending a restart, and TrainerRunning says why. Without the condition, it counts."""
    job = make_job(restartLimit=3)
    failed_job = _job_obj([("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")])
    rank0 = {"kind": "Pod", "metadata": {"name": "tiny-arith-trainer-0-abc", "labels": {names.LABEL_ROLE: "trainer"}},
             "status": {"phase": "Failed", "containerStatuses": [{"name": "trainer", "state": {"terminated": {
                 "exitCode": 1, "message": "RuntimeError: gloo: connection closed by peer"}}}]}}
    rank1 = {"kind": "Pod", "metadata": {"name": "tiny-arith-trainer-1-def", "labels": {names.LABEL_ROLE: "trainer"},
                                         "deletionTimestamp": "2026-01-01T00:00:00Z", "ownerReferences": [
                                             {"kind": "Job", "name": "tiny-arith-trainer", "uid": "job-uid-1",
                                              "controller": True}]},
             "status": {"phase": "Failed", "conditions": [
                 {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                  "message": "Preempted in order to admit critical pod"}]}}
    obs = _observed([failed_job], [rank0, rank1])
    assert obs.trainer_disruptions == ("tiny-arith-trainer-1-def: PreemptionByScheduler: "
                                       "Preempted in order to admit critical pod",)
    s = compute_status(job, obs)
    assert s.phase != "Failed" and s.restarts == 0, s.message
    tr = next(c for c in s.conditions if c.type == "TrainerRunning")
    assert tr.reason == "Disrupted" and "PreemptionByScheduler" in tr.message and "without spending a restart" in tr.message
    assert failure.trainer_action(obs.trainer, 0, disrupted=True) is TrainerAction.DELETE_STALE  # same attempt again
    assert failure.next_restarts(obs.trainer, 0, 3, disrupted=True) == (0, None)
    assert s.trainer_disruption is not None and s.trainer_disruption.job_uid == "job-uid-1"
    assert "PreemptionByScheduler" in s.trainer_disruption.pod
    # the disrupted pod gone from the API before the Job's failure is seen: the status remembers it
    job.status = s
    gone = _observed([failed_job], [rank0])
    assert gone.trainer_disruptions == ()
    s2 = compute_status(job, gone)
    assert s2.phase != "Failed" and s2.restarts == 0, s2.message
    tr = next(c for c in s2.conditions if c.type == "TrainerRunning")
    assert tr.reason == "Disrupted" and "PreemptionByScheduler" in tr.message
    p = make_plan(False, s2.phase, gone, 0, "", None, s2.trainer_disruption)
    assert p.trainer is TrainerStep.DELETE  # recreated, same attempt
    # the recreated Job (another uid) fails: that failure counts, and the record is gone
    job.status = s2
    again = _observed([_job_obj([("Failed", "BackoffLimitExceeded", "")], uid="job-uid-2")], [rank0])
    s3 = compute_status(job, again)
    assert s3.restarts == 1 and s3.trainer_disruption is None
    assert make_plan(False, s3.phase, again, 0, "", None, s2.trainer_disruption).trainer is TrainerStep.APPLY
    job.status = None
    # no DisruptionTarget (or its status False): an ordinary failure, counted
    rank1["status"]["conditions"][0]["status"] = "False"
    obs = _observed([failed_job], [rank0, rank1])
    assert obs.trainer_disruptions == () and compute_status(job, obs).restarts == 1
    assert failure.trainer_action(obs.trainer, 0) is TrainerAction.APPLY
    # a disruption does not hide a terminal exit, and a budget already spent is not refilled
    terminal = _job_obj([("Failed", "PodFailurePolicy", "Container trainer for pod x failed with exit code 2")])
    assert failure.next_restarts(observe_job(terminal), 0, 3, disrupted=True) == (0, None)
    assert failure.trainer_action(observe_job(terminal), 0, disrupted=True) is TrainerAction.APPLY


def test_a_create_error_the_kubelet_retries_is_waited_for_a_permanent_one_fails_at_once() -> None:
    """CI on ee5f6d0: on a loaded node an inference container waited with CreateContainerConfigError
    'failed to sync secret cache: timed out waiting for the condition' (the kubelet retries that) and the
    job failed as PodCannotStart. A create error is waited for up to CREATE_ERROR_GRACE_S from the pod's
    start (or from its containers' last turn to not ready), whatever its wording; one that names a
    permanent cause (a missing Secret, key or file, runAsNonRoot) fails the job at once."""
    job = make_job()

    def pod(reason: str, message: str, started: float = 0.0, not_ready_at: float | None = None) -> dict:
        status: dict = {"startTime": at(started).isoformat().replace("+00:00", "Z"),
                        "containerStatuses": [{"name": "inference", "state": {"waiting": {
                            "reason": reason, "message": message}}}]}
        if not_ready_at is not None:
            status["conditions"] = [{"type": "ContainersReady", "status": "False",
                                     "lastTransitionTime": at(not_ready_at).isoformat().replace("+00:00", "Z")}]
        return {"kind": "Pod", "metadata": {"name": "tiny-arith-inference-1", "labels": {names.LABEL_ROLE: "inference"},
                                            "creationTimestamp": at(-5).isoformat()},
                "status": status}

    def status_at(p: dict, now: float):
        return compute_status(job, observe("tiny-arith", [p], at(now)))

    grace = observe_mod.CREATE_ERROR_GRACE_S
    retried = [("CreateContainerConfigError", "failed to sync secret cache: timed out waiting for the condition"),
               ("CreateContainerConfigError", "failed to sync configmap cache: timed out waiting for the condition"),
               ("CreateContainerConfigError", 'object "t-1"/"tiny-arith-token" not registered'),
               ("CreateContainerError", "context deadline exceeded"),
               ("CreateContainerConfigError", "a wording no release has used yet")]
    for reason, message in retried:
        s = status_at(pod(reason, message), grace - 1)
        assert s.phase != "Failed", (message, s.message)
        s = status_at(pod(reason, message), grace + 1)
        failed = next(c for c in s.conditions if c.type == "Failed")
        assert s.phase == "Failed" and failed.reason == "PodCannotStart" and message in failed.message, s
        # a container that ran and now waits again (a restart) waits from its last turn to not ready
        s = status_at(pod(reason, message, started=-3600, not_ready_at=grace), 2 * grace - 1)
        assert s.phase != "Failed", (message, s.message)
        s = status_at(pod(reason, message, started=-3600, not_ready_at=grace), 2 * grace + 1)
        assert s.phase == "Failed", (message, s.message)
    for reason, message in [("CreateContainerConfigError", 'secret "hf-credentials" not found'),  # not the token: #55
                            ("CreateContainerConfigError", "couldn't find key token in Secret t-1/tiny-arith-token"),
                            ("CreateContainerConfigError", "container has runAsNonRoot and image will run as root"),
                            ("CreateContainerError", "open /var/lib/x: no such file or directory")]:
        s = status_at(pod(reason, message), 1)
        failed = next(c for c in s.conditions if c.type == "Failed")
        assert s.phase == "Failed" and failed.reason == "PodCannotStart" and message in failed.message, s


def _reward_pod(status: dict, seccomp: str = "Localhost") -> dict:
    return {"kind": "Pod", "metadata": {"name": "code-reward-1", "labels": {names.LABEL_ROLE: "reward"}},
            "spec": {"containers": [{"name": "reward", "securityContext": {"seccompProfile": {
                "type": seccomp, "localhostProfile": "rft/code-sandbox.json"}}}]},
            "status": {"containerStatuses": [{"name": "reward", **status}]}}


def _failed(pods) -> tuple[str, str]:
    s = compute_status(make_job(), _observed([], pods))
    assert s.phase == "Failed" and s.restarts == 0, s
    c = next(c for c in s.conditions if c.type == "Failed")
    return c.reason, c.message


def test_a_reward_pod_whose_seccomp_profile_is_missing_fails_the_job_as_sandbox_unavailable() -> None:
    """The kubelet cannot load the Localhost profile the builders name for the code sandbox: the
    container stays in CreateContainerError; the job fails at once, naming the sandbox and the file."""
    msg = ('failed to create containerd container: cannot load seccomp profile "/var/lib/kubelet/seccomp/rft/'
           'code-sandbox.json": open /var/lib/kubelet/seccomp/rft/code-sandbox.json: no such file or directory')
    reason, message = _failed([_reward_pod({"state": {"waiting": {"reason": "CreateContainerError", "message": msg}}})])
    assert reason == "SandboxUnavailable"
    assert "code-reward-1" in message and "code_sandbox" in message and "rft/code-sandbox.json" in message


def test_a_reward_server_whose_isolation_probe_fails_fails_the_job_as_sandbox_unavailable() -> None:
    """``rft reward`` exits 2 at start when the sandbox's isolation probe fails; in CrashLoopBackOff the
    exit is the container's lastState. The job fails with the server's own message (never a retry loop)."""
    why = "rft reward: code_sandbox: cannot isolate untrusted code here (no user/network/mount/pid namespace): x"
    reason, message = _failed([_reward_pod({
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting failed container"}},
        "lastState": {"terminated": {"exitCode": 2, "reason": "Error", "message": f"log line\n{why}\n"}}})])
    assert reason == "SandboxUnavailable" and why in message


def test_a_reward_server_exiting_at_start_for_another_reason_cannot_start() -> None:
    reason, message = _failed([_reward_pod({"state": {"terminated": {
        "exitCode": 2, "reason": "Error", "message": "rft reward: evaluator.options.foo: unknown option\n"}}},
        seccomp="RuntimeDefault")])
    assert reason == "PodCannotStart" and "unknown option" in message


def test_other_reward_exits_and_seccomp_errors_elsewhere_are_not_sandbox_failures() -> None:
    """An OOM kill (137) is retried by the kubelet; a seccomp error in a pod with no Localhost profile is
    a plain PodCannotStart."""
    oom = _reward_pod({"state": {"running": {}}, "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}})
    s = compute_status(make_job(), _observed([], [oom]))
    assert s.phase != "Failed", s
    reason, _ = _failed([_reward_pod({"state": {"waiting": {"reason": "CreateContainerError",
                                                           "message": "seccomp: something"}}}, seccomp="RuntimeDefault")])
    assert reason == "PodCannotStart"


def test_an_edit_of_the_trainer_spec_recreates_the_same_attempt() -> None:
    before, after = make_job(), make_job(trainer={"algorithm": "grpo", "learningRate": 2e-3, "maxSteps": 40})
    old_hash = template_hash(before, BuildContext(), config_hash(before, BuildContext()))
    new_hash = template_hash(after, BuildContext(), config_hash(after, BuildContext()))
    assert old_hash != new_hash
    running = observe_job({**_job_obj([], active=1), "metadata": {
        "name": "tiny-arith-trainer", "annotations": {names.ANNOTATION_ATTEMPT: "0",
                                                      names.ANNOTATION_TEMPLATE_HASH: old_hash}}})
    assert failure.trainer_action(running, 0, old_hash) is TrainerAction.APPLY
    assert failure.trainer_action(running, 0, new_hash) is TrainerAction.DELETE_STALE


def test_observed_generation_waits_for_the_rollout() -> None:
    old = make_job(generation=1)
    kids = desired_children(old, BuildContext())
    deploys = [dict(o, status={"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1})
               for o in kids if o["kind"] == "Deployment"]
    for d in deploys:
        d["metadata"] = dict(d["metadata"], generation=1)
    edited = make_job(generation=2, trainer={"algorithm": "grpo", "learningRate": 2e-3, "maxSteps": 40})
    edited = edited.model_copy(update={"status": compute_status(old, _observed(deploys), config_hash(old, BuildContext()))})
    assert edited.status.observed_generation == 1
    s = compute_status(edited, _observed(deploys), config_hash(edited, BuildContext()))
    assert s.observed_generation == 1  # the pods still run generation 1's config
    rolled = [o for o in desired_children(edited, BuildContext()) if o["kind"] == "Deployment"]
    for d in rolled:
        d["metadata"] = dict(d["metadata"], generation=2)
        d["status"] = {"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1}
    assert compute_status(edited, _observed(rolled), config_hash(edited, BuildContext())).observed_generation == 2
