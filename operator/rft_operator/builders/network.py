"""The job's NetworkPolicies (``spec.network.policies``, on by default): who may reach its servers,
and where its rollout pods may go.

- ``<job>-inference``: the inference pods accept connections on ``spec.inference.port`` only from
  the job's rollout pods (sampling) and its trainer pods (weight publication);
- ``<job>-trainer``: the trainer pods accept connections on the coordinator port only from the job's
  rollout pods, and, with ``trainer.nodes > 1``, on any port from the job's other trainer pods (the
  torch.distributed rendezvous on pod 0, and the connections gloo/NCCL open between ranks on ports
  of their choosing);
- ``<job>-reward`` (when the job has a reward role): the reward pods accept connections on the reward
  port only from the job's rollout pods;
- ``<job>-rollout``: the rollout pods may connect only to those three, to DNS, and to the
  destinations of ``spec.network.rolloutEgress``; nothing else (the evaluator bundle's code runs
  there). DNS is admitted on its ports to pods in any namespace (``namespaceSelector: {}``: the
  cluster's DNS servers are pods, whose labels and namespace differ between distributions), never to
  an address outside the cluster: port 53 is not a way out to the internet. The ports are 53, and
  5353, where OpenShift's DNS pods listen, by default; the operator's ``--dns-port`` (chart value
  ``network.dnsPorts``) names others. A policy-enforcing network sees the pod address and port the
  ``kube-dns`` Service forwards to, not the Service's. DNS that is not a pod (NodeLocal DNSCache at
  169.254.20.10, a resolver on the node) is admitted only at the operator's ``--dns-cidr`` (chart value
  ``network.dnsCIDRs``, none by default).

Scrapes: each of these ingress policies also admits the operator's ``--scrape-from`` peers (chart
value ``metrics.scrapeFrom``: the namespace and pod selectors of the cluster's Prometheus) on the port
where that role serves ``/metrics`` (inference: its API port, trainer: the coordinator port, reward:
the reward port), and nothing else; with no peers configured, no scrape is admitted. The rollout pods
have no ingress policy and serve no metrics.

"The job's pods" is a pod selector on the job's labels within the job's namespace: pods of another
job or another namespace match none of these rules. The operator itself never connects to a job's
pods (it reads the progress ConfigMap and the pods' status), so no rule admits it. Kubelet probes
come from the node and are not subject to pod-selector rules on the common network plugins.

These only isolate anything on a cluster whose network plugin enforces NetworkPolicies (the e2e
node enforces them with kube-router); the job token (``builders.secret``) guards the routes either way.
"""
from __future__ import annotations

from typing import Any, Optional

from rft_api.job import RFTJob

from .. import names
from ..topology import reward_required
from .common import BuildContext, metadata

Obj = dict[str, Any]
ROLE = "network"


def _pods(job: RFTJob, role: str) -> Obj:
    return {"podSelector": {"matchLabels": names.selector(job.name, role)}}


def _port(port: int, protocol: str = "TCP") -> Obj:
    return {"port": port, "protocol": protocol}


def _policy(job: RFTJob, name: str, role: str, spec: Obj) -> Obj:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": metadata(job, name, ROLE),
            "spec": {"podSelector": {"matchLabels": names.selector(job.name, role)}, **spec}}


def _ingress(job: RFTJob, ctx: BuildContext, name: str, role: str, port: int, sources: list[str]) -> Obj:
    """Ingress to ``role``'s pods on ``port`` (where it also serves ``/metrics``) from the job's ``sources``
    roles, and from the scrape peers (``ctx.scrape_from``) when configured."""
    ingress: list[Obj] = [{"from": [_pods(job, s) for s in sources], "ports": [_port(port)]}]
    if ctx.scrape_from:
        ingress.append({"from": [dict(p) for p in ctx.scrape_from], "ports": [_port(port)]})
    return _policy(job, name, role, {"policyTypes": ["Ingress"], "ingress": ingress})


def inference_policy(job: RFTJob, ctx: BuildContext) -> Obj:
    return _ingress(job, ctx, names.inference(job.name), "inference", job.spec.inference.port, ["rollout", "trainer"])


def trainer_policy(job: RFTJob, ctx: BuildContext) -> Obj:
    pol = _ingress(job, ctx, names.trainer(job.name), "trainer", ctx.coordinator_port, ["rollout"])
    if job.spec.trainer.nodes > 1:  # one process group across the trainer pods
        pol["spec"]["ingress"].append({"from": [_pods(job, "trainer")]})
    return pol


def reward_policy(job: RFTJob, ctx: BuildContext) -> Optional[Obj]:
    if not reward_required(job.spec):
        return None
    return _ingress(job, ctx, names.reward(job.name), "reward", ctx.reward_port, ["rollout"])


def dns_rule(ctx: BuildContext) -> Obj:
    """Egress to the cluster's DNS: its ports, to any pod of any namespace and to ``ctx.dns_cidrs``
    (see the module docstring)."""
    to: list[Obj] = [{"namespaceSelector": {}}, *({"ipBlock": {"cidr": c}} for c in ctx.dns_cidrs)]
    return {"to": to, "ports": [_port(p, proto) for p in ctx.dns_ports for proto in ("UDP", "TCP")]}


def rollout_policy(job: RFTJob, ctx: BuildContext) -> Obj:
    egress: list[Obj] = [
        {"to": [_pods(job, "inference")], "ports": [_port(job.spec.inference.port)]},
        {"to": [_pods(job, "trainer")], "ports": [_port(ctx.coordinator_port)]},
    ]
    if reward_required(job.spec):
        egress.append({"to": [_pods(job, "reward")], "ports": [_port(ctx.reward_port)]})
    egress.append(dns_rule(ctx))
    for rule in job.spec.network.rollout_egress:
        egress.append({"to": [{"ipBlock": {"cidr": rule.cidr}}],
                       "ports": [_port(p.port, p.protocol) for p in rule.ports]})
    return _policy(job, names.rollout(job.name), "rollout", {"policyTypes": ["Egress"], "egress": egress})


def policies(job: RFTJob, ctx: BuildContext) -> list[Obj]:
    """The job's NetworkPolicies (none when ``spec.network.policies`` is false)."""
    if not job.spec.network.policies:
        return []
    out = [inference_policy(job, ctx), trainer_policy(job, ctx), reward_policy(job, ctx), rollout_policy(job, ctx)]
    return [p for p in out if p is not None]
