"""Monitoring as installed, on the real node: a real Prometheus (``hack/prometheus.sh``: built from the Go
module proxy, run as a pod from an image FROM scratch) in namespace ``monitoring`` finds a live job's pods
and the operator with Kubernetes service discovery, relabelled as the Prometheus Operator turns the
chart's PodMonitor and ServiceMonitor into scrape configs, and scrapes them through the job's
NetworkPolicies, which admit it because the operator is installed with ``metrics.scrapeFrom`` naming
that namespace and Prometheus's pod label.

Every query of the chart's Grafana dashboard, its variables filled in for the job, returns data; the
series keep Prometheus's own target labels (``job``, ``namespace``, ``pod``) beside ``rft_job`` and
``rft_namespace``: nothing overwrites them.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from e2e.cluster import LocalCluster
from e2e.node import LocalNode
from tests.e2e.stack import (
    EXAMPLES,
    ROOT,
    JobDriver,
    Platform,
    example_job,
    install_platform,
    uninstall_platform,
)
from tests.support import prereqs
from tests.support.polling import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

DASHBOARD = ROOT / "charts" / "rft-operator" / "files" / "dashboards" / "rft-jobs.json"
MONITORING = "monitoring"
PROMETHEUS_LABELS = {"app.kubernetes.io/name": "prometheus"}
POD_MONITOR_JOB = "podMonitor/rft-system/rft-operator-jobs"
SERVICE_MONITOR_JOB = "serviceMonitor/rft-system/rft-operator"


def _prometheus(*args: str) -> Path:
    """``hack/prometheus.sh [--image]``: the binary (built once; cold, minutes of Go) or its image's archive."""
    p = subprocess.run(["bash", str(ROOT / "hack" / "prometheus.sh"), *args], capture_output=True, text=True,
                       timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"hack/prometheus.sh {' '.join(args)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return Path(p.stdout.strip().splitlines()[-1])


# Built (or a background hack/prepare.sh waited for) before the first test that needs it, outside its timeout.
_BINARY = prereqs.register("prometheus (hack/prometheus.sh)", rank=4, wanted=prereqs.uses_fixture("prometheus"),
                           build=_prometheus)


def _prometheus_archive() -> tuple[str, Path]:
    """The image's reference and its oci-archive (FROM scratch: the binary; seconds)."""
    _BINARY.get()
    archive = _prometheus("--image")
    version = archive.name.removeprefix("prometheus-").removesuffix(".oci")
    return f"localhost/rft-test/prometheus:{version}", archive


def _scrape_config(platform_namespace: str) -> dict[str, Any]:
    """What the Prometheus Operator makes of the chart's PodMonitor (every pod the operator manages, on
    its ``http`` and ``coordinator`` ports) and ServiceMonitor (the operator's ``metrics`` port): pod
    discovery, kept by label and port name, target labels namespace/pod/container."""
    targets = [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
    ]
    return {
        "global": {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "2s"},
        "scrape_configs": [
            {"job_name": POD_MONITOR_JOB, "kubernetes_sd_configs": [{"role": "pod"}],
             "relabel_configs": [
                 {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_managed_by"],
                  "regex": "rft-operator", "action": "keep"},
                 {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "http|coordinator",
                  "action": "keep"},
                 *targets]},
            {"job_name": SERVICE_MONITOR_JOB,
             "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": [platform_namespace]}}],
             "relabel_configs": [
                 {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"], "regex": "rft-operator",
                  "action": "keep"},
                 {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "metrics",
                  "action": "keep"},
                 *targets]},
        ],
    }


def _prometheus_docs(image: str, platform_namespace: str) -> list[dict[str, Any]]:
    meta = {"name": "prometheus", "namespace": MONITORING, "labels": PROMETHEUS_LABELS}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "rft-test-prometheus"},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "rft-test-prometheus"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "rft-test-prometheus"},
         "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": MONITORING}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
         "data": {"prometheus.yml": yaml.safe_dump(_scrape_config(platform_namespace))}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {
            "serviceAccountName": "prometheus",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "prometheus", "image": image, "imagePullPolicy": "Never",
                "args": ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/data",
                         "--web.listen-address=:9090"],
                "ports": [{"name": "web", "containerPort": 9090}],
                "readinessProbe": {"httpGet": {"path": "/-/ready", "port": "web"}, "periodSeconds": 2},
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": "config", "mountPath": "/etc/prometheus"},
                                 {"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "config", "configMap": {"name": "prometheus"}}, {"name": "data", "emptyDir": {}}]}},
    ]


class Prometheus:
    """The Prometheus pod's HTTP API, reached at its pod IP."""

    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body.get("status") == "success", (expr, r.status_code, body)
        return body["data"]["result"]

    def targets(self) -> list[dict[str, Any]]:
        return httpx.get(f"{self.url}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]


@pytest.fixture(scope="module")
def platform(cluster: LocalCluster, on_real_node: LocalNode, node_images: dict[str, Path]) -> Iterator[Platform]:
    """The operator, its jobs' NetworkPolicies admitting the ``monitoring`` namespace's Prometheus pods to
    every role's metrics port (chart value ``metrics.scrapeFrom``)."""
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": MONITORING}},
            "podSelector": {"matchLabels": PROMETHEUS_LABELS}}
    p = install_platform(cluster, on_real_node, resync_seconds=3, values={"metrics.scrapeFrom": [peer]})
    try:
        yield p
    finally:
        uninstall_platform(p)


