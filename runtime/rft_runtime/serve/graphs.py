"""Decode iterations replayed from CUDA graphs.

On a GPU a decode iteration of a small model is bound by the host launching kernels: each of the
runner's few hundred operations costs the host more than the GPU, so the iteration takes about as
long at batch 1 as at batch 128 (17-19 ms for a 24-layer model on an H200, measured before this
module). A CUDA graph records an iteration's kernels once and replays them with one launch.

A graph replays fixed shapes, so a decode-only iteration (no prompt chunk) runs in a fixed form:

- **rows are slots** ``0..S-1``, where ``S`` is the span of the decoding slots (the highest plus one)
  rounded up to a bucket (:data:`SPAN_BUCKETS`, at most the cache's slots). Slots are handed out
  lowest-first, so the span is close to the number of decoding sequences. Rows whose slot does not
  decode carry a padding token at position 0; their keys and values are written to the cache's spare
  row (:attr:`~.kv_cache.SlotKVCache.spare`, which no sequence holds) and their outputs are dropped;
- **attention reads** columns ``0..W-1`` of each row's slot, ``W`` the longest decoding row rounded up
  to a power of two of at least 256 (at most the cache's capacity), under a mask built in the graph
  from each row's position: columns past a row's position weigh exactly zero;
- the **inputs** (token, position, write row per row, and the slots whose logits are wanted) are one
  host-to-device copy into a persistent buffer the graphs read; the graph's output is the last hidden
  state of every row, and the final norm and output layer run outside it on the rows asked for only.

One graph is captured per ``(S, W)`` the first time that shape runs (warm-up outside the graph, then
capture; the warm-up computes the iteration itself, writing the same keys and values the replay
writes), all sharing one memory pool. A cache that grows (:meth:`~.kv_cache.SlotKVCache.ensure`
reallocates) drops them. Weights swapped in place (the engine copies into the parameters) are read by
the graphs as they are. Iterations with prompt chunks run eagerly. A capture that fails disables
graphs for the runner, with the reason logged once; the eager path takes over.

``cuda_graphs`` (``$RFT_ENGINE_CUDA_GRAPHS``): ``auto`` (capture on a CUDA device), ``never`` (what
``rft serve --enforce-eager`` sets, as in vLLM), or ``uncaptured``: the fixed-shape iteration run
eagerly on any device, which is how the tests check it on a CPU.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Protocol

import torch

from .choices import pick
from .kv_cache import SlotKVCache

log = logging.getLogger(__name__)

ENV = "RFT_ENGINE_CUDA_GRAPHS"
CHOICES = ("auto", "never", "uncaptured")
SPAN_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128)
MIN_WIDTH = 256


def setting(value: str | None = None) -> str:
    """``value``, else ``$RFT_ENGINE_CUDA_GRAPHS``, else ``auto``; anything else is refused, naming it."""
    return pick(value, name="cuda_graphs", env=ENV, choices=CHOICES)


def span_bucket(span: int, slots: int) -> int:
    """The number of rows a graph runs for decoding slots spanning ``0..span-1``: the smallest bucket of
    at least ``span`` (beyond the table, the next multiple of 64), at most ``slots``."""
    if span < 1 or span > slots:
        raise ValueError(f"a span of {span} slots does not fit a cache of {slots}")
    for b in SPAN_BUCKETS:
        if b >= span:
            return min(b, slots)
    return min(slots, -(-span // 64) * 64)


def width_bucket(width: int, capacity: int) -> int:
    """The columns a graph's attention reads for rows up to ``width`` tokens long: the smallest power of
    two of at least ``width`` and :data:`MIN_WIDTH`, at most ``capacity``."""
    if width < 1 or width > capacity:
        raise ValueError(f"a width of {width} columns does not fit a cache of {capacity}")
    w = MIN_WIDTH
    while w < width:
        w *= 2
    return min(w, capacity)


class FixedShapeRunner(Protocol):
    """What the graphs need of :class:`~.runner.SlotRunner` (which holds them)."""

    device: torch.device

    def decode_fixed(self, cache: SlotKVCache, ids: torch.Tensor, pos: torch.Tensor, write: torch.Tensor,
                     span: int, width: int) -> torch.Tensor: ...

    def logits(self, h: torch.Tensor) -> torch.Tensor: ...

    def rope_tables(self, length: int) -> tuple[torch.Tensor, torch.Tensor]: ...


class _Replay:
    """A captured graph and the tensors it reads or writes (kept alive while the graph is)."""

    def __init__(self, graph: Any, out: torch.Tensor, keep: tuple[Any, ...]):
        self.graph, self.out, self.keep = graph, out, keep

    def __call__(self) -> torch.Tensor:
        self.graph.replay()
        return self.out


class _Eager:
    """The fixed-shape iteration run without a graph (``uncaptured``)."""

    def __init__(self, body: Callable[[], torch.Tensor]):
        self.body = body

    def __call__(self) -> torch.Tensor:
        return self.body()


class DecodeGraphs:
    """Decode-only iterations of ``runner``, each replayed from a graph of its ``(span, width)``."""

    def __init__(self, runner: FixedShapeRunner, *, capture: bool):
        self.runner = runner
        self.capture = capture
        self.disabled: str | None = None  # why graphs were given up (the eager path runs instead)
        self.builds = 0  # fixed shapes prepared: captured, or (uncaptured) first run
        self.replays = 0  # decode iterations run in a fixed shape
        self._graphs: dict[tuple[int, int], _Replay | _Eager] = {}
        self._cache_key: tuple[int, int, int] | None = None
        self._inputs: torch.Tensor | None = None  # [4, slots]: token, position, write row, wanted slot
        self._pool: Any = None
        self._taken = (0, 0)

    def take(self) -> tuple[int, int]:
        """Decode iterations run in a fixed shape and shapes built since the last call (for metrics)."""
        replays, builds = self.replays - self._taken[0], self.builds - self._taken[1]
        self._taken = (self.replays, self.builds)
        return replays, builds

    def _reset(self, cache: SlotKVCache) -> None:
        # a new memory pool with the new graphs: capturing into the pool of graphs already destroyed trips
        # an assertion of torch's caching allocator (seen with torch 2.11 on an H200)
        self._graphs.clear()
        self._pool = None
        self._cache_key = self._key(cache)
        self._inputs = torch.zeros((4, cache.slots), dtype=torch.long, device=self.runner.device)

    @staticmethod
    def _key(cache: SlotKVCache) -> tuple[int, int, int]:
        """What the graphs were captured against: the cache, its storage (the graphs keep theirs alive, so
        another cache cannot take its address) and its capacity (a cache that grows reallocates)."""
        return id(cache), cache.keys[0].data_ptr(), cache.capacity

    def decode(self, cache: SlotKVCache, slots: list[int], tokens: list[int], positions: list[int],
               logit_rows: list[int]) -> torch.Tensor | None:
        """The logits ``[len(logit_rows), vocab]`` of a decode-only iteration (packed row ``i`` is the
        sequence in ``slots[i]``), or None where graphs are disabled (the caller runs eagerly)."""
        if self.disabled is not None or len(logit_rows) > len(slots):
            return None
        width = max(positions) + 1
        cache.ensure(width)
        if self._cache_key != self._key(cache):
            self._reset(cache)
        assert self._inputs is not None
        span = span_bucket(max(slots) + 1, cache.slots)
        cols = width_bucket(width, cache.capacity)
        ids, pos, write = [0] * span, [0] * span, [cache.spare] * span
        for s, t, p in zip(slots, tokens, positions):
            ids[s], pos[s], write[s] = t, p, s
        wanted = [slots[r] for r in logit_rows]
        self._inputs[:, :span].copy_(torch.tensor([ids, pos, write, wanted + [0] * (span - len(wanted))],
                                                  dtype=torch.long))
        run = self._graphs.get((span, cols))
        if run is None:
            built = self._build(cache, span, cols)
            if built is None:
                return None
            run = self._graphs[(span, cols)] = built
            self.builds += 1
        hidden = run()
        self.replays += 1
        return self.runner.logits(hidden.index_select(0, self._inputs[3, :len(wanted)]))

    def _build(self, cache: SlotKVCache, span: int, cols: int) -> _Replay | _Eager | None:
        assert self._inputs is not None
        ids, pos, write = self._inputs[0, :span], self._inputs[1, :span], self._inputs[2, :span]
        runner = self.runner

        def body() -> torch.Tensor:
            return runner.decode_fixed(cache, ids, pos, write, span, cols)

        if not self.capture:
            return _Eager(body)
        started = time.perf_counter()
        dev = runner.device
        try:
            runner.rope_tables(cols)  # grown here, never inside the capture
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                for _ in range(2):  # cuBLAS and the allocator settle; each writes what the replay writes
                    body()
            torch.cuda.current_stream(dev).wait_stream(side)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                out = body()
        except Exception as exc:  # noqa: BLE001 - any failure: run eagerly from here on, saying why once
            self.disabled = f"{type(exc).__name__}: {exc}"
            self._graphs.clear()
            self._pool = None
            log.warning("CUDA graph capture failed (span %d, width %d): %s; decode iterations run eagerly",
                        span, cols, self.disabled)
            return None
        log.info("captured a CUDA graph for decode iterations of %d rows and %d columns in %.0f ms (%d graphs)",
                 span, cols, 1000 * (time.perf_counter() - started), len(self._graphs) + 1)
        return _Replay(graph, out, (*cache.keys, *cache.values, *runner.rope_tables(cols)))
