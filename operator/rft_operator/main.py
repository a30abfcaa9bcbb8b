"""``rft-operator``: run the RFTJob operator.

    rft-operator [--namespace NS ... | --all-namespaces] [--metrics-port 8080] [--kubeconfig PATH]
                 [--resync-seconds 10] [--health-port 8081]
                 [--leader-election-namespace NS] [--dns-port 53 ...] [--dns-cidr CIDR ...]
                 [--runtime-image REF] [--vllm-image REF] [--image-pull-policy P] [--image-pull-secret S ...]
                 [--scrape-from JSON ...] [--log-level INFO]
"""
from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import logging
import os
import re
from typing import Any, Optional

from rft_api.spec import IMAGE_REFERENCE_PATTERN

from .app import LeadershipLost, OperatorConfig, run
from .builders.common import DEFAULT_RUNTIME_IMAGE, DEFAULT_VLLM_IMAGE

_SELECTOR_KEYS = {"matchLabels", "matchExpressions"}


def _cidr(value: str) -> str:
    """An IP address or CIDR block as a NetworkPolicy ``ipBlock`` takes it (an address gets /32 or /128)."""
    try:
        return str(ipaddress.ip_network(value, strict=True))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not an IP address or CIDR block: {value!r} ({e})") from None


def _image(value: str) -> str:
    """An image reference the container runtime can parse (``rft_api.spec.IMAGE_REFERENCE_PATTERN``)."""
    if not re.fullmatch(IMAGE_REFERENCE_PATTERN, value):
        raise argparse.ArgumentTypeError(f"not an image reference ([registry[:port]/]path[:tag][@digest], the "
                                         f"path lower case): {value!r}")
    return value


def _secret_name(value: str) -> str:
    if len(value) > 253 or not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", value):
        raise argparse.ArgumentTypeError(f"not a Secret name (a DNS subdomain): {value!r}")
    return value


