"""Running the operator: leader election, the watch cache, kopf (with our settings and registry), the
periodic resync and the metrics server.

With leader election (``leader_election_namespace`` set: the chart's default, several replicas), a
replica waits for the Lease (``leader.LeaderElector``) before it primes its cache and starts
watching; one that loses the Lease stops (``run`` raises :class:`LeadershipLost`, the process exits
non-zero and is restarted as a follower). A replica stopping cleanly releases the Lease.

``run`` is a coroutine so tests can run the operator in-process and stop it with ``stop_flag``.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional

import kopf

from .builders.common import DEFAULT_RUNTIME_IMAGE, DEFAULT_VLLM_IMAGE, Site
from .controller import Controller
from .handlers import build_registry, child_label_selectors
from .kube import Kube
from .leader import LeaderElector
from .metrics import Metrics

log = logging.getLogger(__name__)
KOPF_PREFIX = "rft.dev"


@dataclass(frozen=True)
class OperatorConfig:
    kubeconfig: Optional[str] = None
    """Kubeconfig file; in-cluster credentials (or ``$KUBECONFIG``) when unset."""
    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; all when empty."""
    metrics_port: Optional[int] = 8080
    """Port of ``/metrics`` (0: any free port; None: no metrics server)."""
    metrics_addr: str = "0.0.0.0"
    resync_seconds: float = 10.0
    """Period of the level-triggered resync of every job."""
    health_port: Optional[int] = None
    """Port of kopf's liveness endpoint ``/healthz`` (None: none)."""
    leader_election_namespace: Optional[str] = None
    """Namespace of the leader-election Lease ``rft-operator`` (None: no election, one replica)."""
    leader_identity: Optional[str] = None
    """This replica's identity in the Lease (default: pod or host name plus a random suffix)."""
    max_concurrent_reconciles: int = 8
    kueue: bool = False
    """The Kueue integration: jobs labelled ``kueue.x-k8s.io/queue-name`` are admitted through a Kueue
    Workload (``policies.admission``); needs Kueue's CRDs installed."""
    dns_ports: tuple[int, ...] = ()
    """The ports the cluster's DNS pods listen on, admitted by every job's rollout egress policy
    (empty: 53 and 5353)."""
    dns_cidrs: tuple[str, ...] = ()
    """DNS servers that are not pods (CIDR blocks), admitted on those ports by the same policy."""
    runtime_image: str = DEFAULT_RUNTIME_IMAGE
    """The image of a job's roles when its spec names none (``spec.runtimeImage``)."""
    vllm_image: str = DEFAULT_VLLM_IMAGE
    """The vLLM engine's image when ``spec.inference.image`` is unset."""
    scrape_from: tuple[dict[str, Any], ...] = ()
    """NetworkPolicy peers of the cluster's Prometheus, admitted to each role's metrics port."""
    image_pull_policy: Optional[str] = None
    """``imagePullPolicy`` of every container of every job's pods (None: Kubernetes' default)."""
    image_pull_secrets: tuple[str, ...] = ()
    """Pull secrets every job's pods get (in the job's namespace)."""


class LeadershipLost(RuntimeError):
    """The Lease could not be renewed: this replica stopped leading."""


def _is_set(flag: Any) -> bool:
    if flag is None:
        return False
    if hasattr(flag, "is_set"):
        return bool(flag.is_set())
    return bool(getattr(flag, "done", lambda: False)())


def make_settings(resync_seconds: float = 10.0, kueue: bool = False) -> kopf.OperatorSettings:
    """kopf settings: its bookkeeping in annotations (the structural schema would prune it from status;
    the ``on.event`` handlers write none), standalone (no kopf peering: the Lease elects the one active
    replica), only warnings posted as k8s Events, server-side label selectors on the watches, long
    watch requests, no CRD/namespace scanning (fewer permissions)."""
    s = kopf.OperatorSettings()
    s.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_PREFIX)
    s.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=KOPF_PREFIX)
    s.peering.standalone = True
    s.posting.level = logging.WARNING
    s.scanning.disabled = True
    s.watching.server_timeout = 600  # a watch continues from its resource version; no re-LIST
    s.watching.client_timeout = 660
    s.execution.max_workers = 8
    s.watching.reconnect_backoff = 1.0
    for key, selector in child_label_selectors(kueue).items():
        s.watching.label_selectors[key] = selector
    return s


