"""Injected faults against the full stack (control plane, chart-installed operator pod, real local node):
pods deleted, processes SIGKILLed (from this machine's /proc, as the OOM killer would), the operator
killed and restarted, suspend and resume, with every pod running from the project's images under the
builders' securityContext.

Each test runs a small RFTJob (the tiny-arith example scaled down: 8 steps of 4 prompts × 4 samples, a
checkpoint every 2 steps), injects one fault while it trains, and checks that it still ends where it
should (``Succeeded``, or ``Failed`` with a reason for a broken evaluator) with nothing lost.

"Nothing lost" is checked against the trainer's own record on the checkpoint volume,
``metrics.jsonl``: one row per completed training step. A resumed trainer truncates the rows after
the checkpoint it resumes from, so a run where a step was trained twice into the final weights, or
skipped, cannot end with the rows ``1..maxSteps`` exactly once each *and* each attempt's log showing a
contiguous run of steps that starts right after the checkpoint it resumed from. Both are asserted.
"""

from __future__ import annotations

import copy
import datetime as dt
import re
import time

import pytest

from rft_operator import names
from tests.e2e.stack import (
    EXAMPLES,
    JobDriver,
    LogKeeper,
    deep_merge,
    example_job,
    kill_pod_processes,
    paced_docs,
    wait_for,
    with_file_evaluator,
)

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

MAX_STEPS = 8
SMALL = {"rollout": {"promptsPerStep": 4, "samplesPerPrompt": 4},
         "trainer": {"maxSteps": MAX_STEPS}, "checkpoint": {"everySteps": 2}}
START_S = 300.0   # first step, from apply (pods start, the tiny model is built, first rollouts)
FINISH_S = 420.0  # from a fault to the end of the job
STEP_LINE = re.compile(r"rft_runtime\.trainer\.main: step (\d+)/(\d+)")
RESUMED_LINE = re.compile(r"resumed from \S+ \(step (\d+), policy version (\d+)\)")


def small_job(name: str, paced: bool = False, **spec: object) -> list[dict]:
    """The tiny-arith example renamed and scaled down (``spec`` deep-merges over :data:`SMALL`);
    ``paced``: scored by :data:`~tests.e2e.stack.PACED_EVALUATOR`, for a fault that must land mid-run."""
    overrides = copy.deepcopy(SMALL)
    deep_merge(overrides, spec)
    docs = example_job(EXAMPLES / "01-tiny-arith.yaml", name, **overrides)
    return paced_docs(docs) if paced else docs


def trainer_attempt_logs(keeper: LogKeeper) -> list[str]:
    """The trainer's container logs, one per pod (attempt), oldest first, as ``driver.keep_logs(name,
    "trainer")`` kept them through the API (the node deletes a deleted pod's logs)."""
    return keeper.logs("trainer")


def logged_steps(log: str) -> list[int]:
    return [int(m.group(1)) for m in STEP_LINE.finditer(log)]


def assert_every_step_once(driver: JobDriver, name: str, max_steps: int = MAX_STEPS) -> list[int]:
    """The metrics history on the checkpoint volume has exactly the rows 1..max_steps, in order."""
    steps = [r["step"] for r in driver.metrics_rows(name)]
    assert steps == list(range(1, max_steps + 1)), f"metrics.jsonl steps: {steps}"
    return steps


def assert_finished(st: dict, max_steps: int = MAX_STEPS) -> None:
    assert st["phase"] == "Succeeded", st
    assert st["step"] == max_steps and st["policyVersion"] == max_steps, st
    assert st["lastCheckpoint"]["step"] == max_steps, st


def assert_finished_on_policy(driver: JobDriver, name: str, steps: int, timeout: float = FINISH_S) -> list[dict]:
    """The job Succeeds with no trainer restart, every step trained once, and every sample trained on
    sampled from the version it was granted (on-policy: staleness 0). Returns the metrics rows."""
    st = driver.wait_phase(name, "Succeeded", timeout)
    assert_finished(st, steps)
    assert st["restarts"] == 0, "the trainer did not fail"
    rows = driver.metrics_rows(name)
    assert_every_step_once(driver, name, steps)
    assert all(r.get("staleness_max", 0) == 0 for r in rows), [r.get("staleness_max") for r in rows]
    return rows


