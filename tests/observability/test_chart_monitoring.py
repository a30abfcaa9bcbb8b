"""The chart's monitoring objects: the dashboard ConfigMap (Grafana's sidecar label), the operator's
ServiceMonitor and the role pods' PodMonitor, rendered by the real helm binary."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from e2e.cluster import bin_dir
from rft_operator import names
from rft_operator.builders import BuildContext, desired_children
from tests.operator.support import make_job

CHART = Path(__file__).resolve().parents[2] / "charts" / "rft-operator"
EXAMPLES = CHART.parents[1] / "examples"


def render(*sets: str) -> list[dict]:
    args = [str(bin_dir() / "helm"), "template", "rft", str(CHART), "-n", "ops"]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(subprocess.run(args, capture_output=True, text=True, check=True).stdout) if d]


def test_dashboard_configmap_is_labelled_for_grafanas_sidecar() -> None:
    docs = render()
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(cm["data"]["rft-jobs.json"])
    assert dash["uid"] == "rft-jobs" and len(dash["panels"]) >= 10
    assert not [d for d in docs if d["kind"] in ("ServiceMonitor", "PodMonitor")]  # off by default
    assert not [d for d in render("monitoring.dashboard.enabled=false") if d["kind"] == "ConfigMap"]


def test_monitors_scrape_the_operator_and_every_role_port_without_overriding_prometheus_labels() -> None:
    docs = render("monitoring.serviceMonitor.enabled=true", "monitoring.podMonitor.enabled=true",
                  "watchNamespaces={team-a,team-b}")
    (sm,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    (pm,) = [d for d in docs if d["kind"] == "PodMonitor"]
    (svc,) = [d for d in docs if d["kind"] == "Service"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
    assert pm["spec"]["selector"]["matchLabels"] == {names.LABEL_MANAGED_BY: names.MANAGED_BY}
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    # the ports the builders give role containers that serve /metrics: inference and reward "http", trainer "coordinator"
    ports = set()
    for example in sorted(EXAMPLES.glob("*.yaml")):
        (doc,) = [d for d in yaml.safe_load_all(example.read_text()) if d and d.get("kind") == "RFTJob"]
        ports |= {p["name"] for o in desired_children(make_job(doc), BuildContext()) if o["kind"] in ("Deployment", "Job")
                  for c in o["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
    # (the trainer's "rendezvous" port is torch.distributed's, not an HTTP server: not scraped)
    scraped = {e["port"] for e in pm["spec"]["podMetricsEndpoints"]}
    assert scraped == {"http", "coordinator"} and scraped <= ports and ports - scraped == {"rendezvous"}
    # the series carry rft_job, rft_namespace, rft_role: no honorLabels, Prometheus's own target labels stay
    assert not any(e.get("honorLabels") for e in [*pm["spec"]["podMetricsEndpoints"], *sm["spec"]["endpoints"]])


def test_the_charts_dns_ports_reach_the_operator_as_it_parses_them() -> None:
    """``network.dnsPorts`` becomes ``--dns-port`` flags that the operator's own parser reads back."""
    from rft_operator.main import config_from_args, parse_args

    def dns_ports(*sets: str) -> tuple[int, ...]:
        (dep,) = [d for d in render(*sets) if d["kind"] == "Deployment"]
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        return config_from_args(parse_args(container["args"])).dns_ports

    assert dns_ports() == (53, 5353)
    assert dns_ports("network.dnsPorts={1053}") == (1053,)
    bad = subprocess.run([str(bin_dir() / "helm"), "template", "rft", str(CHART), "--set", "network.dnsPorts={0}"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "dnsPorts" in bad.stderr
