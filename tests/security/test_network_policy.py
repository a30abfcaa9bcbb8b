"""The job's NetworkPolicies, attacked on paper: every connection an attacker would try is decided
against the policies the operator builds (``builders.network``), with NetworkPolicy semantics
(a pod selected by a policy of a direction is isolated in it; a connection passes when some rule of
some selecting policy admits it; a bare ``podSelector`` peer means the policy's own namespace, an empty
``namespaceSelector`` peer any pod of any namespace, and neither matches an address outside the cluster).

This checks what the policies say, not that a network enforces them: no policy-enforcing network
plugin runs in this test tier (docs/security.md). Their exact content is golden-tested in
tests/operator/golden.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest

from rft_api.job import InvalidSpec
from rft_operator import names
from rft_operator.builders import BuildContext, desired_children
from rft_operator.builders.network import policies
from tests.operator.support import GOLDEN_INPUTS, make_job, manifest

CTX = BuildContext()
Obj = dict[str, Any]


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str] = field(default_factory=dict)
    ip: str = "10.244.0.10"


@dataclass(frozen=True)
class External:
    ip: str


def pod(job: str, role: str, namespace: str = "team-a") -> Pod:
    return Pod(namespace, names.labels(job, role))


def dns_pod(ip: str = "10.244.0.3", namespace: str = "kube-system") -> Pod:
    """The cluster's DNS server, a pod (CoreDNS behind the kube-dns Service; OpenShift's in openshift-dns)."""
    return Pod(namespace, {"k8s-app": "kube-dns"}, ip)


def _selects(selector: Obj, labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def _peer_matches(peer: Obj, policy_ns: str, other: Pod | External) -> bool:
    if "ipBlock" in peer:
        ip = other.ip
        return ipaddress.ip_address(ip) in ipaddress.ip_network(peer["ipBlock"]["cidr"])
    if isinstance(other, External):
        return False
    if "namespaceSelector" in peer:  # only DNS's peer: any pod of any namespace
        assert peer == {"namespaceSelector": {}}, peer
        return True
    return other.namespace == policy_ns and _selects(peer["podSelector"], other.labels)


def _port_matches(ports: Optional[list[Obj]], port: int, protocol: str) -> bool:
    return not ports or any(p["port"] == port and p.get("protocol", "TCP") == protocol for p in ports)


def allowed(pols: list[Obj], src: Pod | External, dst: Pod | External, port: int, protocol: str = "TCP") -> bool:
    """Whether ``src`` may open a connection to ``dst:port`` under ``pols`` (both directions)."""
    def side(direction: str, subject: Pod | External, other: Pod | External) -> bool:
        if isinstance(subject, External):
            return True
        selecting = [p for p in pols if p["metadata"]["namespace"] == subject.namespace
                     and _selects(p["spec"]["podSelector"], subject.labels) and direction in p["spec"]["policyTypes"]]
        if not selecting:
            return True  # not isolated
        key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
        for p in selecting:
            for rule in p["spec"].get(key, []):
                peers = rule.get(peers_key)
                if (not peers or any(_peer_matches(x, p["metadata"]["namespace"], other) for x in peers)) \
                        and _port_matches(rule.get("ports"), port, protocol):
                    return True
        return False

    return side("Egress", src, dst) and side("Ingress", dst, src)


@pytest.fixture(scope="module")
def job_a():
    doc = manifest(GOLDEN_INPUTS / "bundle.yaml")  # a reward-less bundle job with an egress allow-list
    doc["metadata"]["namespace"] = "team-a"
    return make_job(doc)


@pytest.fixture(scope="module")
def judged():
    """A job with a reward role (LLM judge), in team-a."""
    return make_job(namespace="team-a", evaluator={"builtin": "llm_judge", "config": {"endpoint": "http://j"}})


def _all(*jobs) -> list[Obj]:
    return [p for j in jobs for p in policies(j, CTX)]


def test_policies_are_children_of_the_job_and_built_by_default(job_a, judged) -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in desired_children(judged, CTX)}
    for role in ("inference", "trainer", "reward", "rollout"):
        assert ("NetworkPolicy", f"{judged.name}-{role}") in kinds
    assert len(policies(job_a, CTX)) == 3  # no reward role: no reward policy


def test_another_jobs_pods_cannot_reach_inference_coordinator_or_reward(judged) -> None:
    other = make_job(namespace="team-a", evaluator={"builtin": "llm_judge", "config": {"endpoint": "http://j"}})
    other.metadata["name"] = "intruder"
    pols = _all(judged, other)
    targets = [(pod(judged.name, "inference"), judged.spec.inference.port),
               (pod(judged.name, "trainer"), CTX.coordinator_port),
               (pod(judged.name, "reward"), CTX.reward_port)]
    for role in ("rollout", "trainer", "inference", "reward"):
        for dst, port in targets:
            assert not allowed(pols, pod("intruder", role), dst, port), (role, dst, port)


def test_a_pod_of_another_namespace_with_the_same_labels_is_refused(judged) -> None:
    pols = _all(judged)
    forged = pod(judged.name, "rollout", namespace="team-b")
    assert not allowed(pols, forged, pod(judged.name, "inference"), judged.spec.inference.port)
    assert not allowed(pols, forged, pod(judged.name, "trainer"), CTX.coordinator_port)
    assert not allowed(pols, forged, pod(judged.name, "reward"), CTX.reward_port)


def test_an_unlabelled_pod_of_the_namespace_is_refused(judged) -> None:
    pols = _all(judged)
    stranger = Pod("team-a", {"app": "debug"})
    assert not allowed(pols, stranger, pod(judged.name, "inference"), judged.spec.inference.port)
    assert not allowed(pols, stranger, pod(judged.name, "trainer"), CTX.coordinator_port)


def test_the_jobs_own_data_paths_are_open(judged) -> None:
    pols = _all(judged)
    rollout, inf = pod(judged.name, "rollout"), pod(judged.name, "inference")
    assert allowed(pols, rollout, inf, judged.spec.inference.port)
    assert allowed(pols, rollout, pod(judged.name, "trainer"), CTX.coordinator_port)
    assert allowed(pols, rollout, pod(judged.name, "reward"), CTX.reward_port)
    assert allowed(pols, pod(judged.name, "trainer"), inf, judged.spec.inference.port)  # weight publication
    assert allowed(pols, rollout, dns_pod(), 53, "UDP")  # DNS
    assert allowed(pols, rollout, dns_pod("10.128.0.5", "openshift-dns"), 5353, "TCP")  # DNS pods on OpenShift


def test_dns_is_admitted_on_the_ports_the_operator_is_given(judged) -> None:
    """A cluster whose DNS pods listen on 1053 (the operator's ``--dns-port 1053``): that port, and no
    longer the defaults."""
    import dataclasses

    pols = policies(judged, dataclasses.replace(CTX, dns_ports=(1053,)))
    rollout = pod(judged.name, "rollout")
    assert allowed(pols, rollout, dns_pod(), 1053, "UDP")
    assert allowed(pols, rollout, dns_pod(), 1053, "TCP")
    assert not allowed(pols, rollout, dns_pod(), 53, "UDP")
    assert not allowed(pols, rollout, dns_pod("10.128.0.5", "openshift-dns"), 5353, "TCP")


def test_dns_goes_to_the_clusters_dns_pods_not_to_the_internet(judged) -> None:
    """Port 53 is no way out: the DNS rule admits the cluster's DNS pods (any namespace) on the DNS
    ports, and no address outside the cluster (a resolver on the internet, the cloud's metadata
    service, a tunnel over DNS to a server of the bundle author's)."""
    pols = _all(judged)
    rollout = pod(judged.name, "rollout")
    for proto in ("UDP", "TCP"):
        assert allowed(pols, rollout, dns_pod(), 53, proto)
        for ip in ("8.8.8.8", "1.1.1.1", "203.0.113.5", "169.254.169.254", "169.254.20.10", "2001:db8:1::1"):
            assert not allowed(pols, rollout, External(ip), 53, proto), (ip, proto)
            assert not allowed(pols, rollout, External(ip), 5353, proto), (ip, proto)


def test_dns_servers_that_are_not_pods_are_admitted_at_the_cidrs_the_operator_is_given(judged) -> None:
    """NodeLocal DNSCache answers at 169.254.20.10 on each node (the operator's ``--dns-cidr
    169.254.20.10/32``, chart value ``network.dnsCIDRs``): that address on the DNS ports, nothing else of it,
    and still no other address outside the cluster."""
    import dataclasses

    pols = policies(judged, dataclasses.replace(CTX, dns_cidrs=("169.254.20.10/32",)))
    rollout = pod(judged.name, "rollout")
    assert allowed(pols, rollout, External("169.254.20.10"), 53, "UDP")
    assert allowed(pols, rollout, External("169.254.20.10"), 53, "TCP")
    assert not allowed(pols, rollout, External("169.254.20.10"), 80)
    assert not allowed(pols, rollout, External("8.8.8.8"), 53, "UDP")
    assert allowed(pols, rollout, dns_pod(), 53, "UDP")


def test_only_the_declared_ports_are_open(judged) -> None:
    pols = _all(judged)
    rollout = pod(judged.name, "rollout")
    assert not allowed(pols, rollout, pod(judged.name, "inference"), 22)
    assert not allowed(pols, rollout, pod(judged.name, "trainer"), judged.spec.inference.port)
    assert not allowed(pols, pod(judged.name, "reward"), pod(judged.name, "trainer"), CTX.coordinator_port)


def test_rollout_cannot_reach_another_job_the_api_server_or_the_internet(job_a) -> None:
    other = make_job(namespace="team-a")
    other.metadata["name"] = "victim"
    pols = _all(job_a, other)
    rollout = pod(job_a.name, "rollout")
    assert not allowed(pols, rollout, pod("victim", "inference"), other.spec.inference.port)
    assert not allowed(pols, rollout, pod("victim", "trainer"), CTX.coordinator_port)
    for ip, port in (("10.96.0.1", 443), ("169.254.169.254", 80), ("8.8.8.8", 443), ("203.0.113.5", 80),
                     ("2001:db8:1::1", 8443), ("8.8.8.8", 53), ("203.0.113.5", 5353)):
        assert not allowed(pols, rollout, External(ip), port), (ip, port)
        assert not allowed(pols, rollout, External(ip), port, "UDP"), (ip, port)


def test_rollout_reaches_its_allow_list_on_the_declared_ports_only(job_a) -> None:
    pols = _all(job_a)
    rollout = pod(job_a.name, "rollout")
    assert allowed(pols, rollout, External("203.0.113.5"), 443)
    assert not allowed(pols, rollout, External("203.0.113.5"), 443, "UDP")
    assert allowed(pols, rollout, External("2001:db8::7"), 3478, "UDP")
    assert not allowed(pols, rollout, External("2001:db8::7"), 3478, "TCP")


def test_policies_off_builds_none_and_refuses_an_allow_list() -> None:
    assert policies(make_job(network={"policies": False}), CTX) == []
    with pytest.raises(InvalidSpec, match="spec.network.rolloutEgress"):
        make_job(network={"policies": False, "rolloutEgress": [{"cidr": "10.0.0.0/8", "ports": [{"port": 443}]}]})


@pytest.mark.parametrize("cidr", ["10.0.0.1/8", "0.0.0.0/33", "judge.example.com/32", "10.0.0.0"])
def test_a_malformed_allow_list_entry_is_refused_naming_the_field(cidr: str) -> None:
    with pytest.raises(InvalidSpec, match=r"spec\.network\.rolloutEgress\[0\]\.cidr"):
        make_job(network={"rolloutEgress": [{"cidr": cidr, "ports": [{"port": 443}]}]})


def test_trainer_pods_of_one_process_group_reach_each_other_on_any_port() -> None:
    """trainer.nodes > 1: the rendezvous on pod 0 and the ranks' own connections (gloo/NCCL pick their
    ports) are open between the job's trainer pods, and to nobody else; one trainer pod opens nothing more."""
    multi = make_job(namespace="team-a", trainer={"algorithm": "grpo", "learningRate": 1e-4, "maxSteps": 30,
                                                  "nodes": 2})
    pols = _all(multi)
    trainer = pod(multi.name, "trainer")
    assert allowed(pols, trainer, trainer, CTX.rendezvous_port)
    assert allowed(pols, trainer, trainer, 41234)
    assert not allowed(pols, pod(multi.name, "rollout"), trainer, CTX.rendezvous_port)
    assert not allowed(pols, pod("other", "trainer"), trainer, CTX.rendezvous_port)
    single = make_job(namespace="team-a")
    assert not allowed(_all(single), pod(single.name, "trainer"), pod(single.name, "trainer"), CTX.rendezvous_port)
