"""Prometheus metrics of the builtin server (one registry per app, exposed at ``/metrics``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from rft_api.telemetry import job_registry

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class ServeMetrics:
    """Requests, tokens, batch sizes, latency, queue depth and the served policy version."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = job_registry("inference")
        r = self.registry
        self.requests = Counter("rft_serve_requests", "HTTP requests by route and status", ["route", "status"],
                                registry=r)
        self.latency = Histogram("rft_serve_request_latency_seconds", "Request latency by route", ["route"],
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("rft_serve_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("rft_serve_generation_tokens", "Tokens generated", registry=r)
        self.batch_size = Histogram("rft_serve_batch_size", "Sequences per decode step", buckets=_BATCH_BUCKETS,
                                    registry=r)
        self.running = Gauge("rft_serve_num_sequences_running", "Sequences in the running batch", registry=r)
        self.waiting = Gauge("rft_serve_num_requests_waiting", "Requests waiting for admission", registry=r)
        self.policy_version = Gauge("rft_serve_policy_version", "Policy version of the served weights", registry=r)
        self.aborted = Counter("rft_serve_aborted_sequences", "Sequences dropped because the client went away",
                               registry=r)
        self.weight_updates = Counter("rft_serve_weight_updates", "Weight updates by result", ["result"], registry=r)
        self.graph_iterations = Counter(
            "rft_serve_graph_iterations", "Decode iterations replayed from a CUDA graph (run in the graphs' fixed "
            "shape where they are not captured); the rest of rft_serve_batch_size's count ran eagerly", registry=r)
        self.graph_captures = Counter("rft_serve_graph_captures",
                                      "CUDA graphs captured: one per decode shape, again after the KV cache grows",
                                      registry=r)
        self.pauses = Counter("rft_serve_engine_pauses",
                              "Pauses of the engine between iterations under CPU pressure (engine pacing)", registry=r)
        self.paused_seconds = Counter("rft_serve_engine_paused_seconds", "Seconds the engine spent in those pauses",
                                      registry=r)

    # EngineMetrics protocol
    def observe_step(self, batch_size: int, new_tokens: int) -> None:
        """One decode step ran over ``batch_size`` sequences and produced ``new_tokens`` tokens."""
        self.batch_size.observe(batch_size)
        self.generation_tokens.inc(new_tokens)

    def set_queue(self, running: int, waiting: int) -> None:
        """Current queue depths."""
        self.running.set(running)
        self.waiting.set(waiting)

    def observe_aborted(self, sequences: int) -> None:
        """Sequences were dropped unfinished (client disconnect)."""
        self.aborted.inc(sequences)

    def observe_graphs(self, replays: int, captures: int) -> None:
        """Decode iterations ran from CUDA graphs; graphs were captured."""
        self.graph_iterations.inc(replays)
        self.graph_captures.inc(captures)

    def observe_pause(self, seconds: float, pauses: int = 1) -> None:
        """The engine paused between iterations (pacing): ``pauses`` pauses of ``seconds`` in all (the
        engine process relays them summed)."""
        self.pauses.inc(pauses)
        self.paused_seconds.inc(seconds)

    def observe_request(self, route: str, status: int, seconds: float) -> None:
        """One HTTP request finished."""
        self.requests.labels(route=route, status=str(status)).inc()
        self.latency.labels(route=route).observe(seconds)

    def render(self) -> bytes:
        """The text exposition of every metric."""
        return generate_latest(self.registry)