@pytest.fixture(scope="module")
def prometheus(cluster: LocalCluster, on_real_node: LocalNode, platform: Platform) -> Iterator[Prometheus]:
    image, archive = _prometheus_archive()
    on_real_node.import_image(archive)
    cluster.kubectl("create", "namespace", MONITORING, check=False)
    docs = yaml.safe_dump_all(_prometheus_docs(image, platform.namespace))
    cluster.kubectl("apply", "-f", "-", input=docs, timeout=60)
    try:
        ready = cluster.kubectl("wait", "--for=condition=Ready", "pod/prometheus", "-n", MONITORING,
                                "--timeout=120s", timeout=150, check=False)
        if ready.returncode != 0:
            described = cluster.kubectl("describe", "pod", "prometheus", "-n", MONITORING, check=False).stdout
            logs = cluster.kubectl("logs", "prometheus", "-n", MONITORING, "--tail=40", check=False)
            pytest.fail(f"the Prometheus pod is not Ready:\n{described[-3000:]}\n{logs.stdout}{logs.stderr}",
                        pytrace=False)
        pod = json.loads(cluster.kubectl("get", "pod", "prometheus", "-n", MONITORING, "-o", "json").stdout)
        yield Prometheus(f"http://{pod['status']['podIP']}:9090")
    finally:
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false", input=docs, check=False, timeout=60)


def dashboard_queries(job: str, namespace: str) -> list[tuple[str, str]]:
    """(panel title or variable, PromQL) of every query of the shipped dashboard, its variables filled in
    as Grafana would for this job."""
    doc = json.loads(DASHBOARD.read_text())
    out = [(p["title"], t["expr"]) for p in doc["panels"] for t in p.get("targets", [])]
    for v in doc["templating"]["list"]:
        if v["type"] == "query":  # label_values(METRIC{...}, LABEL) is Grafana's: the series of METRIC{...}
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["query"])
            assert m, v["query"]
            out.append((f"variable {v['name']}", m.group(1)))
    # Kubernetes names hold no regex metacharacter but "." (harmless here); PromQL strings accept no "\-"
    fill = {"$job": job, "$namespace": namespace, "$__rate_interval": "1m"}
    return [(title, re.sub(r"\$(job|namespace|__rate_interval)\b", lambda m: fill[m.group(0)], expr))
            for title, expr in out]


@pytest.mark.timeout(1200)
def test_a_real_prometheus_scrapes_a_live_job_and_every_dashboard_query_returns_data(
        driver: JobDriver, prometheus: Prometheus) -> None:
    name = "watched"
    # every role that serves metrics: the code sandbox scores in a reward role; a KL penalty (its panel);
    # long enough to be scraped while it trains (deleted at the end)
    docs = example_job(EXAMPLES / "04-code-sandbox.yaml", name, trainer={"maxSteps": 400, "kl": {"coef": 0.05}})
    driver.apply_docs(docs)
    driver.wait_step(name, 3, 420)
    ns = driver.namespace

    def scraped() -> list[dict[str, Any]] | None:
        up = [t for t in prometheus.targets() if t["labels"].get("namespace") == ns and t["health"] == "up"]
        roles = {role for t in up for role in ("trainer", "inference", "reward") if f"{name}-{role}-" in t["labels"]["pod"]}
        series = prometheus.query(f'rft_trainer_reward_mean{{rft_job="{name}",rft_namespace="{ns}"}}')
        return up if series and roles == {"trainer", "inference", "reward"} else None

    def why() -> str:
        targets = [(t["labels"].get("pod"), t["scrapeUrl"], t["health"], t["lastError"]) for t in prometheus.targets()]
        policies = driver.kubectl("get", "networkpolicy", "-o", "yaml", check=False).stdout
        return json.dumps(targets, indent=1) + "\n" + policies[-6000:]

    up = wait_for("Prometheus scraping the job's trainer, inference and reward pods", scraped, 180, interval=2,
                  on_timeout=why)
    assert all(t["labels"]["job"] == POD_MONITOR_JOB for t in up), up
    time.sleep(20)  # rate()s need two samples of each counter after it first moved

    empty = []
    for title, expr in dashboard_queries(name, ns):
        result = prometheus.query(expr)
        if not result:
            empty.append(f"{title}: {expr}")
    assert not empty, "dashboard queries with no data:\n" + "\n".join(empty)

    # the target labels are Prometheus's own, the job's identity in rft_* labels beside them
    (series, *_) = prometheus.query(f'rft_trainer_reward_mean{{rft_job="{name}"}}')
    labels = series["metric"]
    assert labels["job"] == POD_MONITOR_JOB and labels["namespace"] == ns and labels["rft_namespace"] == ns, labels
    assert labels["rft_job"] == name and labels["pod"].startswith(name), labels
    operator = prometheus.query('rft_operator_jobs{rft_role="operator"}')
    assert operator and all(s["metric"]["job"] == SERVICE_MONITOR_JOB for s in operator), operator
    driver.kubectl("delete", "rftjob", name, "--wait=false", check=False)
