"""The engine: one worker thread that owns the model and batches requests continuously.

Requests wait in a FIFO queue. Before every iteration the thread admits waiting sequences (a
request's prompts x n choices, in order) into the free slots of the
:class:`~rft_runtime.serve.batch.RunningBatch`, runs one iteration (one forward pass carrying the
running decodes and chunks of the newcomers' prompts), and hands finished requests back to the event
loop. A request larger than the batch joins piece by piece as slots free up.

Weight updates are applied by the same thread at an iteration boundary, once the requests running on
the old weights have finished: while an update is pending no new request is admitted (the rest of a
request already started still is), so every request runs on one set of weights and reports the policy
version it was admitted under.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from . import pacing as pacing_policy
from .batch import DEFAULT_PREFILL_TOKENS, RunningBatch
from .errors import EngineError
from .model import LoadedModel
from .protocol import SamplingParams
from .sequence import GenerationResult, Sequence

log = logging.getLogger(__name__)

class EngineMetrics(Protocol):
    """Hooks the engine reports through (see :mod:`rft_runtime.serve.metrics`)."""

    def observe_step(self, batch_size: int, new_tokens: int) -> None: ...

    def set_queue(self, running: int, waiting: int) -> None: ...

    def observe_aborted(self, sequences: int) -> None: ...

    def observe_graphs(self, replays: int, captures: int) -> None: ...

    def observe_pause(self, seconds: float) -> None: ...


Done = Callable[[GenerationResult | None, BaseException | None], None]
Progress = Callable[[int, list[tuple[Sequence, int, str | None]]], None]


@dataclass
class _Request:
    """A request in the engine, answered by its callbacks, which run in the engine thread (see
    :meth:`Engine.request`; :meth:`Engine.generate` hands them on to its event loop)."""

    seqs: list[Sequence]
    on_done: Done
    on_progress: Progress | None = None
    remaining: int = 0
    admitted: int = 0  # seqs[:admitted] have joined the batch
    version: int | None = None
    cancelled: bool = False


@dataclass
class _Swap:
    weights: dict[str, torch.Tensor]
    version: int | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    extra: dict[str, Any] = field(default_factory=dict)


def _resolve(fut: asyncio.Future, value: Any = None, exc: BaseException | None = None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)


def _call(callback: Callable[..., None], *args: Any) -> None:
    """Run a request's callback in the worker thread; its failure is logged, never the engine's."""
    try:
        callback(*args)
    except Exception:  # noqa: BLE001 - a caller's callback must not stop the engine
        log.exception("a request's callback failed")


def _notify(queue: asyncio.Queue, item: Any) -> None:
    queue.put_nowait(item)


def _post(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, item: Any) -> None:
    """Put ``item`` on ``queue`` on its event loop from the worker thread (a closed loop is ignored)."""
    try:
        loop.call_soon_threadsafe(_notify, queue, item)
    except RuntimeError:
        pass


def _deliver(loop: asyncio.AbstractEventLoop, fut: asyncio.Future, value: Any = None,
             exc: BaseException | None = None) -> None:
    """Resolve ``fut`` on its event loop from the worker thread (a closed loop is ignored)."""
    try:
        loop.call_soon_threadsafe(_resolve, fut, value, exc)
    except RuntimeError:
        pass


class Engine:
    """Continuous-batching generation over one loaded model."""

    def __init__(self, lm: LoadedModel, *, max_batch_size: int = 32, metrics: EngineMetrics | None = None,
                 policy_version: int = 0, prefill_tokens: int = DEFAULT_PREFILL_TOKENS,
                 kernels: str | None = None, cuda_graphs: str | None = None, pacing: str | None = None,
                 kv_cache_dtype: str | None = None):
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        self.lm = lm
        self.max_batch_size = max_batch_size
        self.metrics = metrics
        self.policy_version = policy_version
        self.last_step_ok: float | None = None  # time.monotonic() of the last successful step
        self.last_error: str | None = None
        self._batch = RunningBatch(lm.model, pad_token_id=lm.pad_token_id, eos_token_ids=lm.eos_token_ids,
                                   device=lm.device, decode_text=lm.codec.decode_text, max_slots=max_batch_size,
                                   max_len=lm.max_model_len, prefill_tokens=prefill_tokens,
                                   kernels=kernels, cuda_graphs=cuda_graphs, kv_cache_dtype=kv_cache_dtype)
        cache = self._batch.cache
        log.info("engine: %d sequences at once, KV cache %s (%d columns, up to %d; %s kernels)", max_batch_size,
                 str(cache.dtype).removeprefix("torch."), cache.capacity, cache.max_len,
                 "native" if self._batch.runner.kernels is not None else "torch")
        self._waiting: deque[_Request] = deque()
        self._swap: _Swap | None = None
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.num_aborted = 0  # sequences dropped because their client went away
        self.pacing = pacing_policy.setting(pacing)
        self.pacer: pacing_policy.ContentionPacer | None = None  # made in the engine thread (it measures it)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the worker thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rft-serve-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the worker thread; waiting requests fail."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    async def ready(self) -> None:
        """Return once the engine can take requests: at once, the model is loaded in this process."""

    @property
    def alive(self) -> bool:
        """True while the worker thread runs."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def num_running(self) -> int:
        """Sequences in the running batch."""
        return len(self._batch)

    @property
    def num_waiting(self) -> int:
        """Requests waiting for admission."""
        return len(self._waiting)

    # ------------------------------------------------------------------ API for the event loop

    async def generate(self, prompts: list[list[int]], params: list[SamplingParams],
                       progress: asyncio.Queue | None = None) -> GenerationResult:
        """Generate one sequence per (prompt, params) pair; all of them run under one policy version.

        With ``progress``, the engine puts ``(policy_version, [(sequence, tokens, finish_reason)])`` for the
        sequences that got a token after each iteration in which some did (their length and finish
        reason then), and ``None`` once the request is over (finished or failed)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def done(value: GenerationResult | None, exc: BaseException | None) -> None:
            _deliver(loop, future, value, exc)
            if progress is not None:
                _post(loop, progress, None)

        def advanced(version: int, seqs: list[tuple[Sequence, int, str | None]]) -> None:
            assert progress is not None  # passed only with a progress queue
            _post(loop, progress, (version, seqs))

        req = self.request(prompts, params, done, advanced if progress is not None else None)
        self.submit(req)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            self.cancel(req)  # the client went away: the engine drops the rows at its next step
            raise

    def request(self, prompts: list[list[int]], params: list[SamplingParams], on_done: Done,
                on_progress: Progress | None = None) -> _Request:
        """A request to :meth:`submit`, answered by callbacks that run in the engine thread: ``on_done(result,
        None)`` or ``on_done(None, error)`` once, and, when given, ``on_progress(policy_version, [(sequence,
        tokens, finish_reason)])`` after each iteration in which some of its sequences got a token. For a
        caller without an event loop in this process (the engine process's pipe): nothing to wake per answer."""
        if len(prompts) != len(params) or not prompts:
            raise ValueError("generate needs one SamplingParams per prompt, and at least one prompt")
        seqs = [Sequence(prompt=list(p), params=sp, index=i) for i, (p, sp) in enumerate(zip(prompts, params))]
        req = _Request(seqs=seqs, on_done=on_done, on_progress=on_progress, remaining=len(seqs))
        for s in seqs:
            s.owner = req
        return req

    def submit(self, req: _Request) -> None:
        """Queue ``req`` (from :meth:`request`) for admission; any thread."""
        if not self.alive:
            raise EngineError("the engine is not running")
        with self._cv:
            self._waiting.append(req)
            self._cv.notify_all()

    def cancel(self, req: _Request) -> None:
        """Drop ``req``: its rows leave the batch at the next iteration, and it is not answered (unless the
        engine fails meanwhile: then it gets the error). Any thread; a request already answered is not
        affected."""
        req.cancelled = True
        with self._cv:
            self._cv.notify_all()

    async def swap_weights(self, weights: dict[str, torch.Tensor], version: int | None = None) -> int:
        """Load ``weights`` (names as in the model's state dict) once the batch drains; returns the new
        policy version (``version`` when given, else the current one plus one)."""
        if not self.alive:
            raise EngineError("the engine is not running")
        loop = asyncio.get_running_loop()
        swap = _Swap(weights=weights, version=version, loop=loop, future=loop.create_future())
        with self._cv:
            if self._swap is not None:
                raise EngineError("a weight update is already in progress")
            self._swap = swap
            self._cv.notify_all()
        return await asyncio.shield(swap.future)

    async def load_weights(self, model_path: str, version: int | None = None) -> tuple[int, str]:
        """Read a checkpoint or LoRA adapter directory (:func:`~rft_runtime.serve.weights.read_weights`)
        and swap it in; returns the new policy version and ``"full"`` or ``"lora"``."""
        from .weights import read_weights

        weights, kind = await asyncio.to_thread(read_weights, model_path, base_dir=self.lm.model_dir,
                                                model=self.lm.model)
        return await self.swap_weights(weights, version), kind

    # ------------------------------------------------------------------ worker thread

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - the thread dies: fail everything instead of hanging
            log.exception("engine thread crashed")
            self.last_error = f"{type(exc).__name__}: {exc}"
            self._fail_all(EngineError(f"the engine crashed: {self.last_error}"))
            raise
        self._fail_all(EngineError("the engine stopped"))

    def _loop(self) -> None:
        if self.pacing == "auto":
            self.pacer = pacing_policy.ContentionPacer()
        try:
            self._iterate()
        finally:
            if self.pacer is not None:
                if self.pacer.pauses:
                    log.info("engine pacing: %d pauses, %.2f s in all", self.pacer.pauses, self.pacer.paused_s)
                self.pacer.close()

    def _iterate(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._waiting and not len(self._batch) and self._swap is None:
                    self._cv.wait()
                if self._stop:
                    return
                swap = self._swap
                newcomers = self._admit(started_only=swap is not None)
            self._drop_cancelled()
            if swap is not None and not len(self._batch) and not newcomers:
                self._apply_swap(swap)
                continue
            if not newcomers and not len(self._batch):
                continue
            started = time.perf_counter()
            self._step(newcomers)
            if self.pacer is not None:
                pause = self.pacer.after(running=len(self._batch), slots=self._batch.cache.slots,
                                         waiting=len(self._waiting), iteration_s=time.perf_counter() - started,
                                         admitted=len(newcomers))
                if pause:
                    paused = 0.0
                    with self._cv:  # a request arriving meanwhile ends the pause
                        if not self._waiting and not self._stop:
                            paused = time.perf_counter()
                            self._cv.wait(pause)
                            paused = time.perf_counter() - paused
                    if paused and self.metrics is not None:
                        self.metrics.observe_pause(paused)

    def _admit(self, started_only: bool = False) -> list[Sequence]:
        """Pop waiting sequences (FIFO) into the free slots; with ``started_only`` only the rest of requests
        already running (a pending weight update admits nothing new)."""
        taken: list[Sequence] = []
        room = self._batch.free_slots
        while self._waiting and room:
            req = self._waiting[0]
            if req.cancelled:
                self._waiting.popleft()
                self._count_aborted(len(req.seqs) - req.admitted)
                continue
            if req.version is None:
                if started_only:
                    break
                req.version = self.policy_version
            part = req.seqs[req.admitted: req.admitted + room]
            req.admitted += len(part)
            taken.extend(part)
            room -= len(part)
            if req.admitted == len(req.seqs):
                self._waiting.popleft()
        return taken

    def _drop_cancelled(self) -> None:
        rows = [i for i, s in enumerate(self._batch.seqs) if s.owner.cancelled]
        if rows:
            self._batch.retire(rows)
            self._count_aborted(len(rows))

    def _count_aborted(self, n: int) -> None:
        self.num_aborted += n
        if self.metrics is not None:
            self.metrics.observe_aborted(n)

    def _step(self, new_seqs: list[Sequence]) -> None:
        try:
            finished = self._batch.step(new_seqs)
        except Exception as exc:  # noqa: BLE001 - any model failure fails the requests involved
            log.exception("engine step failed")
            self.last_error = f"{type(exc).__name__}: {exc}"
            owners = {id(s.owner): s.owner for s in self._batch.seqs + new_seqs}
            self._batch.clear()
            for req in owners.values():
                req.cancelled = True  # the rest of a request still waiting for slots is dropped
                _call(req.on_done, None, EngineError(self.last_error))
            return
        self.last_step_ok = time.monotonic()
        if self.metrics is not None:
            stepped = len(self._batch) + len(finished)
            self.metrics.observe_step(stepped, len(self._batch.last_sampled))
            self.metrics.set_queue(len(self._batch), len(self._waiting))
            graphs = self._batch.runner.graphs
            if graphs is not None:
                replays, captures = graphs.take()
                if replays or captures:
                    self.metrics.observe_graphs(replays, captures)
        streams: dict[int, tuple[_Request, list[tuple[Sequence, int, str | None]]]] = {}
        for s in self._batch.last_sampled:
            if s.owner.on_progress is not None:
                streams.setdefault(id(s.owner), (s.owner, []))[1].append((s, len(s.output), s.finish_reason))
        for req, seqs in streams.values():
            assert req.on_progress is not None  # streams holds only requests with one
            _call(req.on_progress, int(req.version or 0), seqs)
        for s in finished:
            req = s.owner
            req.remaining -= 1
            if req.remaining == 0 and not req.cancelled:
                result = GenerationResult(sequences=req.seqs, policy_version=int(req.version or 0))
                _call(req.on_done, result, None)

    def _apply_swap(self, swap: _Swap) -> None:
        try:
            params = self.lm.model.state_dict()
            for name, tensor in swap.weights.items():  # check everything before changing anything
                if name not in params or tuple(params[name].shape) != tuple(tensor.shape):
                    raise ValueError(f"weight {name!r} does not match the served model")
            for name, tensor in swap.weights.items():
                params[name].copy_(tensor.to(device=params[name].device, dtype=params[name].dtype))
        except Exception as exc:  # noqa: BLE001
            log.exception("weight update failed")
            with self._cv:
                self._swap = None
            _deliver(swap.loop, swap.future, None, EngineError(f"weight update failed: {exc}"))
            return
        with self._cv:
            self.policy_version = swap.version if swap.version is not None else self.policy_version + 1
            self._swap = None
        _deliver(swap.loop, swap.future, self.policy_version)

    def _fail_all(self, exc: BaseException) -> None:
        with self._cv:
            reqs = list(self._waiting)
            self._waiting.clear()
            swap, self._swap = self._swap, None
        owners = {id(s.owner): s.owner for s in self._batch.seqs}
        self._batch.clear()
        for req in reqs + list(owners.values()):
            _call(req.on_done, None, exc)
        if swap is not None:
            _deliver(swap.loop, swap.future, None, exc)