# -------------------------------------------------------------------------------------- trainer


def test_trainer_pod_deleted_resumes_from_latest_checkpoint(driver: JobDriver) -> None:
    """Delete the trainer pod after a checkpoint: the Job fails (backoffLimit 0), the operator spends
    one restart, the next attempt resumes from the latest checkpoint, and every step is trained once."""
    name, steps = "trainer-kill", 16
    trainer_logs = driver.keep_logs(name, "trainer")
    driver.apply_docs(small_job(name, paced=True, trainer={"maxSteps": steps}))
    driver.wait_job(name, "a checkpoint and a step after it",
                    lambda st: (st.get("lastCheckpoint") or {}).get("step", 0) >= 2 and st.get("step", 0) >= 3,
                    START_S, interval=0.5)
    pod = wait_for("the trainer pod", lambda: driver.ready_pod(name, "trainer"), 30)
    step_at_kill = driver.progress(name)["step"]
    assert step_at_kill < steps, "the job finished before the fault could be injected"
    driver.delete_pod(pod, wait=False)

    st = driver.wait_phase(name, "Succeeded", FINISH_S)
    assert_finished(st, steps)
    assert st["restarts"] == 1, f"one trainer failure, one restart: {st['restarts']}"
    job = driver.api.get("Job", driver.namespace, names.trainer(name))
    assert job["metadata"]["annotations"][names.ANNOTATION_ATTEMPT] == "1"
    assert driver.progress(name)["attempt"] == 1

    # Attempt 0 trained 1..s0; attempt 1 resumed from the latest complete checkpoint k <= s0 and
    # trained exactly k+1..steps. Steps k+1..s0 of attempt 0 were never checkpointed: they were
    # discarded (their metrics rows truncated) and redone once.
    first, second = trainer_attempt_logs(trainer_logs)
    s0_steps, s1_steps = logged_steps(first), logged_steps(second)
    assert s0_steps == list(range(1, len(s0_steps) + 1)) and len(s0_steps) >= step_at_kill, s0_steps
    resumed = RESUMED_LINE.search(second)
    assert resumed, f"attempt 1 did not resume from a checkpoint:\n{second[-3000:]}"
    k = int(resumed.group(1))
    assert int(resumed.group(2)) == k, "the policy version restored is the checkpoint's step"
    assert 2 <= k <= len(s0_steps), (k, s0_steps)
    assert s1_steps == list(range(k + 1, steps + 1)), f"attempt 1 steps {s1_steps} after resuming from {k}"
    assert_every_step_once(driver, name, steps)


def test_trainer_rank_1_killed_the_whole_group_restarts_from_the_last_checkpoint(driver: JobDriver) -> None:
    """``trainer.nodes: 2``: SIGKILL every process of rank 1's pod (as the OOM killer would) after a
    checkpoint. Rank 0 cannot go on alone: the Indexed Job fails, the operator spends one restart and
    starts both ranks again; they resume together from the latest complete checkpoint, and every step
    is trained exactly once into the final weights."""
    name, steps = "rank-kill", 40  # at least 10 s paced: the kill lands mid-run on a fast machine
    trainer_logs = driver.keep_logs(name, "trainer")
    driver.apply_docs(small_job(name, paced=True, trainer={"maxSteps": steps, "nodes": 2}, checkpoint={"everySteps": 5}))
    driver.wait_job(name, "a checkpoint and a step after it",
                    lambda st: (st.get("lastCheckpoint") or {}).get("step", 0) >= 5 and st.get("step", 0) >= 6,
                    START_S, interval=0.5)

    def rank1() -> dict | None:
        return next((p for p in _ready_pods(driver, name, "trainer")
                     if p["metadata"]["labels"].get(names.LABEL_COMPLETION_INDEX) == "1"), None)
    pod = wait_for("rank 1's trainer pod", rank1, 30)
    step_at_kill = driver.progress(name)["step"]
    assert step_at_kill < steps, "the job finished before the fault could be injected"
    kill_pod_processes(pod)

    st = driver.wait_phase(name, "Succeeded", FINISH_S)
    assert_finished(st, steps)
    assert st["restarts"] == 1, f"one group failure, one restart: {st['restarts']}"
    assert driver.progress(name)["attempt"] == 1
    # Rank 0 logs the steps. Attempt 0 trained 1..s0; attempt 1 (both ranks) resumed from the latest
    # complete checkpoint k and trained exactly k+1..steps.
    logs = trainer_attempt_logs(trainer_logs)
    assert len(logs) == 4, f"two ranks in each of two attempts, got {len(logs)} trainer logs"
    rank0 = [log for log in logs if logged_steps(log)]
    assert len(rank0) == 2, [log[-500:] for log in logs]
    first, second = rank0
    s0_steps, s1_steps = logged_steps(first), logged_steps(second)
    assert s0_steps == list(range(1, len(s0_steps) + 1)) and len(s0_steps) >= step_at_kill, s0_steps
    resumed = RESUMED_LINE.search(second)  # rank 0 restores, then has every rank load the checkpoint
    assert resumed, f"attempt 1 did not resume from a checkpoint:\n{second[-3000:]}"
    k = int(resumed.group(1))
    assert 5 <= k <= len(s0_steps), (k, s0_steps)
    assert s1_steps == list(range(k + 1, steps + 1)), f"attempt 1 steps {s1_steps} after resuming from {k}"
    assert_every_step_once(driver, name, steps)