def _peer(value: str) -> dict[str, Any]:
    """A NetworkPolicy peer that selects the cluster's Prometheus, as JSON: ``namespaceSelector`` and/or
    ``podSelector``, each a label selector (``matchLabels``, ``matchExpressions``)."""
    try:
        peer = json.loads(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--scrape-from is not JSON: {value!r} ({e})") from None
    if not isinstance(peer, dict) or not peer or set(peer) - {"namespaceSelector", "podSelector"}:
        raise argparse.ArgumentTypeError(f"--scrape-from takes an object with namespaceSelector and/or podSelector, "
                                         f"got {value!r}")
    for key, sel in peer.items():
        if not isinstance(sel, dict) or set(sel) - _SELECTOR_KEYS:
            raise argparse.ArgumentTypeError(f"--scrape-from: {key} must be a label selector (matchLabels, "
                                             f"matchExpressions), got {json.dumps(sel)}")
        labels = sel.get("matchLabels", {})
        if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise argparse.ArgumentTypeError(f"--scrape-from: {key}.matchLabels must map strings to strings")
        if not isinstance(sel.get("matchExpressions", []), list):
            raise argparse.ArgumentTypeError(f"--scrape-from: {key}.matchExpressions must be a list")
    return peer


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="rft-operator", description="Kubernetes operator for RFTJobs (rft.dev/v1alpha1)")
    scope = ap.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[],
                       help="watch this namespace (repeatable); default: $WATCH_NAMESPACE or all namespaces")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace")
    ap.add_argument("--metrics-port", type=int, default=8080, help="port of /metrics (-1 disables; default 8080)")
    ap.add_argument("--metrics-addr", default="0.0.0.0", help="address of /metrics (default 0.0.0.0)")
    ap.add_argument("--health-port", type=int, default=-1,
                    help="port of the liveness endpoint /healthz (-1 disables; the chart uses 8081)")
    ap.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, else $KUBECONFIG)")
    ap.add_argument("--resync-seconds", type=float, default=10.0,
                    help="period of the level-triggered resync of every job (default 10)")
    ap.add_argument("--leader-election-namespace", default=None,
                    help="elect one active replica through Lease rft-operator in this namespace (the chart sets "
                         "its own namespace); default: no election (run a single replica)")
    ap.add_argument("--max-concurrent-reconciles", type=int, default=8,
                    help="reconciles running at once (default 8)")
    ap.add_argument("--kueue", action="store_true",
                    help="Kueue integration: admit jobs labelled kueue.x-k8s.io/queue-name through a Workload "
                         "(needs Kueue's CRDs; the chart sets it with kueue.enabled)")
    ap.add_argument("--dns-port", type=int, action="append", default=[], dest="dns_ports",
                    help="a port the cluster's DNS pods listen on, admitted by each job's rollout egress policy "
                         "(repeatable; default 53 and 5353). A policy-enforcing network checks the DNS pod's port, "
                         "not the kube-dns Service's")
    ap.add_argument("--dns-cidr", action="append", default=[], dest="dns_cidrs", type=_cidr,
                    help="addresses of DNS servers that are not pods (NodeLocal DNSCache: 169.254.20.10/32), "
                         "admitted on the DNS ports by each job's rollout egress policy besides the cluster's "
                         "pods (repeatable; default none)")
    ap.add_argument("--runtime-image", type=_image, default=os.environ.get("RFT_RUNTIME_IMAGE") or DEFAULT_RUNTIME_IMAGE,
                    help="image of the roles of a job that names none (spec.runtimeImage unset); default "
                         f"$RFT_RUNTIME_IMAGE or {DEFAULT_RUNTIME_IMAGE} (the chart sets images.runtime)")
    ap.add_argument("--vllm-image", type=_image, default=os.environ.get("RFT_VLLM_IMAGE") or DEFAULT_VLLM_IMAGE,
                    help="image of the vLLM engine when spec.inference.image is unset; default $RFT_VLLM_IMAGE or "
                         f"{DEFAULT_VLLM_IMAGE} (the chart sets images.vllm)")
    ap.add_argument("--image-pull-policy", choices=["Always", "IfNotPresent", "Never"], default=None,
                    help="imagePullPolicy of every container of the jobs' pods (default: Kubernetes', IfNotPresent "
                         "for a tagged image; the chart sets images.pullPolicy)")
    ap.add_argument("--image-pull-secret", action="append", default=[], dest="image_pull_secrets", type=_secret_name,
                    help="a Secret (kubernetes.io/dockerconfigjson, in the job's namespace) every job's pods pull "
                         "their images with, besides their role's pod.imagePullSecrets (repeatable; the chart "
                         "sets images.pullSecrets)")
    ap.add_argument("--scrape-from", type=_peer, action="append", default=[], dest="scrape_from",
                    help="a NetworkPolicy peer (JSON: namespaceSelector and/or podSelector) of the cluster's "
                         "Prometheus, admitted by each job's ingress policies to every role's metrics port "
                         "(repeatable; default none; the chart sets metrics.scrapeFrom)")
    ap.add_argument("--log-level", default=os.environ.get("RFT_OPERATOR_LOG_LEVEL", "INFO"), type=str.upper,
                    choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    a = ap.parse_args(argv)
    for flag, value in (("--runtime-image", a.runtime_image), ("--vllm-image", a.vllm_image)):
        try:  # a default from the environment is checked too
            _image(value)
        except argparse.ArgumentTypeError as e:
            ap.error(f"{flag}: {e}")
    if a.resync_seconds <= 0:
        ap.error("--resync-seconds must be positive")
    if a.max_concurrent_reconciles < 1:
        ap.error("--max-concurrent-reconciles must be at least 1")
    for port in a.dns_ports:
        if not 1 <= port <= 65535:
            ap.error(f"--dns-port must be a port number (1-65535), got {port}")
    return a


def config_from_args(a: argparse.Namespace) -> OperatorConfig:
    namespaces: tuple[str, ...] = ()
    if not a.all_namespaces:
        env = [n for n in os.environ.get("WATCH_NAMESPACE", "").split(",") if n.strip()]
        namespaces = tuple(a.namespace or [n.strip() for n in env])
    return OperatorConfig(kubeconfig=a.kubeconfig, namespaces=namespaces,
                          metrics_port=None if a.metrics_port < 0 else a.metrics_port,
                          metrics_addr=a.metrics_addr, resync_seconds=a.resync_seconds,
                          health_port=None if a.health_port < 0 else a.health_port,
                          leader_election_namespace=a.leader_election_namespace or None,
                          max_concurrent_reconciles=a.max_concurrent_reconciles, kueue=a.kueue,
                          dns_ports=tuple(dict.fromkeys(a.dns_ports)), dns_cidrs=tuple(dict.fromkeys(a.dns_cidrs)),
                          runtime_image=a.runtime_image, vllm_image=a.vllm_image,
                          scrape_from=tuple(a.scrape_from), image_pull_policy=a.image_pull_policy,
                          image_pull_secrets=tuple(dict.fromkeys(a.image_pull_secrets)))


def main(argv: Optional[list[str]] = None) -> int:
    """Console script entry point."""
    a = parse_args(argv)
    logging.basicConfig(level=a.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if a.log_level != "DEBUG":  # kopf logs every handled child event at INFO
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    try:
        asyncio.run(run(config_from_args(a)))
    except KeyboardInterrupt:
        pass
    except LeadershipLost as e:  # restarted as a follower
        logging.getLogger(__name__).error("%s", e)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
