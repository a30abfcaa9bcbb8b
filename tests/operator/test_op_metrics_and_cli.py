"""Metrics served over HTTP, and the command line."""
from __future__ import annotations

import httpx
import pytest

from rft_operator.app import make_settings
from rft_operator.main import config_from_args, parse_args
from rft_operator.metrics import Metrics
from tests.support import metrics_text


def test_metrics_are_served() -> None:
    m = Metrics()
    port = m.serve(0, "127.0.0.1")
    try:
        m.reconciles.labels(result="ok").inc(3)
        m.errors.labels(kind="transient").inc()
        m.duration.observe(0.2)
        m.set_phases(["Running", "Running", "Succeeded", "Weird"])
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        m.close()
    own = {"rft_job": "local", "rft_namespace": "local", "rft_role": "operator"}  # on every series (rft_api.telemetry)
    assert metrics_text.value(text, "rft_operator_reconciles_total", result="ok", **own) == 3.0
    assert metrics_text.value(text, "rft_operator_reconcile_errors_total", kind="transient", **own) == 1.0
    assert metrics_text.value(text, "rft_operator_reconcile_duration_seconds_count", **own) == 1.0
    assert metrics_text.value(text, "rft_operator_jobs", phase="Running", **own) == 2.0
    assert metrics_text.value(text, "rft_operator_jobs", phase="Succeeded", **own) == 1.0
    assert metrics_text.value(text, "rft_operator_jobs", phase="Pending", **own) == 1.0
    assert metrics_text.value(text, "rft_operator_jobs", phase="Failed", **own) == 0.0


def test_two_metrics_instances_do_not_collide() -> None:
    Metrics(), Metrics()


def test_cli(monkeypatch) -> None:
    monkeypatch.delenv("WATCH_NAMESPACE", raising=False)
    c = config_from_args(parse_args([]))
    assert c.namespaces == () and c.metrics_port == 8080 and c.resync_seconds == 10.0
    c = config_from_args(parse_args(["-n", "a", "--namespace", "b", "--metrics-port", "-1", "--kubeconfig", "/k"]))
    assert c.namespaces == ("a", "b") and c.metrics_port is None and c.kubeconfig == "/k"
    assert c.leader_election_namespace is None and c.max_concurrent_reconciles == 8
    c = config_from_args(parse_args(["--leader-election-namespace", "ops", "--max-concurrent-reconciles", "4"]))
    assert c.leader_election_namespace == "ops" and c.max_concurrent_reconciles == 4
    monkeypatch.setenv("WATCH_NAMESPACE", "x,y")
    assert config_from_args(parse_args([])).namespaces == ("x", "y")
    assert config_from_args(parse_args(["--all-namespaces"])).namespaces == ()
    with pytest.raises(SystemExit):
        parse_args(["-n", "a", "-A"])
    with pytest.raises(SystemExit):
        parse_args(["--resync-seconds", "0"])
    assert config_from_args(parse_args([])).dns_ports == ()  # the builders' default: 53 and 5353
    c = config_from_args(parse_args(["--dns-port", "1053", "--dns-port", "53", "--dns-port", "1053"]))
    assert c.dns_ports == (1053, 53)
    with pytest.raises(SystemExit):
        parse_args(["--dns-port", "0"])
    assert config_from_args(parse_args([])).dns_cidrs == ()  # DNS to pods only
    c = config_from_args(parse_args(["--dns-cidr", "169.254.20.10", "--dns-cidr", "10.0.0.0/24",
                                     "--dns-cidr", "169.254.20.10/32", "--dns-cidr", "fd00::53"]))
    assert c.dns_cidrs == ("169.254.20.10/32", "10.0.0.0/24", "fd00::53/128")
    for bad in ("10.0.0.1/24", "dns.example", "0.0.0.0/33"):
        with pytest.raises(SystemExit):
            parse_args(["--dns-cidr", bad])


def test_the_charts_dns_cidrs_reach_the_operator_as_it_parses_them() -> None:
    """``network.dnsCIDRs`` (none by default) becomes ``--dns-cidr`` flags the operator's parser reads back."""
    import subprocess
    from pathlib import Path

    import yaml

    from e2e.cluster import bin_dir

    chart = Path(__file__).resolve().parents[2] / "charts" / "rft-operator"

    def dns_cidrs(*sets: str) -> tuple[str, ...]:
        args = [str(bin_dir() / "helm"), "template", "rft", str(chart), "-n", "ops"]
        for s in sets:
            args += ["--set", s]
        docs = yaml.safe_load_all(subprocess.run(args, capture_output=True, text=True, check=True).stdout)
        (dep,) = [d for d in docs if d and d["kind"] == "Deployment"]
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        return config_from_args(parse_args(container["args"])).dns_cidrs

    if not (bin_dir() / "helm").exists():
        pytest.skip("helm is not built (hack/prepare.sh)")
    assert dns_cidrs() == ()
    assert dns_cidrs("network.dnsCIDRs={169.254.20.10/32}") == ("169.254.20.10/32",)
    values = yaml.safe_load((chart / "values.yaml").read_text())
    assert values["network"]["dnsCIDRs"] == []
    bad = subprocess.run([str(bin_dir() / "helm"), "template", "rft", str(chart), "--set", "network.dnsCIDRs=x"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "dnsCIDRs" in bad.stderr


def test_kopf_settings_keep_bookkeeping_out_of_status() -> None:
    import kopf

    s = make_settings()
    assert isinstance(s.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert isinstance(s.persistence.diffbase_storage, kopf.AnnotationsDiffBaseStorage)
    assert s.peering.standalone is True
    assert s.posting.level >= 30


def test_a_follower_answers_its_liveness_probe() -> None:
    """A replica waiting for the Lease serves /healthz (the chart's liveness probe) until it leads."""
    import asyncio

    from rft_operator.app import OperatorConfig, _follower_health

    async def probe() -> tuple[int, str]:
        srv = await _follower_health(OperatorConfig(health_port=0, metrics_addr="127.0.0.1"))
        assert srv is not None
        port = srv.sockets[0].getsockname()[1]
        try:
            r = await asyncio.to_thread(httpx.get, f"http://127.0.0.1:{port}/healthz", timeout=5)
            return r.status_code, r.text
        finally:
            srv.close()
            await srv.wait_closed()

    assert asyncio.run(probe()) == (200, "following\n")