# -------------------------------------------------------------------------------------- operator


def test_operator_killed_and_restarted_keeps_one_of_each_child(driver: JobDriver) -> None:
    """SIGKILL the operator process (its container restarts), then delete its pod (the chart's
    Deployment makes a new one), both while the job trains: no child is duplicated or re-created, the
    trainer is untouched, and the status never goes backwards."""
    # 300 steps of at least 0.25 s (a paced evaluator): 75 s or more, however fast the machine, against
    # about 30 s for the two operator restarts
    name, steps = "operator-kill", 300
    plat = driver.platform
    trainer_logs = driver.keep_logs(name, "trainer")
    driver.apply_docs(small_job(name, paced=True, trainer={"maxSteps": steps}, checkpoint={"everySteps": 50}))
    rec = driver.record(name)
    driver.wait_step(name, 1, START_S)
    before = {k: o["metadata"]["uid"] for k, o in driver.children(name).items()}
    assert ("Job", names.trainer(name)) in before and ("Deployment", names.inference(name)) in before

    def operator_reconciles_again() -> None:
        """The (new) operator process is Ready and writes statuses from newer progress records."""
        plat.wait_ready(120)
        after = driver.status(name).get("step", 0)
        driver.wait_job(name, f"a status update after step {after} from the restarted operator",
                        lambda st: st.get("step", 0) > after, FINISH_S)

    def same_children() -> None:
        now = {k: o["metadata"]["uid"] for k, o in driver.children(name).items()}
        assert now == before, f"children changed across an operator restart:\nbefore {before}\nnow    {now}"
        # No spurious rollout: the re-applied Deployments are identical, one ReplicaSet each.
        for role in ("inference", "rollout"):
            rs = driver.api.list("ReplicaSet", driver.namespace,
                                 f"{names.LABEL_INSTANCE}={name},{names.LABEL_ROLE}={role}")
            assert len(rs) == 1, f"{role}: {[r['metadata']['name'] for r in rs]}"

    # 1. the process dies (as if OOM-killed): the kubelet restarts the container in the same pod
    op = plat.operator_pod()
    kill_pod_processes(op)
    wait_for("the operator container to restart", lambda: any(
        (c.get("restartCount") or 0) >= 1 for c in (plat.api.get("Pod", plat.namespace, op["metadata"]["name"])
                                                   or {}).get("status", {}).get("containerStatuses") or []), 60)
    operator_reconciles_again()
    same_children()
    # 2. the pod is deleted: the chart's Deployment (Recreate) starts a new operator pod
    driver.cluster.kubectl("-n", plat.namespace, "delete", "pod", op["metadata"]["name"], "--wait=false")
    wait_for("a new operator pod", lambda: [p for p in plat.operator_pods()
                                            if p["metadata"]["name"] != op["metadata"]["name"]], 60)
    operator_reconciles_again()
    same_children()
    assert driver.status(name)["phase"] == "Running", "the job must still be training after both faults"

    st = driver.wait_phase(name, "Succeeded", FINISH_S)
    rec.stop()
    assert_finished(st, steps)
    assert st["restarts"] == 0, "an operator crash is not a trainer failure"
    seen = rec.steps()
    assert seen == sorted(seen), f"status.step went backwards: {seen}"
    phases = [p for p in rec.phases() if p]
    assert phases[-2:] == ["Running", "Succeeded"] and set(phases[:-2]) <= {"Pending", "Provisioning"}, phases
    # The trainer ran once, uninterrupted, and trained every step once.
    assert len(trainer_attempt_logs(trainer_logs)) == 1
    assert_every_step_once(driver, name, steps)
    # The objects that outlive the run are the very ones created at the start.
    end = {k: o["metadata"]["uid"] for k, o in driver.children(name).items()}
    for key in (("Job", names.trainer(name)), ("PersistentVolumeClaim", names.checkpoints(name)),
                ("ConfigMap", names.progress(name))):
        assert end[key] == before[key], key


