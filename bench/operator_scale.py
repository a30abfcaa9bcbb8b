"""The operator at scale on the local control plane (no node, no pods): converge, idle, storm, delete.

    python bench/operator_scale.py [--jobs 500] [--quick] [--out bench/results/operator_scale.json]

A private control plane (etcd, kube-apiserver with an audit log of the operator's requests,
kube-controller-manager with the garbage collector and the ServiceAccount controller only: no
Deployment/Job controllers, so no pods)
and the operator as a separate process (``rft-operator``, one namespace, leader election on as in
the chart, its own ServiceAccount bound to exactly its rules), then:

1. ``raw_apply_s``: the baseline, in namespace ``raw`` (not watched): the jobs created at
   ``--rate``/s while a plain pool of ``--concurrency`` threads applies each job's children, built
   by the operator's own builders, and writes one status: the least any operator must do;
2. ``converge_s``: the same jobs created at ``--rate``/s in namespace ``bench`` until every job has
   every child and a status phase;
3. ``--idle`` seconds of nothing: the operator's requests (audit log) in that window;
4. a storm: each job's progress ConfigMap patched once (as its trainer would); the latency from the
   patch to the RFTJob's ``status.step`` (a watch), p50/p99;
5. every job deleted: ``delete_s`` until the RFTJobs are gone.

Keys of the JSON: jobs, converge_s, raw_apply_s, converge_ratio_vs_raw_apply, idle_requests_per_s,
idle_mutating_requests (and the same without the Lease renewals of leader election),
status_latency_p50_s, status_latency_p99_s, operator_rss_peak_mb, api_requests_by_verb (the
operator's, over the whole run), plus phase timings and parameters; ``ratios``:
``converge_ratio_vs_raw_apply``; ``machine`` and ``started`` as every benchmark records them (bench/_report.py).

Goals (docs/operator.md, "Cost at scale"): ``converge_s`` <= 60 and ``converge_ratio_vs_raw_apply`` <= 1.5;
``idle_requests_per_s`` <= 1 with ``idle_mutating_requests_excluding_lease`` 0; ``status_latency_p99_s`` <= 5;
``operator_rss_peak_mb`` <= 200.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import copy
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import _report
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from e2e.cluster import LocalCluster  # noqa: E402
from rft_api.job import parse_manifest  # noqa: E402
from rft_api.progress import Progress  # noqa: E402
from rft_operator import names  # noqa: E402
from rft_operator.builders import BuildContext, desired_children  # noqa: E402
from rft_operator.kube import CHILD_KINDS, Kube  # noqa: E402
from rft_operator.observe import observe  # noqa: E402
from rft_operator.permissions import LEADER_ELECTION_RULES, OPERATOR_RULES  # noqa: E402
from rft_operator.status import compute_status, status_dict  # noqa: E402
from rft_operator.timeutil import now as utcnow  # noqa: E402

EXAMPLE = ROOT / "examples" / "01-tiny-arith.yaml"
SERVICE_RANGE = "10.0.0.0/16"
OPERATOR_USER = "system:serviceaccount:rft-system:rft-operator"
MUTATING = {"create", "update", "patch", "delete", "deletecollection"}
AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
                "rules": [{"level": "Metadata", "users": [OPERATOR_USER]}, {"level": "None"}]}


class AuditedCluster(LocalCluster):
    """The local control plane with an audit log of the operator's requests and room for many Services."""

    def _apiserver_args(self) -> list[str]:
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        # a /16 of Service IPs: 5000 jobs have more ClusterIP Services than the default /24 holds
        args = [a if not a.startswith("--service-cluster-ip-range=") else f"--service-cluster-ip-range={SERVICE_RANGE}"
                for a in super()._apiserver_args()]
        return [*args, f"--audit-policy-file={policy}",
                f"--audit-log-path={self.workdir / 'audit.log'}", "--audit-log-format=json",
                "--audit-log-mode=blocking", "--max-requests-inflight=800", "--max-mutating-requests-inflight=400"]


