"""The engine in its own process (``rft serve``'s default, ``rft run --engine-process``): the HTTP
front end and the engine core then hold separate GILs.

The child process loads the model and runs an :class:`~rft_runtime.serve.engine.Engine`; the front end
holds only the tokenizer (:class:`ServedModel`) and a :class:`ProcessEngine` with the engine's async
API. They talk over one ``multiprocessing`` pipe (pickled tuples):

* front end -> engine: ``("gen", rid, prompts, params, stream)``, ``("cancel", rid)``,
  ``("load", rid, model_path, version)``, ``("stop",)``;
* engine -> front end: ``("tok", rid, version, updates)`` (streamed requests: each sequence's new
  tokens, logprobs, top alternatives and finish), ``("done", rid, version, outputs)``,
  ``("loaded", rid, version, kind)``, ``("fail", rid, error kind, message)``,
  ``("metrics", None, counts)`` (what the engine observed since the last such message: steps and
  their generated tokens by batch size, aborted sequences, and the queue now).

In the child, generation answers are sent by the engine thread (see :func:`_child_serve`). The front end
rebuilds :class:`~rft_runtime.serve.sequence.Sequence` objects from those messages, so the
routes and renderers are the same in both modes, and replays the engine's observations into its own
:class:`~rft_runtime.serve.metrics.ServeMetrics`: the child sends them before every answer (so a
``/metrics`` read after a response counts its tokens) and every :data:`METRICS_INTERVAL_S` while it
works.

The child is spawned by :meth:`ProcessEngine.launch`, which ``rft serve`` calls first thing: the model
loads in the child while the front end loads the tokenizer and builds its routes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing as mp
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..model.loading import torch_hidden
from .codec import TextCodec, eos_ids
from .errors import EngineError, WeightLoadError
from .protocol import SamplingParams
from .sequence import GenerationResult, Sequence

log = logging.getLogger(__name__)

METRICS_INTERVAL_S = 0.5


@dataclass
class ServedModel:
    """What the front end needs to know about the model (no weights)."""

    codec: TextCodec
    model_dir: str
    vocab_size: int
    eos_token_ids: frozenset[int]
    pad_token_id: int
    max_model_len: int
    model: Any = None


# ---------------------------------------------------------------------------------------------- child


def _seq_state(s: Sequence, start: int, end: int, reason: str | None) -> tuple:
    return (s.index, s.output[start:end], s.logprobs[start:end], s.top[start:end],
            s.prompt_logprobs if start == 0 else None, reason, s.stop_reason if reason is not None else None)


class _MetricsRelay:
    """The engine's metrics hooks in the child: counts what the engine observes until it is sent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # observed by the engine thread, taken by the event loop
        self._steps: dict[int, list[int]] = {}  # batch size -> [steps, tokens they generated]
        self._aborted = 0
        self._engine = [0, 0, 0, 0.0]  # graph replays, graph captures, pauses, seconds paused
        self._queue = (0, 0)
        self._dirty = False

    def observe_step(self, batch_size: int, new_tokens: int) -> None:
        with self._lock:
            entry = self._steps.setdefault(batch_size, [0, 0])
            entry[0] += 1
            entry[1] += new_tokens
            self._dirty = True

    def set_queue(self, running: int, waiting: int) -> None:
        with self._lock:
            self._queue = (running, waiting)
            self._dirty = True

    def observe_aborted(self, sequences: int) -> None:
        with self._lock:
            self._aborted += sequences
            self._dirty = True

    def observe_graphs(self, replays: int, captures: int) -> None:
        with self._lock:
            self._engine[0] += replays
            self._engine[1] += captures
            self._dirty = True

    def observe_pause(self, seconds: float) -> None:
        with self._lock:
            self._engine[2] += 1
            self._engine[3] += seconds
            self._dirty = True

    def take(self) -> dict | None:
        """What was observed since the last call (None: nothing)."""
        with self._lock:
            if not self._dirty:
                return None
            out = {"steps": self._steps, "aborted": self._aborted, "queue": self._queue, "engine": self._engine}
            self._steps, self._aborted, self._engine, self._dirty = {}, 0, [0, 0, 0, 0.0], False
            return out