# -------------------------------------------------------------------------------------- inference


def _policy_version(driver: JobDriver, name: str, pod: dict, port: int = 8000) -> int | None:
    """The policy version the pod serves (None when it does not answer); with the job's token."""
    try:
        return int(driver.get_json(name, f"http://{pod['status']['podIP']}:{port}/get_policy_version")
                   ["policy_version"])
    except OSError:
        return None


def test_inference_pod_deleted_new_pod_serves_current_weights(driver: JobDriver) -> None:
    """Delete the inference pod while rollouts are in flight: they retry until the new pod serves,
    the new pod is brought to the trainer's current weights (the policy version it reports equals the
    trainer's), and the job completes on-policy (no stale sample trained on)."""
    # The kubelet stops a deleted pod's container a few seconds after the deletion on a busy node: 60
    # paced steps (15 s or more) so that the outage lands mid-run on a fast machine too.
    name, steps = "inference-kill", 60
    # kept as they run: the rollout pod's first container ends with the run, and the operator deletes
    # the pods of a finished job (their logs with them)
    # (with the kubelet's timestamps: what counts is what happened once the pod was deleted)
    rollout_logs, trainer_logs, inference_logs = (driver.keep_logs(name, role, timestamps=True)
                                                  for role in ("rollout", "trainer", "inference"))
    driver.apply_docs(small_job(name, paced=True, trainer={"maxSteps": steps}, rollout={"promptsPerStep": 8}))
    driver.wait_step(name, 2, START_S)
    old = wait_for("the inference pod", lambda: driver.ready_pod(name, "inference"), 30)
    # Right after a step is reported the trainer has published and the next step's rollouts run.
    step = driver.progress(name)["step"]
    wait_for("the next step", lambda: driver.progress(name)["step"] > step, 60, interval=0.1)
    killed = time.time()  # the node's clock: the node is a network namespace of this machine
    driver.delete_pod(old, wait=False)
    version_at_kill = driver.progress(name)["policyVersion"]
    assert version_at_kill >= 3 and driver.progress(name)["step"] < steps
    # The old pod stops accepting connections once its container gets SIGTERM, and says so; then it
    # finishes the requests in flight. The time of that line (the kubelet's) is when its outage starts
    # (a probe from here that fails says less: on a loaded node it can time out while the pod serves).
    def stopped_at() -> float | None:
        m = re.search(r"^(\S+) .*stopped accepting connections", inference_logs.pod_text(old["metadata"]["name"]),
                      re.MULTILINE)
        return _stamp(m.group(0)) if m else None
    stopped = wait_for("the deleted pod to stop accepting connections", stopped_at, 60, interval=0.2)
    assert driver.progress(name)["step"] < steps, \
        "the job finished before the deleted inference pod stopped serving: the fault fell after the run"

    new = wait_for("a new ready inference pod", lambda: (
        p if (p := driver.ready_pod(name, "inference")) and p["metadata"]["name"] != old["metadata"]["name"] else None),
        FINISH_S, on_timeout=lambda: driver.diagnostics(name))

    def agrees() -> int | None:
        """The version the new pod serves, once it equals the trainer's (read before and after it)."""
        before = driver.progress(name)["policyVersion"]
        served = _policy_version(driver, name, new)
        after = driver.progress(name)["policyVersion"]
        return served if before == after == served and served >= version_at_kill else None
    wait_for("the new inference pod to serve the trainer's current policy version", agrees, 120,
             interval=0.5, on_timeout=lambda: driver.diagnostics(name))

    assert_finished_on_policy(driver, name, steps)
    # Where nothing served for a while (the new pod turned Ready after the old one stopped accepting), the
    # outage was hit where it fell: rollouts in flight retried (the client's backoff, or the task given
    # back and re-leased), or the trainer's next publication waited for the new pod (the rollouts of the
    # step had finished; nothing is granted before every replica serves the version) or skipped the
    # deleted one. On a loaded node the kubelet can deliver the old pod's SIGTERM after the new pod is
    # Ready: a handover without an outage, where nothing has to retry.
    new_ready = _ready_since(new)
    # the lines logged from the deletion on (a publication retried at start-up, before any replica was
    # Ready, is no sign of this fault)
    rollout_log, trainer_log = ("\n".join(_lines_since(k.logs(), killed)) for k in (rollout_logs, trainer_logs))
    hit = (re.search(r"retrying /v1/completions|releasing its lease", rollout_log)
           # any failed attempt of a publication (ConnectError, ConnectTimeout, ReadTimeout, HTTP 503, ...)
           or re.search(r"update_weights_from_disk: .*; retrying in|policy version \d+ not loaded into|"
                        r"no inference replica is Ready", trainer_log))
    outage_s = new_ready - stopped
    print(f"[e2e] inference-kill: the new pod turned Ready {outage_s:+.1f} s after the old one stopped accepting; "
          f"outage {'hit' if hit else 'not hit'}")
    relevant = "\n".join(line for line in (rollout_log + "\n" + trainer_log).splitlines()
                         if re.search(r"retrying|lease|inference replicas?|not loaded", line))
    assert hit or outage_s < 2, f"no retry although nothing served for {outage_s:.1f} s:\n{relevant[-4000:]}"