def audit_events(cluster: LocalCluster) -> list[dict]:
    """One record per request (by auditID, its last stage), with its receive time as epoch seconds."""
    path = cluster.workdir / "audit.log"
    seen: dict[str, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            seen[e["auditID"]] = e
    out = []
    for e in seen.values():
        t = e.get("requestReceivedTimestamp", "")
        try:
            import datetime as dt
            ts = dt.datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
        out.append({"verb": e.get("verb", ""), "resource": (e.get("objectRef") or {}).get("resource", ""),
                    "t": ts})
    return out


def job_doc(name: str, namespace: str) -> dict:
    doc = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    doc["metadata"] = {"name": name, "namespace": namespace}
    return doc


def create_at_rate(api: Kube, namespace: str, n: int, rate: float, on_created=None) -> None:
    t0 = time.monotonic()
    for i in range(n):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        obj = api.create(job_doc(f"j{i:05d}", namespace))
        if on_created is not None:
            on_created(obj)


def children_count(api: Kube, namespace: str) -> Counter:
    """Children per job (by instance label), over every child kind."""
    c: Counter = Counter()
    for kind in CHILD_KINDS:
        for o in api.list(kind, namespace, names.MANAGED_SELECTOR):
            c[(o["metadata"].get("labels") or {}).get(names.LABEL_INSTANCE, "")] += 1
    return c


def wait_converged(api: Kube, namespace: str, n: int, want_children: int, timeout: float) -> float:
    """Seconds until every job has ``want_children`` children and a status phase."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        jobs = api.list("RFTJob", namespace)
        phased = sum(1 for j in jobs if (j.get("status") or {}).get("phase"))
        if len(jobs) == n and phased == n:
            counts = children_count(api, namespace)
            if sum(1 for j in jobs if counts[j["metadata"]["name"]] >= want_children) == n:
                return time.monotonic()
        time.sleep(0.5)
    raise TimeoutError(f"{namespace}: not converged in {timeout}s")


def raw_apply(api: Kube, n: int, rate: float, concurrency: int, want_children: int, timeout: float) -> float:
    """The baseline: jobs created at ``rate``, each one's children applied and a status written by a
    plain pool; returns the seconds until all is done."""
    pool = cf.ThreadPoolExecutor(concurrency)
    futures = []

    def apply_job(obj: dict) -> None:
        job = parse_manifest(obj)
        for child in desired_children(job, BuildContext()):
            api.apply(child)
        st = compute_status(job, observe(job.name, [], utcnow()))
        api.replace_status("RFTJob", "raw", job.name, status_dict(st))

    t0 = time.monotonic()
    create_at_rate(api, "raw", n, rate, on_created=lambda o: futures.append(pool.submit(apply_job, o)))
    for f in futures:
        f.result(timeout=timeout)
    pool.shutdown()
    return time.monotonic() - t0


def rss_peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def storm(api: Kube, cluster: LocalCluster, namespace: str, n: int, concurrency: int, timeout: float) -> list[float]:
    """Patch each job's progress once; the latency until its status shows the step."""
    from kubernetes import client, config, watch

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=cfg)
    custom = client.CustomObjectsApi(client.ApiClient(cfg))
    step = 7
    patched: dict[str, float] = {}
    seen: dict[str, float] = {}
    lock = threading.Lock()
    rv = api.request("GET", f"/apis/rft.dev/v1alpha1/namespaces/{namespace}/rftjobs", query=[("limit", "1")])[
        "metadata"]["resourceVersion"]
    stop = threading.Event()

    def watcher() -> None:
        w = watch.Watch()
        for ev in w.stream(custom.list_namespaced_custom_object, "rft.dev", "v1alpha1", namespace, "rftjobs",
                           resource_version=rv, timeout_seconds=int(timeout)):
            obj = ev["object"]
            if (obj.get("status") or {}).get("step") == step:
                name = obj["metadata"]["name"]
                with lock:
                    seen.setdefault(name, time.monotonic())
                    if len(seen) >= n:
                        break
            if stop.is_set():
                break
        w.stop()

    th = threading.Thread(target=watcher, daemon=True)
    th.start()
    time.sleep(0.5)
    data = Progress.model_validate({"step": step, "totalSteps": 30, "policyVersion": step, "rewardMean": 0.5,
                                    "samplesScored": 64}).to_data()

    def patch(i: int) -> None:
        name = f"j{i:05d}"
        api.patch("ConfigMap", namespace, names.progress(name), {"data": data})
        with lock:
            patched[name] = time.monotonic()

    with cf.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(patch, range(n)))
    th.join(timeout)
    stop.set()
    missing = [k for k in patched if k not in seen]
    if missing:
        raise TimeoutError(f"{len(missing)} jobs never showed the step in their status (e.g. {missing[:3]})")
    return sorted(max(0.0, seen[k] - patched[k]) for k in patched)


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def setup_operator_identity(cluster: LocalCluster, api: Kube, workdir: Path) -> Path:
    api.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "rft-operator", "namespace": "rft-system"}})
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    api.request("POST", f"{rbac}/clusterroles", body={"apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole", "metadata": {"name": "rft-operator"}, "rules": OPERATOR_RULES})
    api.request("POST", f"{rbac}/clusterrolebindings", body={
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "rft-operator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "rft-operator"},
        "subjects": [{"kind": "ServiceAccount", "name": "rft-operator", "namespace": "rft-system"}]})
    api.request("POST", f"{rbac}/namespaces/rft-system/roles", body={
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "leader-election"},
        "rules": LEADER_ELECTION_RULES})
    api.request("POST", f"{rbac}/namespaces/rft-system/rolebindings", body={
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "leader-election"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "leader-election"},
        "subjects": [{"kind": "ServiceAccount", "name": "rft-operator", "namespace": "rft-system"}]})
    return cluster.service_account_kubeconfig("rft-system", "rft-operator", workdir / "operator.kubeconfig")