class _ChildServer:
    """The child's side of the pipe. Generation requests are answered from the engine thread itself
    (:meth:`Engine.request` callbacks): a finished request costs no wake-up of this event loop, and no hand
    of the GIL back and forth between the two threads per answer. The event loop reads the pipe, loads
    weights and sends the periodic metrics; a lock keeps the two threads' messages whole."""

    def __init__(self, conn: Any, engine: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.conn, self.engine, self.loop = conn, engine, loop
        self.requests: dict[int, Any] = {}  # rid -> the engine's request, until answered (for "cancel")
        self.closed = asyncio.Event()
        self.relay: _MetricsRelay = engine.metrics
        self.send_lock = threading.Lock()

    async def serve(self) -> None:
        """Answer the pipe until it closes or the front end says stop."""
        self.loop.add_reader(self.conn.fileno(), self.on_readable)
        flusher = asyncio.ensure_future(self.flush_metrics())
        self.send(("ready", self.engine.policy_version))
        await self.closed.wait()
        flusher.cancel()
        self.loop.remove_reader(self.conn.fileno())

    def send(self, msg: tuple) -> None:
        """Send ``msg`` from either thread (an answer after the metrics observed before it); a broken pipe
        closes the server."""
        try:
            with self.send_lock:
                if msg[0] in ("done", "fail") and (counts := self.relay.take()) is not None:
                    self.conn.send(("metrics", None, counts))
                self.conn.send(msg)
        except (OSError, EOFError, BrokenPipeError):
            try:
                self.loop.call_soon_threadsafe(self.closed.set)
            except RuntimeError:  # the loop has closed: so has the pipe's reader
                pass

    async def flush_metrics(self) -> None:
        while True:
            await asyncio.sleep(METRICS_INTERVAL_S)
            if (counts := self.relay.take()) is not None:
                self.send(("metrics", None, counts))

    def on_readable(self) -> None:
        """Handle every message waiting in the pipe."""
        while self.conn.poll():
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                self.closed.set()
                return
            kind = msg[0]
            if kind == "gen":
                self.gen(*msg[1:])
            elif kind == "cancel":
                req = self.requests.pop(msg[1], None)
                if req is not None:
                    self.engine.cancel(req)
            elif kind == "load":
                asyncio.ensure_future(self.load(*msg[1:]))
            elif kind == "stop":
                self.closed.set()
                return

    def gen(self, rid: int, prompts: list, params: list, stream: bool) -> None:
        """Submit a generation request; the engine thread answers it through the callbacks made here."""
        sent: dict[int, int] = {}  # tokens of each sequence already sent (streaming)

        def progress(version: int, ups: list) -> None:
            out = []
            for s, n, reason in ups:
                out.append(_seq_state(s, sent.get(s.index, 0), n, reason))
                sent[s.index] = n
            self.send(("tok", rid, version, out))

        def done(result: GenerationResult | None, exc: BaseException | None) -> None:
            self.requests.pop(rid, None)
            if result is None:
                self.send(("fail", rid, "engine", str(exc)))
                return
            self.send(("done", rid, result.policy_version,
                       [_seq_state(s, sent.get(s.index, 0), len(s.output), s.finish_reason) for s in result.sequences]))

        req = self.requests[rid] = self.engine.request(prompts, params, done, progress if stream else None)
        try:
            self.engine.submit(req)
        except EngineError as exc:
            done(None, exc)

    async def load(self, rid: int, path: str, version: int | None) -> None:
        """Read the weights at ``path`` off the event loop, swap them in, and answer."""
        from .weights import read_weights

        try:
            weights, kind = await asyncio.to_thread(read_weights, path, base_dir=self.engine.lm.model_dir,
                                                    model=self.engine.lm.model)
            new = await self.engine.swap_weights(weights, version)
            self.send(("loaded", rid, new, kind))
        except (WeightLoadError, OSError) as exc:
            self.send(("fail", rid, "weights", str(exc)))
        except EngineError as exc:
            self.send(("fail", rid, "engine", str(exc)))


async def _child_serve(conn: Any, engine: Any) -> None:
    """The child's side of the pipe (:class:`_ChildServer`), until it closes."""
    await _ChildServer(conn, engine, asyncio.get_running_loop()).serve()


def _child_main(conn: Any, model_dir: str, load_kwargs: dict, engine_kwargs: dict, threads: int | None,
                log_file: str | None, log_level: str) -> None:
    import torch

    from .engine import Engine
    from .model import load_model

    # a spawned process does not inherit the parent's logging: the same level, to its file or stderr
    logging.basicConfig(level=log_level, filename=log_file,
                        format="%(asctime)s %(levelname)s %(name)s[engine]: %(message)s")
    if threads:
        torch.set_num_threads(threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    lm = load_model(model_dir, **load_kwargs)
    engine = Engine(lm, metrics=_MetricsRelay(), **engine_kwargs)
    engine.start()
    log.info("engine process %d (parent %d): %s on %s in %s", os.getpid(), os.getppid(), model_dir, lm.device,
             str(lm.dtype).removeprefix("torch."))
    try:
        asyncio.run(_child_serve(conn, engine))
    finally:
        log.info("engine process %d: stopped", os.getpid())
        engine.stop()


# ---------------------------------------------------------------------------------------------- parent


@dataclass
class _Pending:
    seqs: list[Sequence]
    future: asyncio.Future
    progress: asyncio.Queue | None


class ProcessEngine:
    """The :class:`~rft_runtime.serve.engine.Engine` API, served by a child process."""

    def __init__(self, lm: ServedModel | None, model_dir: str, *, load_kwargs: dict, max_batch_size: int = 32,
                 policy_version: int = 0, threads: int | None = None, metrics: Any = None,
                 log_file: str | None = None, log_level: str = "INFO", cuda_graphs: str | None = None,
                 pacing: str | None = None, kv_cache_dtype: str | None = None):
        self.lm = lm  # may be set after launch(), before start()
        self.max_batch_size = max_batch_size
        self.metrics = metrics
        self.policy_version = policy_version
        self.last_step_ok: float | None = None
        self.last_error: str | None = None
        engine_kwargs = {"max_batch_size": max_batch_size, "policy_version": policy_version, "cuda_graphs": cuda_graphs,
                         "pacing": pacing, "kv_cache_dtype": kv_cache_dtype}
        self._args = (model_dir, load_kwargs, engine_kwargs,
                      threads, log_file, log_level.upper())
        self._proc: Any = None
        self._conn: Any = None
        self._ids = itertools.count()
        self._pending: dict[int, _Pending] = {}
        self._loads: dict[int, asyncio.Future] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dead = False
        self._ready: asyncio.Future | None = None  # resolved by the child's "ready"
        self._queue = (0, 0)  # the child's running sequences and waiting requests, as last reported

    # ------------------------------------------------------------------ lifecycle

    def launch(self) -> None:
        """Spawn the engine process (idempotent); it loads the model while this process goes on."""
        if self._proc is not None:
            return
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_child_main, args=(child, *self._args), name="rft-serve-engine", daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent

    def start(self) -> None:
        """Launch the engine process if needed and read its pipe on the running event loop."""
        if self._loop is not None:
            return
        self.launch()
        self._loop = asyncio.get_running_loop()
        self._ready = self._loop.create_future()
        self._loop.add_reader(self._conn.fileno(), self._on_readable)

    async def ready(self) -> None:
        """Return once the engine process has loaded the model; raise :class:`EngineError` if it exits first."""
        if self._ready is None:
            raise EngineError("the engine process was not started")
        await asyncio.shield(self._ready)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the engine process; pending requests fail."""
        if self._proc is None:
            return
        try:
            self._conn.send(("stop",))
        except (OSError, BrokenPipeError):
            pass
        self._proc.join(timeout)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout)
        self._close(EngineError("the engine stopped"))

    def _close(self, exc: EngineError) -> None:
        self._dead = True
        if self._loop is not None and self._conn is not None:
            try:
                self._loop.remove_reader(self._conn.fileno())
            except (ValueError, OSError, RuntimeError):
                pass
        for p in self._pending.values():
            if not p.future.done():
                p.future.set_exception(exc)
            if p.progress is not None:
                p.progress.put_nowait(None)
        for f in [*self._loads.values(), self._ready]:
            if f is not None and not f.done():
                f.set_exception(exc)
        self._pending.clear()
        self._loads.clear()

    @property
    def alive(self) -> bool:
        """True while the engine process runs."""
        return self._proc is not None and self._proc.is_alive() and not self._dead

    @property
    def num_running(self) -> int:
        """Sequences in the engine's running batch, as the engine last reported."""
        return self._queue[0]

    @property
    def num_waiting(self) -> int:
        """Requests waiting for admission, as the engine last reported."""
        return self._queue[1]

    # ------------------------------------------------------------------ pipe

    def _on_readable(self) -> None:
        try:
            while self._conn.poll():
                self._dispatch(self._conn.recv())
        except (EOFError, OSError):
            self._proc.join(1.0)
            self.last_error = f"the engine process exited (exit code {self._proc.exitcode}; its error is in this log)"
            self._close(EngineError(self.last_error))

    def _dispatch(self, msg: tuple) -> None:
        kind, rid = msg[0], msg[1]
        if kind == "ready":
            if self._ready is not None and not self._ready.done():
                self._ready.set_result(None)
            return
        if kind == "metrics":
            self._replay(msg[2])
            return
        if kind in ("tok", "done"):
            self.last_step_ok = time.monotonic()
            p = self._pending.get(rid)
            if p is None:
                return
            version, states = msg[2], msg[3]
            ups = []
            for index, out, lps, top, plp, reason, stop in states:
                s = p.seqs[index]
                s.output.extend(out)
                s.logprobs.extend(lps)
                s.top.extend(top)
                if plp is not None:
                    s.prompt_logprobs = plp
                if reason is not None:
                    s.finish_reason, s.stop_reason = reason, stop
                ups.append((s, len(s.output), s.finish_reason))
            if p.progress is not None and kind == "tok":
                p.progress.put_nowait((version, ups))
            if kind == "done":
                del self._pending[rid]
                if not p.future.done():
                    p.future.set_result(GenerationResult(sequences=p.seqs, policy_version=version))
                if p.progress is not None:
                    p.progress.put_nowait(None)
        elif kind == "loaded":
            self.policy_version = msg[2]
            f = self._loads.pop(rid, None)
            if f is not None and not f.done():
                f.set_result((msg[2], msg[3]))
        elif kind == "fail":
            err = WeightLoadError(msg[3]) if msg[2] == "weights" else EngineError(msg[3])
            p = self._pending.pop(rid, None)
            if p is not None:
                if not p.future.done():
                    p.future.set_exception(err)
                if p.progress is not None:
                    p.progress.put_nowait(None)
            f = self._loads.pop(rid, None)
            if f is not None and not f.done():
                f.set_exception(err)

    def _replay(self, counts: dict) -> None:
        """Observe, in this process's metrics, what the engine observed (see :class:`_MetricsRelay`)."""
        self._queue = tuple(counts["queue"])
        m = self.metrics
        if m is None:
            return
        for size, (steps, tokens) in counts["steps"].items():
            for i in range(steps):
                m.observe_step(size, tokens if i == 0 else 0)
        if counts["aborted"]:
            m.observe_aborted(counts["aborted"])
        replays, captures, pauses, paused_s = counts["engine"]
        if replays or captures:
            m.observe_graphs(replays, captures)
        if pauses:
            m.observe_pause(paused_s, pauses)
        m.set_queue(*self._queue)

    # ------------------------------------------------------------------ API

    async def generate(self, prompts: list[list[int]], params: list[SamplingParams],
                       progress: asyncio.Queue | None = None) -> GenerationResult:
        """As :meth:`Engine.generate <rft_runtime.serve.engine.Engine.generate>`."""
        if len(prompts) != len(params) or not prompts:
            raise ValueError("generate needs one SamplingParams per prompt, and at least one prompt")
        if not self.alive:
            raise EngineError("the engine is not running")
        rid = next(self._ids)
        seqs = [Sequence(prompt=list(p), params=sp, index=i) for i, (p, sp) in enumerate(zip(prompts, params))]
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = _Pending(seqs, fut, progress)
        self._conn.send(("gen", rid, [s.prompt for s in seqs], list(params), progress is not None))
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            self._pending.pop(rid, None)
            if self.alive:
                self._conn.send(("cancel", rid))
            raise

    async def load_weights(self, model_path: str, version: int | None) -> tuple[int, str]:
        """Read ``model_path`` in the engine process and swap it in; returns (policy version, format)."""
        if not self.alive:
            raise EngineError("the engine is not running")
        rid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._loads[rid] = fut
        self._conn.send(("load", rid, model_path, version))
        return await fut


def served_model(model_dir: str, max_model_len: int | None, *, torch_free: bool = False) -> ServedModel:
    """The tokenizer and limits of ``model_dir``, without loading weights (front end of process mode).

    ``torch_free``: load them without importing torch (:func:`~rft_runtime.model.loading.torch_hidden`),
    for a process that is only the front end (``rft serve``); the engine process has its own torch."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with torch_hidden(torch_free):
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        try:
            gen_eos = GenerationConfig.from_pretrained(model_dir, local_files_only=True).eos_token_id
        except OSError:
            gen_eos = None
    text_cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = int(text_cfg.vocab_size)
    eos = eos_ids(tokenizer.eos_token_id, gen_eos, getattr(text_cfg, "eos_token_id", None))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else getattr(text_cfg, "pad_token_id", None)
    limit = max_model_len or int(getattr(text_cfg, "max_position_embeddings", 0) or 0)
    return ServedModel(codec=TextCodec(tokenizer, vocab), model_dir=str(model_dir), vocab_size=vocab,
                       eos_token_ids=eos, pad_token_id=int(pad if pad is not None else (min(eos) if eos else 0)),
                       max_model_len=limit)
