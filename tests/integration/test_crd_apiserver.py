"""The CRD on a real kube-apiserver: accepted, the sample is valid, every invalid case is rejected at
`kubectl apply` with a message naming the field, immutable fields are immutable once started, and the
Helm chart's rendered output validates with `kubectl apply --dry-run=server`."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.api.cases import base_manifest, invalid_cases
from tests.support.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.cluster
CASES = invalid_cases()


def kubectl(cluster, *args, stdin: str | None = None, check=True) -> subprocess.CompletedProcess:
    p = subprocess.run([cluster.binary("kubectl"), "--kubeconfig", str(cluster.kubeconfig), *args], input=stdin,
                       capture_output=True, text=True, timeout=60)
    if check and p.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {p.stderr}")
    return p


@pytest.fixture(scope="module")
def crd_installed(cluster):
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds" / "rftjob.yaml"))
    # Poll instead of `kubectl wait`, which can exit early on a CRD whose conditions are still empty.
    def established() -> bool:
        got = json.loads(kubectl(cluster, "get", "crd", "rftjobs.rft.dev", "-o", "json").stdout)
        return any(c["type"] == "Established" and c["status"] == "True"
                   for c in (got.get("status") or {}).get("conditions") or [])  # a new CRD may say null
    wait_for("CRD rftjobs.rft.dev to be Established", established, 60, 0.2)
    return cluster


def test_sample_manifest_is_accepted_and_printed(crd_installed, namespace):
    kubectl(crd_installed, "apply", "-n", namespace, "-f", str(ROOT / "examples" / "01-tiny-arith.yaml"))
    got = json.loads(kubectl(crd_installed, "get", "-n", namespace, "rft", "tiny-arith", "-o", "json").stdout)
    # Defaults from the schema are applied by the API server.
    assert got["spec"]["rollout"]["topP"] == 1.0
    assert got["spec"]["trainer"]["kl"]["estimator"] == "k3"
    assert got["spec"]["checkpoint"]["keepLast"] == 3
    table = kubectl(crd_installed, "get", "-n", namespace, "rft").stdout.splitlines()[0].split()
    assert table[:6] == ["NAME", "PHASE", "STEP", "REWARD", "CHECKPOINT", "AGE"]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_invalid_manifest_rejected_at_apply(crd_installed, namespace, case):
    manifest = dict(case["manifest"])
    p = kubectl(crd_installed, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(manifest), check=False)
    assert p.returncode != 0, f"{case['id']} was accepted"
    field = case["field"]
    assert field in p.stderr, f"{case['id']}: error does not name {field}: {p.stderr}"


def test_immutable_fields_once_started(crd_installed, namespace):
    m = base_manifest()
    m["metadata"]["name"] = "immut"
    kubectl(crd_installed, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(m))
    # Before the job starts, the model may still change.
    m["spec"]["model"]["lora"] = {"rank": 4}
    kubectl(crd_installed, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(m))
    kubectl(crd_installed, "patch", "-n", namespace, "rft", "immut", "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z"}}))
    for path, value, field in ((("spec", "model", "lora", "rank"), 8, "spec.model"),
                               (("spec", "trainer", "algorithm"), "dapo", "spec.trainer.algorithm"),
                               (("spec", "model", "tokenizer"), "/models/tok", "spec.model.tokenizer")):
        changed = yaml.safe_load(yaml.safe_dump(m))
        node = changed
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        p = kubectl(crd_installed, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(changed), check=False)
        assert p.returncode != 0 and "may not change once the job has started" in p.stderr and field in p.stderr, p.stderr
    # Fields that are not immutable still change.
    m["spec"]["trainer"]["maxSteps"] = 40
    kubectl(crd_installed, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(m))


def test_checkpoint_claim_may_never_change(crd_installed, namespace):
    """Editing ``checkpoint.existingClaim`` (setting, changing or removing it) would orphan, or make the
    operator delete, the claim holding the checkpoints: the API server refuses it, naming the field."""
    m = base_manifest()
    m["metadata"]["name"] = "claim"
    kubectl(crd_installed, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(m))
    for before, after in ((None, "shared"), ("shared", "other"), ("shared", None)):
        if before is not None:  # start from a job that has the claim
            kubectl(crd_installed, "delete", "-n", namespace, "rft", "claim", "--wait=true")
            m2 = yaml.safe_load(yaml.safe_dump(m))
            m2["spec"].setdefault("checkpoint", {})["existingClaim"] = before
            kubectl(crd_installed, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(m2))
        changed = yaml.safe_load(yaml.safe_dump(m))
        if after is not None:
            changed["spec"].setdefault("checkpoint", {})["existingClaim"] = after
        p = kubectl(crd_installed, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(changed), check=False)
        assert p.returncode != 0 and "spec.checkpoint.existingClaim may not change" in p.stderr, (before, after, p.stderr)


def test_every_example_is_accepted(crd_installed, namespace):
    for f in sorted((ROOT / "examples").glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(f.read_text()) if d]
        for d in docs:
            d.setdefault("metadata", {})["namespace"] = namespace
        kubectl(crd_installed, "apply", "--dry-run=server", "-f", "-",
                stdin=yaml.safe_dump_all(docs))


def test_chart_renders_and_validates_on_server(crd_installed, namespace):
    rendered = subprocess.run([crd_installed.binary("helm"), "template", "rft", str(ROOT / "charts" / "rft-operator"), "-n", namespace,
                               "--include-crds"], capture_output=True, text=True, check=True).stdout
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(rendered) if d)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "CustomResourceDefinition", "Deployment", "Role",
                     "RoleBinding", "Service", "ServiceAccount"]  # the ConfigMap: the Grafana dashboard
    kubectl(crd_installed, "apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=rendered)



def test_chart_cluster_role_is_exactly_the_operator_rules(cluster):
    from rft_operator.permissions import LEADER_ELECTION_RULES, OPERATOR_RULES

    rendered = subprocess.run([cluster.binary("helm"), "template", "rft", str(ROOT / "charts" / "rft-operator"),
                               "-n", "ops"], capture_output=True, text=True, check=True).stdout
    roles = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ClusterRole"]
    assert len(roles) == 1 and roles[0]["rules"] == OPERATOR_RULES
    # leader election (the default): 2 replicas, rolling updates, leases only in the release namespace
    (role,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Role"]
    assert role["rules"] == LEADER_ELECTION_RULES and role["metadata"]["namespace"] == "ops"
    deploy = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment")
    assert deploy["spec"]["replicas"] == 2 and deploy["spec"]["strategy"]["type"] == "RollingUpdate"
    assert "--leader-election-namespace=ops" in deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    # The chart's flags are ones the operator accepts.
    from rft_operator.main import parse_args

    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    parsed = parse_args(args)
    assert parsed.health_port == 8081 and parsed.all_namespaces
