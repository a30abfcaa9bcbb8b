"""High availability: two operator processes elect one leader through a Lease; killing the leader
(SIGKILL: no release) hands over within 30 s and the job goes on being reconciled; a leader that
stops cleanly releases the Lease at once."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from rft_operator.leader import LEASE_NAME
from tests.operator.cluster_support import ROOT, api, crd, create_job, get_job, job_manifest, wait_phase  # noqa: F401
from tests.support.polling import wait_for

pytestmark = pytest.mark.cluster
JOB = "tiny-arith"


def start_operator(kubeconfig, namespace: str, name: str, log) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rft_operator.main", "--kubeconfig", str(kubeconfig), "-n", namespace,
         "--leader-election-namespace", namespace, "--metrics-port", "-1", "--resync-seconds", "2"],
        env={**os.environ, "POD_NAME": name}, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
        start_new_session=True)


def holder(api, namespace: str) -> str:
    lease = api.get("Lease", namespace, LEASE_NAME) or {}
    return (lease.get("spec") or {}).get("holderIdentity") or ""


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_killing_the_leader_hands_over(cluster, crd, api, namespace, tmp_path) -> None:
    logs = {n: open(tmp_path / f"{n}.log", "w") for n in ("op-a", "op-b", "op-c")}
    a = start_operator(cluster.kubeconfig, namespace, "op-a", logs["op-a"])
    procs = [a]
    try:
        wait_for("op-a to lead", lambda: holder(api, namespace).startswith("op-a_"), timeout=60)
        create_job(api, namespace, job_manifest(JOB))
        wait_phase(api, namespace, JOB, "Provisioning")
        b = start_operator(cluster.kubeconfig, namespace, "op-b", logs["op-b"])
        procs.append(b)
        time.sleep(8)  # op-b runs, and follows
        assert holder(api, namespace).startswith("op-a_") and b.poll() is None

        stop(a, signal.SIGKILL)
        killed = time.monotonic()
        wait_for("op-b to lead", lambda: holder(api, namespace).startswith("op-b_"), timeout=40)
        handover = time.monotonic() - killed
        assert handover <= 30, handover
        # the new leader reconciles: an edit is acted on
        api.patch("RFTJob", namespace, JOB, {"spec": {"suspend": True}})
        wait_phase(api, namespace, JOB, "Suspended", timeout=30)

        # a clean stop releases the Lease: a waiting replica takes over at once
        c = start_operator(cluster.kubeconfig, namespace, "op-c", logs["op-c"])
        procs.append(c)
        time.sleep(5)
        assert holder(api, namespace).startswith("op-b_")
        stopped = time.monotonic()
        stop(b)
        wait_for("op-c to lead", lambda: holder(api, namespace).startswith("op-c_"), timeout=20)
        assert time.monotonic() - stopped < 10
        api.patch("RFTJob", namespace, JOB, {"spec": {"suspend": False}})
        wait_phase(api, namespace, JOB, "Provisioning", timeout=30)
        lease = api.get("Lease", namespace, LEASE_NAME)
        assert lease["spec"]["leaseTransitions"] >= 2
        print(f"handover after SIGKILL: {handover:.1f}s")
    finally:
        for p in procs:
            stop(p)
        for f in logs.values():
            f.close()
        if any(p.returncode not in (0, -signal.SIGKILL) for p in procs):
            for n in logs:
                print(n, (tmp_path / f"{n}.log").read_text()[-3000:])