def _lines_since(texts: list[str], since: float) -> list[str]:
    """The lines of logs kept with timestamps (``keep_logs(..., timestamps=True)``) that the kubelet read
    at ``since`` (epoch seconds) or later."""
    return [line for text in texts for line in text.splitlines() if (_stamp(line) or 0.0) >= since]


def _stamp(line: str) -> float | None:
    """The kubelet's timestamp that starts a line of ``kubectl logs --timestamps`` (epoch seconds), or None."""
    try:
        return dt.datetime.fromisoformat(line.partition(" ")[0]).timestamp()
    except ValueError:
        return None


def _ready_since(pod: dict) -> float:
    """When ``pod``'s Ready condition last turned True (epoch seconds, whole seconds as the API keeps them)."""
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    return dt.datetime.fromisoformat(ready["lastTransitionTime"].replace("Z", "+00:00")).timestamp()


def _ready_pods(driver: JobDriver, name: str, role: str) -> list[dict]:
    return [p for p in driver.pods(name, role)
            if any(c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions", []))]


def test_one_of_three_inference_replicas_deleted_every_replica_serves_each_version(driver: JobDriver) -> None:
    """``inference.replicas: 3``: the trainer publishes each policy version to every ready replica (the
    headless ``<job>-inference-pods`` Service) before granting it, so at every step all three serve
    the trainer's version. One replica is deleted mid-run: the publication in flight skips it, its
    replacement loads the current version (``current.json``) before it turns Ready, and the job
    Succeeds on-policy with every step trained once."""
    # Long enough that the fault lands mid-run with all three Ready, and the job still trains while the
    # replacement starts (a new pod takes about a minute on 2 cores): 80 paced steps of 32 prompts, a
    # second or more each however fast the machine.
    name, steps = "replicas", 80
    driver.apply_docs(small_job(name, paced=True, trainer={"maxSteps": steps}, inference={"replicas": 3},
                                rollout={"promptsPerStep": 32}, checkpoint={"everySteps": 25}))
    trainer_logs = driver.keep_logs(name, "trainer")
    driver.wait_step(name, 2, START_S)

    def all_serve_current(exclude: str = "") -> list[str] | None:
        """The names of the three ready replicas once each serves the trainer's version (read around them)."""
        pods = [p for p in _ready_pods(driver, name, "inference") if p["metadata"]["name"] != exclude]
        if len(pods) != 3:
            return None
        before = driver.progress(name)["policyVersion"]
        served = [_policy_version(driver, name, p) for p in pods]
        after = driver.progress(name)["policyVersion"]
        return [p["metadata"]["name"] for p in pods] if before == after and served == [before] * 3 else None
    first = wait_for("three ready replicas serving the trainer's version", all_serve_current, 120, interval=0.2,
                     on_timeout=lambda: driver.diagnostics(name))
    step = driver.progress(name)["step"]
    wait_for("the next step", lambda: driver.progress(name)["step"] > step, 60, interval=0.1)
    victim = next(p for p in _ready_pods(driver, name, "inference") if p["metadata"]["name"] == first[0])
    driver.delete_pod(victim, wait=False)
    assert driver.progress(name)["step"] < steps, "the job ended before the fault"

    later = wait_for("a replacement replica, and all three serving the trainer's version",
                     lambda: all_serve_current(exclude=first[0]), FINISH_S, interval=0.5,
                     on_timeout=lambda: driver.diagnostics(name))
    assert first[0] not in later and len(set(later) - set(first)) == 1, (first, later)

    assert_finished_on_policy(driver, name, steps, timeout=2 * FINISH_S)
    (log,) = trainer_attempt_logs(trainer_logs)
    served = [int(n) for n in re.findall(r"policy version \d+ served by (\d+) inference replica", log)]
    assert len(served) == steps + 1, log[-3000:]  # version 0 at start, then one per step
    # Once all three were Ready, each publication reached every listed replica: three, or two while the
    # deleted one was gone and its replacement not yet Ready (it then loads current.json itself).
    first_three = served.index(3)
    assert all(n >= 2 for n in served[first_three:]) and served.count(3) >= 2, served


def _gate_version(driver: JobDriver, pod: dict, job: str) -> int | None:
    """The policy version a vLLM pod's gate reports (None when it does not answer); with the job's token."""
    try:
        return driver.get_json(job, f"http://{pod['status']['podIP']}:8000/get_policy_version", 5)["policy_version"]
    except (OSError, KeyError):
        return None


@pytest.mark.vllm
@pytest.mark.timeout(1800)
def test_vllm_replica_deleted_its_replacement_serves_the_current_version_before_ready(driver: JobDriver) -> None:
    """Delete the vLLM replica of ``examples/12-vllm-full-weights.yaml`` (full weights; one replica, so that
    the job cannot finish on another while the replacement starts) mid-run: the replacement loads the version
    the trainer last published (``current.json``) before its gate answers ``/health``, so the first thing it
    reports once Ready is a published version, never the base weights (-1); the trainer's publication waits
    for it; the job completes with no step run twice and every step trained on samples whose log-probs match
    the trainer's (the replacement served exactly the trainer's weights)."""
    name, steps = "vllm-kill", 14
    gate_logs = driver.keep_logs(name, "inference")
    driver.apply_docs(example_job(EXAMPLES / "12-vllm-full-weights.yaml", name, trainer={"maxSteps": steps},
                                  inference={"replicas": 1}))
    driver.wait_step(name, 2, START_S + 300)
    old = wait_for("the inference pod", lambda: driver.ready_pod(name, "inference"), 30)
    driver.delete_pod(old, wait=False)
    version_at_kill = driver.progress(name)["policyVersion"]
    assert driver.progress(name)["step"] < steps, "the job finished before the fault"

    def replacement() -> dict | None:
        new = [p for p in _ready_pods(driver, name, "inference")
               if p["metadata"]["uid"] != old["metadata"]["uid"] and p["status"].get("podIP")]
        return new[0] if new else None
    # Not Ready until it serves a published version: its first answer once Ready is one.
    new = wait_for("the replacement replica to be Ready", replacement, FINISH_S, interval=0.2,
                   on_timeout=lambda: driver.diagnostics(name))
    first = wait_for("the replacement's gate to answer", lambda: _gate_version(driver, new, name), 30, interval=0.2)
    assert first >= version_at_kill >= 0, (first, version_at_kill)

    st = driver.wait_phase(name, "Succeeded", FINISH_S)
    assert_finished(st, steps)
    assert st["restarts"] == 0, "the trainer did not fail"
    assert_every_step_once(driver, name, steps)
    worst = max(r["logprob_diff_abs_max"] for r in driver.metrics_rows(name))
    assert worst < 1e-4, f"vLLM's log-probs differ from the trainer's by up to {worst}"
    replacement_gate = gate_logs.pod_text(new["metadata"]["name"])
    assert "loaded the current policy version" in replacement_gate, replacement_gate[-3000:]



# -------------------------------------------------------------------------------------- evaluator

HANGING_EVALUATOR = '''\
"""Exact-match reward, except that it never returns for tasks whose answer is a multiple of 3."""
import asyncio
import re


async def score(sample, item):
    truth = int(str(item.ground_truth).strip())
    if truth % 3 == 0:
        await asyncio.Event().wait()  # hangs: only the per-sample timeout ends it
    numbers = re.findall(r"-?\\d+", sample.text)
    return 1.0 if numbers and int(numbers[-1]) == truth else 0.0
'''

RAISING_EVALUATOR = '''\
def score(sample, item):
    raise RuntimeError("the grader's database is unreachable")
'''


def _file_evaluator_job(name: str, configmap: str, source: str, **spec: object) -> list[dict]:
    return with_file_evaluator(small_job(name, **spec), configmap, source)


def test_hanging_evaluator_times_out_per_sample_and_job_completes(driver: JobDriver) -> None:
    """An evaluator that hangs on some samples: each such sample times out (reward 0, a timeout error
    counted in status.errors), the other samples are scored, the job completes."""
    name = "evaluator-hangs"
    driver.apply_docs(_file_evaluator_job(name, "hanging-evaluator", HANGING_EVALUATOR))
    st = driver.wait_phase(name, "Succeeded", START_S + FINISH_S)
    assert_finished(st)
    errors, progress = st["errors"], driver.progress(name)
    scored = progress["samplesScored"]
    assert errors["timeouts"] > 0, errors
    assert errors["timeouts"] < scored, (errors, scored)  # only some samples hang
    assert errors["runtimeErrors"] == 0, errors
    # Every hanging sample is a whole group (same task): timeouts come in multiples of samplesPerPrompt.
    assert errors["timeouts"] % 4 == 0, errors
    assert_every_step_once(driver, name)


def test_evaluator_raising_on_every_sample_fails_the_job(driver: JobDriver) -> None:
    """An evaluator that raises on every sample: the job fails with reason EvaluatorFailing (instead
    of training on zeros forever), its training workloads are removed, the Failed condition says why."""
    name = "evaluator-raises"
    driver.apply_docs(_file_evaluator_job(name, "raising-evaluator", RAISING_EVALUATOR,
                                          trainer={"maxSteps": 50}))
    wait = driver.kubectl("wait", "--for=condition=Failed", f"rftjob/{name}", f"--timeout={int(START_S)}s",
                          timeout=START_S + 60, check=False)
    assert wait.returncode == 0, f"{wait.stderr}\n{driver.diagnostics(name)}"
    st = driver.status(name)
    assert st["phase"] == "Failed"
    failed = driver.condition(name, "Failed")
    assert failed["status"] == "True" and failed["reason"] == "EvaluatorFailing", failed
    assert "evaluator failed on every one of the" in failed["message"], failed
    assert st["errors"]["runtimeErrors"] >= 16 and st["step"] < 50, st
    assert driver.condition(name, "Succeeded")["status"] == "False"
    # Nothing keeps training: the Deployments and the unfinished trainer Job are deleted.
    wait_for("the workloads to be removed", lambda: not any(
        k[0] in ("Deployment", "Job") for k in driver.children(name)), 120, on_timeout=lambda: driver.diagnostics(name))
    driver.wait_pods_gone(name, ("inference", "rollout", "trainer"), 120)


# -------------------------------------------------------------------------------------- suspend


def test_suspend_removes_pods_keeps_volume_and_resume_continues(driver: JobDriver) -> None:
    """Suspend mid-run: every role pod goes away, the checkpoint PVC (and its data) stays; resume
    starts a trainer that continues from the latest checkpoint, and the job completes."""
    name, steps = "suspend", 30
    trainer_logs = driver.keep_logs(name, "trainer")
    driver.apply_docs(small_job(name, paced=True, trainer={"maxSteps": steps}))
    driver.wait_job(name, "a checkpoint", lambda st: (st.get("lastCheckpoint") or {}).get("step", 0) >= 2,
                    START_S, interval=0.5)
    pvc = driver.api.get("PersistentVolumeClaim", driver.namespace, names.checkpoints(name))
    driver.kubectl("patch", "rftjob", name, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    st = driver.wait_phase(name, "Suspended", 120)
    assert st["step"] < steps, "the job finished before it could be suspended"
    driver.wait_pods_gone(name, ("inference", "rollout", "trainer"), 120)
    kids = driver.children(name)
    assert not any(k[0] in ("Deployment", "Job") for k in kids), sorted(kids)
    now = kids[("PersistentVolumeClaim", names.checkpoints(name))]
    assert now["metadata"]["uid"] == pvc["metadata"]["uid"] and now["status"]["phase"] == "Bound"
    on_volume = driver.checkpoint_steps(name)
    assert on_volume and on_volume[-1] >= 2, on_volume
    time.sleep(2 * driver.platform.resync_seconds)  # a suspended job stays suspended across resyncs
    assert driver.status(name)["phase"] == "Suspended" and not driver.pods(name, "trainer")

    driver.kubectl("patch", "rftjob", name, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    st = driver.wait_phase(name, "Succeeded", START_S + FINISH_S)
    assert_finished(st, steps)
    assert st["restarts"] == 0, "a suspension is not a failure"
    suspended = driver.condition(name, "Suspended")
    assert suspended["status"] == "False" and suspended["reason"] == "Resumed", suspended
    first, second = trainer_attempt_logs(trainer_logs)
    resumed = RESUMED_LINE.search(second)
    assert resumed and int(resumed.group(1)) == on_volume[-1], (on_volume, second[-2000:])
    assert logged_steps(second) == list(range(on_volume[-1] + 1, steps + 1)), logged_steps(second)
    assert_every_step_once(driver, name, steps)


# -------------------------------------------------------------------------------------- sandbox


def test_code_sandbox_without_its_seccomp_profile_on_the_node_fails_fast(driver: JobDriver) -> None:
    """The node lacks the seccomp profile the chart ships for the code sandbox (a platform team that did
    not install it): the kubelet cannot create the reward container (``CreateContainerError``), and the
    operator fails the job at once with reason ``SandboxUnavailable`` naming the profile, and removes its
    workloads, instead of waiting on a pod that can never start. The profile is put back afterwards."""
    profile = driver.node.workdir / "kubelet" / "seccomp" / "rft" / "code-sandbox.json"
    saved = profile.read_bytes()
    profile.unlink()
    try:
        driver.apply_file(EXAMPLES / "04-code-sandbox.yaml")
        name = "code-sandbox"
        st = driver.wait_phase(name, "Failed", START_S)
        failed = driver.condition(name, "Failed")
        assert failed["status"] == "True" and failed["reason"] == "SandboxUnavailable", failed
        assert "code_sandbox" in failed["message"] and "rft/code-sandbox.json" in failed["message"], failed
        assert st["step"] == 0 and st["restarts"] == 0, st
        wait_for("the workloads to be removed", lambda: not any(
            k[0] in ("Deployment", "Job") for k in driver.children(name)), 120,
            on_timeout=lambda: driver.diagnostics(name))
    finally:
        profile.write_bytes(saved)