def run(args: argparse.Namespace) -> dict[str, Any]:
    n = args.jobs
    with tempfile.TemporaryDirectory(prefix="rft-bench-") as tmp:
        workdir = Path(tmp)
        cluster = AuditedCluster(workdir / "cluster", controllers=("garbage-collector-controller", "serviceaccount-controller"),
                                 die_with_parent=True)
        cluster.start(timeout=300)
        op: Optional[subprocess.Popen] = None
        try:
            cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "crds" / "rftjob.yaml"))
            api = Kube.from_kubeconfig(str(cluster.kubeconfig))
            deadline = time.monotonic() + 60
            while not any(c.get("type") == "Established" and c.get("status") == "True" for c in (
                    (api.get("CustomResourceDefinition", None, "rftjobs.rft.dev") or {}).get("status") or {}).get(
                    "conditions") or []):
                if time.monotonic() > deadline:
                    raise TimeoutError("the CRD is not Established")
                time.sleep(0.5)
            api.api_client.configuration.connection_pool_maxsize = args.concurrency * 2
            for ns in ("raw", "bench", "rft-system"):
                cluster.kubectl("create", "namespace", ns)
            op_kubeconfig = setup_operator_identity(cluster, api, workdir)
            want_children = len(desired_children(parse_manifest({**job_doc("x", "raw"),
                                                                  "metadata": {"name": "x", "namespace": "raw",
                                                                               "uid": "u"}}), BuildContext()))

            # 1. the baseline
            raw_s = raw_apply(api, n, args.rate, args.concurrency, want_children, args.timeout)
            print(f"raw apply of {n} jobs: {raw_s:.1f}s", flush=True)

            # 2. the operator
            log = open(workdir / "operator.log", "w")
            op = subprocess.Popen(
                [sys.executable, "-m", "rft_operator.main", "--kubeconfig", str(op_kubeconfig), "-n", "bench",
                 "--metrics-port", "-1", "--resync-seconds", str(args.resync), "--leader-election-namespace",
                 "rft-system", "--max-concurrent-reconciles", str(args.concurrency), "--log-level", "WARNING"],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "runtime"),
                                                                   os.environ.get("PYTHONPATH", "")])})
            deadline = time.monotonic() + 60
            while not ((api.get("Lease", "rft-system", "rft-operator") or {}).get("spec") or {}).get("holderIdentity"):
                if time.monotonic() > deadline or op.poll() is not None:
                    raise RuntimeError(f"the operator did not start: {(workdir / 'operator.log').read_text()[-3000:]}")
                time.sleep(0.5)
            time.sleep(2)  # primed and watching
            t0 = time.monotonic()
            create_at_rate(api, "bench", n, args.rate)
            converged = wait_converged(api, "bench", n, want_children, args.timeout)
            converge_s = converged - t0
            print(f"operator converged {n} jobs: {converge_s:.1f}s", flush=True)

            # 3. idle
            time.sleep(args.settle)
            idle_from = time.time()
            time.sleep(args.idle)
            idle_to = time.time()
            events = audit_events(cluster)
            idle = [e for e in events if idle_from <= e["t"] < idle_to]
            idle_mut = [e for e in idle if e["verb"] in MUTATING]
            print(f"idle {args.idle}s: {len(idle)} requests, {len(idle_mut)} mutating", flush=True)

            # 4. storm
            lat = storm(api, cluster, "bench", n, args.concurrency, args.timeout)
            print(f"storm: p50 {percentile(lat, 0.5):.2f}s p99 {percentile(lat, 0.99):.2f}s", flush=True)

            # 5. delete
            t1 = time.monotonic()
            api.request("DELETE", "/apis/rft.dev/v1alpha1/namespaces/bench/rftjobs", body={
                "kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"})
            while api.list("RFTJob", "bench"):
                if time.monotonic() - t1 > args.timeout:
                    raise TimeoutError("the RFTJobs were not deleted")
                time.sleep(0.5)
            delete_s = time.monotonic() - t1
            rss = rss_peak_mb(op.pid)
            events = audit_events(cluster)
            by_verb = Counter(e["verb"] for e in events)
            by_resource = Counter(f'{e["verb"]} {e["resource"]}' for e in idle)
            api.close()
            return {
                "jobs": n, "converge_s": round(converge_s, 2), "raw_apply_s": round(raw_s, 2),
                "converge_ratio_vs_raw_apply": round(converge_s / raw_s, 3) if raw_s else None,
                "idle_window_s": args.idle,
                "idle_requests_per_s": round(len(idle) / args.idle, 3),
                "idle_mutating_requests": len(idle_mut),
                "idle_mutating_requests_excluding_lease": sum(1 for e in idle_mut if e["resource"] != "leases"),
                "idle_requests_by_verb_and_resource": dict(sorted(by_resource.items())),
                "status_latency_p50_s": round(percentile(lat, 0.5), 3),
                "status_latency_p99_s": round(percentile(lat, 0.99), 3),
                "status_latency_max_s": round(lat[-1], 3) if lat else None,
                "delete_s": round(delete_s, 2),
                "operator_rss_peak_mb": round(rss, 1),
                "api_requests_by_verb": dict(sorted(by_verb.items())),
                "api_requests_total": len(events),
                "params": {"rate_per_s": args.rate, "concurrency": args.concurrency, "resync_s": args.resync,
                           "leader_election": True, "nodes": 0, "pods": 0, "cpus": os.cpu_count()},
            }
        finally:
            if op is not None and op.poll() is None:
                os.killpg(op.pid, signal.SIGTERM)
                try:
                    op.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(op.pid, signal.SIGKILL)
            cluster.stop()


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--quick", action="store_true", help="20 jobs, 15 s idle: a smoke run (make test runs it)")
    ap.add_argument("--rate", type=float, default=100.0, help="RFTJobs created per second")
    ap.add_argument("--concurrency", type=int, default=8, help="operator reconciles and baseline threads")
    ap.add_argument("--resync", type=float, default=10.0, help="the operator's --resync-seconds")
    ap.add_argument("--idle", type=float, default=60.0, help="seconds of the idle window")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds between converging and the idle window")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "operator_scale.json")
    a = ap.parse_args(argv)
    if a.quick:
        a.jobs, a.idle, a.timeout = min(a.jobs, 20), 15.0, min(a.timeout, 300.0)
    head = {"benchmark": "operator_scale", "quick": a.quick, "machine": _report.machine(), "started": _report.started()}
    result = run(a)
    report = {**head, **result, "ratios": {"converge_ratio_vs_raw_apply": result["converge_ratio_vs_raw_apply"]}}
    _report.write(a.out, report, show=report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