async def run(config: OperatorConfig, *, stop_flag: Any = None, ready_flag: Any = None,
              on_started: Optional[Callable[[Controller, Metrics, Optional[int]], None]] = None) -> None:
    """Run until ``stop_flag`` is set (or forever). ``on_started`` receives the controller, the
    metrics and the bound metrics port (tests use it). Raises :class:`LeadershipLost`."""
    api = Kube.from_kubeconfig(config.kubeconfig)
    api.api_client.configuration.connection_pool_maxsize = config.max_concurrent_reconciles + 2
    metrics = Metrics()
    controller = Controller(api, metrics, namespaces=config.namespaces, resync_seconds=config.resync_seconds,
                            max_concurrent=config.max_concurrent_reconciles, kueue=config.kueue,
                            dns_ports=config.dns_ports or None, dns_cidrs=config.dns_cidrs,
                            site=Site(runtime_image=config.runtime_image, vllm_image=config.vllm_image,
                                      scrape_from=config.scrape_from, image_pull_policy=config.image_pull_policy,
                                      image_pull_secrets=config.image_pull_secrets))
    elector = None
    if config.leader_election_namespace:
        elector = (LeaderElector(api, config.leader_election_namespace, identity=config.leader_identity)
                   if config.leader_identity else LeaderElector(api, config.leader_election_namespace))
    try:
        if elector is not None:
            health = await _follower_health(config)
            try:
                if not await elector.acquire(lambda: _is_set(stop_flag)):
                    return  # stopped while following
            finally:
                if health is not None:
                    health.close()
                    await health.wait_closed()
        # metrics (reconciles, jobs) are the leader's: a follower serves only its liveness
        port = metrics.serve(config.metrics_port, config.metrics_addr) if config.metrics_port is not None else None
        if port is not None:
            log.info("metrics on %s:%d/metrics", config.metrics_addr, port)
        await _lead(config, controller, elector, stop_flag, ready_flag, on_started, port)
    finally:
        if elector is not None and elector.holder == elector.identity:
            await asyncio.to_thread(elector.release)
        await controller.close()
        metrics.close()
        api.close()


async def _follower_health(config: OperatorConfig) -> Optional[asyncio.AbstractServer]:
    """``/healthz`` answered 200 while following (the leader's kopf serves it once leading); a port
    already taken (pods sharing a network) is left to its holder."""
    if config.health_port is None:
        return None

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n"
                         b"Connection: close\r\n\r\nfollowing\n")
            await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    try:
        return await asyncio.start_server(answer, config.metrics_addr, config.health_port)
    except OSError as e:
        log.warning("follower health endpoint not served on port %d: %s", config.health_port, e)
        return None


async def _lead(config: OperatorConfig, controller: Controller, elector: Optional[LeaderElector], stop_flag: Any,
                ready_flag: Any, on_started: Optional[Callable[[Controller, Metrics, Optional[int]], None]],
                port: Optional[int]) -> None:
    """Prime the cache, then run kopf and the resync until stopped or the Lease is lost."""
    await asyncio.to_thread(controller.prime)
    if on_started is not None:
        on_started(controller, controller.metrics, port)
    stop = asyncio.Event()
    lost = asyncio.Event()

    async def watch_stop() -> None:
        while not _is_set(stop_flag):
            await asyncio.sleep(0.2)
        stop.set()

    async def keep_lease() -> None:
        assert elector is not None
        await elector.keep()
        lost.set()
        stop.set()

    loop = asyncio.get_running_loop()
    side = [loop.create_task(controller.resync_forever())]
    if stop_flag is not None:
        side.append(loop.create_task(watch_stop()))
    if elector is not None:
        side.append(loop.create_task(keep_lease()))
    try:
        await kopf.operator(
            registry=build_registry(controller), settings=make_settings(config.resync_seconds, config.kueue),
            standalone=True, clusterwide=not config.namespaces, namespaces=list(config.namespaces),
            stop_flag=stop, ready_flag=ready_flag,
            liveness_endpoint=(f"http://{config.metrics_addr}:{config.health_port}/healthz"
                               if config.health_port is not None else None))
    finally:
        for t in side:
            t.cancel()
        await asyncio.gather(*side, return_exceptions=True)
    if lost.is_set():
        raise LeadershipLost(f"{elector.identity if elector else ''} lost the lease")
