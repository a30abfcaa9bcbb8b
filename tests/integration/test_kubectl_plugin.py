"""``kubectl rft`` against the local cluster: found by kubectl as a plugin (``kubectl-rft`` on PATH),
reading a job the operator reconciles and the progress record a trainer writes."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rft_api.progress import CurvePoint, Progress, ProgressCheckpoint
from rft_operator import names
from tests.operator.cluster_support import (  # noqa: F401
    api,
    crd,
    create_job,
    get_job,
    job_manifest,
    make_role_ready,
    operator,
    wait_phase,
)
from tests.support.polling import wait_for

pytestmark = pytest.mark.cluster
PLUGIN = shutil.which("kubectl-rft", path=str(Path(sys.executable).parent))


def kubectl_rft(cluster, namespace: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``kubectl rft ...`` through kubectl's plugin discovery (the venv's bin on PATH)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
           "KUBECONFIG": str(cluster.kubeconfig)}
    r = subprocess.run([cluster.binary("kubectl"), "rft", "-n", namespace, *args], capture_output=True, text=True,
                       env=env, timeout=60)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def write_progress(api, namespace: str, job: str, progress: Progress) -> None:
    """What the trainer does: patch its progress ConfigMap."""
    api.patch("ConfigMap", namespace, names.progress(job), {"data": progress.to_data()})


def test_status_suspend_resume_and_curve(cluster, api, operator, namespace, tmp_path) -> None:
    assert PLUGIN, "kubectl-rft is not installed in the venv (pip install -e .)"
    create_job(api, namespace, job_manifest("arith"))
    for role in ("inference", "rollout", "trainer"):
        make_role_ready(api, namespace, "arith", role)
    wait_phase(api, namespace, "arith", "Running")
    curve = [CurvePoint(step=s, mean=0.2 + 0.05 * s, std=0.1) for s in range(1, 9)]
    write_progress(api, namespace, "arith", Progress(
        step=8, total_steps=30, policy_version=8, reward_mean=0.6, reward_std=0.1, samples_scored=512,
        checkpoints=[ProgressCheckpoint(step=8, path="step-8")], reward_curve=curve,
        domain_rewards={"math": 0.6, "code": 0.4}, eval_score=0.55, eval_domain_scores={"math": 0.7, "code": 0.3}))
    wait_for("status step 8", lambda: (get_job(api, namespace, "arith").get("status") or {}).get("step") == 8)

    out = kubectl_rft(cluster, namespace, "status", "arith").stdout
    assert f"{namespace}/arith: Running" in out and "step        8/30" in out
    assert "reward      0.600 ± 0.100" in out and "▁" in out and "█" in out  # the rising trend, as a sparkline
    assert "by domain   code 0.400   math 0.600" in out and "checkpoint  step 8 at step-8" in out
    assert "eval score  0.550" in out and "eval by domain  code 0.300   math 0.700" in out
    assert "roles       inference 1/1" in out

    r = kubectl_rft(cluster, namespace, "suspend", "arith")
    assert get_job(api, namespace, "arith")["spec"]["suspend"] is True and "Argo CD" not in r.stderr
    wait_phase(api, namespace, "arith", "Suspended")
    # an object Argo CD tracks: the change is made, with a warning that Git is where it belongs
    api.patch("RFTJob", namespace, "arith", {"metadata": {"annotations": {
        "argocd.argoproj.io/tracking-id": f"ml:rft.dev/RFTJob:{namespace}/arith"}}})
    r = kubectl_rft(cluster, namespace, "resume", "arith")
    assert get_job(api, namespace, "arith")["spec"]["suspend"] is False
    assert "managed by Argo CD (argocd.argoproj.io/tracking-id)" in r.stderr and "spec.suspend in Git" in r.stderr
    wait_for("resumed", lambda: (get_job(api, namespace, "arith").get("status") or {}).get("phase") != "Suspended")

    png = tmp_path / "curve.png"
    assert "8 steps" in kubectl_rft(cluster, namespace, "curve", "arith", "-o", str(png)).stdout
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(data[16:20], "big") > 100  # a real image


def test_errors_name_what_is_missing(cluster, api, crd, namespace) -> None:
    r = kubectl_rft(cluster, namespace, "status", "nope", check=False)
    assert r.returncode == 1 and "RFTJob nope not found in namespace" in r.stderr
    create_job(api, namespace, job_manifest("fresh"))
    r = kubectl_rft(cluster, namespace, "curve", "fresh", "-o", "/dev/null", check=False)
    assert r.returncode == 1 and "no reward curve yet" in r.stderr
    r = kubectl_rft(cluster, namespace, "logs", "fresh", "--role", "reward", check=False)
    assert r.returncode == 1 and "has no reward pod" in r.stderr
    r = kubectl_rft(cluster, namespace, "export", "fresh", "/tmp/unused-export-dir", check=False)
    assert r.returncode == 1 and "fresh has no final model" in r.stderr and "Succeeds" in r.stderr


def test_export_refuses_an_archive_that_escapes_its_directory(tmp_path) -> None:
    """``kubectl rft export`` unpacks what the pod streams, but never outside the target directory, and
    never a link or device (the claim's contents are the trainer's, the tar stream is not trusted)."""
    import io
    import tarfile

    from rft_runtime.kubectl import PluginError, export_source, unpack

    def archive(*members: tuple[str, bytes | None, bytes]) -> io.BytesIO:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, link, data in members:
                info = tarfile.TarInfo(name)
                if link is not None:
                    info.type, info.linkname = tarfile.SYMTYPE, link.decode()
                else:
                    info.size = len(data)
                tar.addfile(info, io.BytesIO(data) if link is None else None)
        buf.seek(0)
        return buf

    good = tmp_path / "good"
    good.mkdir()
    assert unpack(archive(("./config.json", None, b"{}"), ("./sub/w.safetensors", None, b"x")), good) == [
        "config.json", "sub/w.safetensors"]
    assert (good / "sub" / "w.safetensors").read_bytes() == b"x"
    for bad in (archive(("../escape", None, b"x")), archive(("./link", b"/etc/passwd", b""))):
        d = tmp_path / f"bad{id(bad)}"
        d.mkdir()
        with pytest.raises(PluginError, match="not a file or directory inside"):
            unpack(bad, d)
    assert not (tmp_path / "escape").exists()

    job = {"metadata": {"name": "j"}, "status": {"phase": "Succeeded", "finalModel": {
        "claim": "j-checkpoints", "path": "final", "format": "lora"}}}
    assert export_source(job, merged=False) == ("j-checkpoints", "final")
    with pytest.raises(PluginError, match="without a merged copy"):
        export_source(job, merged=True)
    job["status"]["finalModel"]["path"] = "../other-job"
    with pytest.raises(PluginError, match="not a directory on its claim"):
        export_source(job, merged=False)


def test_status_shows_the_evaluation() -> None:
    from rft_api.progress import EvalPoint, Progress, ProgressEvaluation
    from rft_runtime.kubectl import format_status

    job = {"metadata": {"name": "j", "namespace": "ns"}, "status": {
        "phase": "Running", "step": 12, "evaluation": {"baseline": 0.1, "step": 10, "score": 0.35, "bestStep": 10,
                                                       "bestScore": 0.35, "bestCheckpoint": "/checkpoints/step-000010"}}}
    p = Progress(evaluation=ProgressEvaluation(curve=[EvalPoint(step=0, score=0.1), EvalPoint(step=5, score=0.2),
                                                      EvalPoint(step=10, score=0.35)]))
    out = format_status(job, p)
    assert "eval score  0.350 at step 10   baseline 0.100   best 0.350 at step 10   ▁" in out
    assert "best        /checkpoints/step-000010" in out


def test_resume_retries_a_failed_job_in_place(cluster, api, operator, namespace) -> None:
    """A job failed by a trainer error that a restart cannot fix: ``kubectl rft resume`` retries it
    without deleting it. The operator starts a new trainer attempt (the failed Job goes), the job leaves
    Failed, status.retry records the failure, and the checkpoint claim is the same object."""
    from tests.operator.cluster_support import pods_of, set_pod_phase

    create_job(api, namespace, job_manifest("broken", restartLimit=2))
    make_role_ready(api, namespace, "broken", "trainer")
    (pod,) = wait_for("the trainer pod", lambda: pods_of(api, namespace, "broken", "trainer"))
    set_pod_phase(api, pod, "Failed", exit_code=2)
    wait_phase(api, namespace, "broken", "Failed", timeout=60)
    claim_uid = api.get("PersistentVolumeClaim", namespace, names.checkpoints("broken"))["metadata"]["uid"]

    r = kubectl_rft(cluster, namespace, "resume", "broken")
    assert "retried (rft.dev/retry=1): it resumes from its latest checkpoint" in r.stdout, r.stdout
    assert get_job(api, namespace, "broken")["metadata"]["annotations"]["rft.dev/retry"] == "1"
    st = wait_for("the job to leave Failed", lambda: (s := get_job(api, namespace, "broken").get("status") or {})
                  .get("phase") not in (None, "Failed") and s)
    assert st["retry"]["count"] == 1 and st["restarts"] == 1 and st["retry"]["restartsAtRetry"] == 1, st
    assert st["retry"]["failure"].startswith("TrainerTerminalError: "), st["retry"]
    wait_for("a trainer Job of attempt 1", lambda: (j := api.get("Job", namespace, names.trainer("broken"))) is not None
             and j["metadata"]["annotations"].get(names.ANNOTATION_ATTEMPT) == "1", timeout=60)
    assert api.get("PersistentVolumeClaim", namespace, names.checkpoints("broken"))["metadata"]["uid"] == claim_uid
    # resuming a job that is not Failed still means spec.suspend: false
    kubectl_rft(cluster, namespace, "resume", "broken")
    assert get_job(api, namespace, "broken")["metadata"]["annotations"]["rft.dev/retry"] == "1"
