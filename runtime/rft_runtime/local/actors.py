"""The roles of a local run as Ray actors: inference (builtin server), trainer, rollout.

On one machine actors ask for ``num_cpus=0`` (the machine may have 2 cores; each actor pins torch
to a few threads instead) and log to ``<out>/logs/<role>.log``. On a Ray cluster the driver asks for
each role's CPUs and GPUs (:func:`.runner.cluster_resources`), and every actor takes its files from
the object store and keeps its outputs and logs on its own node (:mod:`.staging`). The trainer and rollout actors are threaded
(``max_concurrency=2``) so a stop request reaches them while a step or the loop runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path
from typing import Any

import ray

from rft_api import runtime
from rft_api.runtime import BIND_HOST_ENV

from .cores import pin_process

ACTOR_ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
}


def _setup_process(log_file: str | None, threads: int, *, computes: bool = True,
                   cpus: tuple[int, ...] | None = None, env: dict[str, str] | None = None) -> None:
    """Environment, torch's threads, logging and cores of an actor's process. ``computes``: whether the
    role computes with torch (inference, trainer; :func:`_setup_compute`); a rollout worker only
    tokenizes, and does not import torch unless the job's own code does
    (:func:`~rft_runtime.rollout.loop.runs_user_code`). ``cpus``: the cores the process (and the
    processes it starts) keeps to (:mod:`.cores`; None: wherever the system runs it). ``env``: the role's
    ``env`` from the manifest (its literal values), set before anything reads the environment and kept by
    the processes the role starts."""
    os.environ.update(env or {})
    for k, v in ACTOR_ENV.items():
        os.environ.setdefault(k, v)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    if log_file:
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        h = logging.FileHandler(log_file)
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(h)
    if cpus and pin_process(cpus):
        logging.getLogger(__name__).info("running on cores %s", ",".join(map(str, cpus)))
    if computes:  # else nor transformers, which would decide now that torch is there to import
        _setup_compute(threads)


def _setup_compute(threads: int) -> None:
    """torch's intra-op threads, and transformers quiet."""
    import torch

    torch.set_num_threads(max(1, threads))
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:  # pragma: no cover
        pass


class _Staged:
    """What every role actor has on a Ray cluster with no shared filesystem (:mod:`.staging`): its
    work directory on its node, its log files, and the run's clean-up on its node."""

    stage: Any = None

    def _open_stage(self, shipment: Any, role: str, log_file: str | None) -> str | None:
        """Set up the actor's stage when the run ships its files (``shipment``); returns where the
        actor logs (``log_file`` itself on one machine, the same name in its work directory else)."""
        if shipment is None:
            return log_file
        from .staging import Stage

        self.stage = Stage(shipment, role)
        return str(self.stage.log_dir / Path(log_file).name) if log_file else None

    def logs(self) -> dict[str, bytes]:
        """The actor's log files (on a cluster; on one machine they are in ``<out>/logs`` already)."""
        return self.stage.logs() if self.stage is not None else {}

    def cleanup(self) -> None:
        """Remove the run's directory on this node (on a cluster, once outputs and logs are copied)."""
        if self.stage is not None:
            self.stage.cleanup()


def node_host(local: bool) -> str:
    """The host other actors reach this one at, and the address its servers bind: 127.0.0.1 locally;
    on a Ray cluster (``rft run --address``) ``$RFT_BIND_HOST`` when the run sets it (a one-machine
    cluster kept on loopback: Ray itself never takes 127.0.0.1 as a node's IP), else this node's IP."""
    if local:
        return "127.0.0.1"
    return os.environ.get(BIND_HOST_ENV) or ray.util.get_node_ip_address()


@ray.remote(num_cpus=0)
class InferenceActor(_Staged):
    """The builtin inference server (vLLM-compatible API) serving ``model_dir`` (the driver's path,
    or on a cluster the copy of it that ``shipment`` carries). ``engine_process`` (``rft run
    --engine-process``): the engine runs in a child process of this actor, as ``rft serve`` runs it by
    default (:mod:`~rft_runtime.serve.procengine`: the HTTP side and the engine do not share a GIL);
    else in a thread of this actor.

    Created light: the constructor only binds the server's socket, so that :meth:`url` answers at once
    and the trainer and the rollout workers can be configured while :meth:`start` loads the model and
    starts serving on that socket (nothing else can take its port meanwhile)."""

    def __init__(self, model_dir: str, served_name: str, *, local: bool, threads: int = 1,
                 max_batch_size: int = 256, dtype: str = "auto", max_model_len: int | None = None,
                 log_file: str | None = None, shipment: Any = None, role: str = "inference",
                 engine_process: bool = False, cpus: tuple[int, ...] | None = None,
                 settings: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> None:
        self.log_file = self._open_stage(shipment, role, log_file)
        _setup_process(self.log_file, threads, computes=False, cpus=cpus, env=env)
        from ..coordinator.server import bind_socket

        self.host = node_host(local)
        self.sock = bind_socket(self.host)
        self.port = int(self.sock.getsockname()[1])
        self.server: Any = None
        self._serve = (model_dir, served_name, threads, max_batch_size, dtype, max_model_len, engine_process)
        self._settings = dict(settings or {})  # spec.inference.extraArgs (serve.server.engine_settings)

    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> str:
        """Load the model and serve it on the bound socket; returns :meth:`url`."""
        model_dir, served_name, threads, max_batch_size, dtype, max_model_len, engine_process = self._serve
        _setup_compute(threads)
        if self.stage is not None:
            model_dir = self.stage.get(model_dir)
        from .. import auth
        from ..coordinator.server import AppThread
        from ..serve.server import build_engine, create_app

        settings = dict(self._settings)
        app_kwargs = {k: settings.pop(k) for k in ("health_timeout", "trust_request_chat_template") if k in settings}
        load_kwargs = {"dtype": dtype, "max_model_len": max_model_len}
        if "device" in settings:
            load_kwargs["device"] = settings.pop("device")
        settings.setdefault("max_batch_size", max_batch_size)
        engine = build_engine(model_dir, engine_process=engine_process, threads=threads, log_file=self.log_file,
                              load_kwargs=load_kwargs, **settings)
        token = auth.server_token("inference")  # the run's token (rft run puts it in every actor's env)
        self.server = AppThread(create_app(engine, served_name, stop_engine_on_cleanup=True, token=token,
                                           **app_kwargs), sock=self.sock).start()
        logging.getLogger(__name__).info("serving %s as %r at %s", model_dir, served_name, self.url())
        return self.url()

    def shutdown(self) -> None:
        if self.server is not None:
            self.server.stop()

    def cleanup(self) -> None:
        self.shutdown()
        super().cleanup()


@ray.remote(num_cpus=0, max_concurrency=2)  # type: ignore[call-overload]  # ray's stubs lack max_concurrency
class TrainerActor(_Staged):
    """The trainer role (:class:`~rft_runtime.trainer.trainer.Trainer`, coordinator included): global
    rank 0 of the trainer's process group. With ``trainer.nodes × processesPerNode`` above 1 it
    starts the other ranks on this machine (:mod:`~rft_runtime.trainer.launch`, one gloo group; their
    logs are ``trainer-rank-<node>-<local>.log`` beside this actor's).

    The actor is created with the other roles, before its config exists (that names the inference
    servers' URLs): its process starts and imports the trainer while the servers load their models;
    :meth:`setup` then builds the trainer."""

    def __init__(self, *, threads: int = 1, local: bool = True, log_file: str | None = None,
                 shipment: Any = None, cpus: tuple[int, ...] | None = None,
                 env: dict[str, str] | None = None) -> None:
        log_file = self._open_stage(shipment, "trainer", log_file)
        _setup_process(log_file, threads, cpus=cpus, env=env)
        from ..trainer import trainer  # noqa: F401 - imported now, in parallel with the other roles

        self.threads, self.local, self.log_file = threads, local, log_file
        self._ranks: list[Any] = []
        self._stop = threading.Event()

    def prepare(self, config_doc: str, *, resume: bool, require_resume: bool, max_steps: int | None,
                work_dir: str | None = None) -> dict[str, Any]:
        """Build the trainer up to its coordinator (:meth:`~rft_runtime.trainer.trainer.Trainer.prepare`:
        it does not need inference yet); :meth:`publish_initial` then brings inference to its weights."""
        # The coordinator listens on this actor's node only (loopback locally, the node IP on a Ray
        # cluster, where this actor may run on another node than the driver) and advertises that host.
        host = node_host(self.local)
        os.environ[BIND_HOST_ENV] = host
        from ..trainer import launch
        from ..trainer.distributed import context_for
        from ..trainer.trainer import Trainer

        cfg = runtime.parse(config_doc)
        cfg = cfg.model_copy(update={"endpoints": cfg.endpoints.model_copy(
            update={"coordinator": f"http://{host}:{cfg.ports.coordinator}"})})
        if self.stage is not None:  # inputs from the object store; outputs in the work dir, pulled by the driver
            cfg = self.stage.localize(cfg, outputs=True)
            work_dir = str(self.stage.work)
        config_doc = cfg.to_json()
        t = cfg.spec.trainer
        if t.world_size() > 1:
            if work_dir is None:
                raise ValueError("a trainer of several processes needs a work_dir for their config")
            path = Path(work_dir) / "trainer-config.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(config_doc)
            ranks = [(n, r) for n in range(t.nodes) for r in range(t.processes()) if (n, r) != (0, 0)]
            self._ranks = launch.start_ranks(path, ranks, log_dir=Path(self.log_file).parent if self.log_file else None,
                                             threads=self.threads)
        self.trainer = Trainer(cfg, resume=resume, require_resume=require_resume, max_steps=max_steps,
                               should_stop=self._stop.is_set, dist=context_for(cfg, 0, 0))
        tr = self.trainer.prepare()
        return {"coordinator_url": tr.coordinator_url, "step": tr.step_count, "max_steps": tr.max_steps,
                "resumed_from": tr.resumed_from, "policy_version": tr.policy_version}

    def publish_initial(self) -> None:
        """Every inference server serves the trainer's current weights (once they are all up)."""
        self.trainer.publish_initial()

    def changed_outputs(self, known: dict[str, tuple[int, int]]) -> tuple[dict[str, bytes], list[str],
                                                                         dict[str, tuple[int, int]]]:
        """The outputs written or removed since ``known`` (:class:`.staging.OutputSync`)."""
        from .staging import changed_outputs

        return changed_outputs(self.stage.work, known)

    def step(self) -> dict[str, Any] | None:
        """One step's metrics; None when a stop request interrupted the step."""
        from ..trainer.trainer import StopRequested

        try:
            return self.trainer.step()
        except StopRequested:
            return None

    def finished(self) -> bool:
        """Every step ran, or the evaluation stopped training early."""
        return bool(self.trainer.finished)

    def request_stop(self) -> None:
        self._stop.set()

    def finish(self) -> None:
        self.trainer.finish()

    def stop(self) -> int:
        self.trainer.stop(checkpoint=True)
        return self.trainer.step_count

    def close(self) -> None:
        from ..trainer import launch

        try:
            if hasattr(self, "trainer"):
                self.trainer.close(tell_workers_s=0)  # rft run stops its rollout workers itself
        finally:
            launch.wait_ranks(self._ranks)


@ray.remote(num_cpus=0, max_concurrency=2)  # type: ignore[call-overload]  # ray's stubs lack max_concurrency
class RolloutActor(_Staged):
    """The rollout role (:class:`~rft_runtime.rollout.loop.RolloutLoop`). Created with the other roles,
    before its config exists (that names the coordinator, which the trainer's set-up starts): its
    process starts and imports the rollout loop meanwhile; :meth:`run` gets the config."""

    def __init__(self, worker_id: str, *, threads: int = 1, log_file: str | None = None,
                 shipment: Any = None, cpus: tuple[int, ...] | None = None) -> None:
        log_file = self._open_stage(shipment, worker_id, log_file)
        _setup_process(log_file, threads, computes=False, cpus=cpus)
        from ..rollout import loop  # noqa: F401 - imported now, in parallel with the other roles

        self.worker_id = worker_id
        self._stop = threading.Event()

    def run(self, config_doc: str) -> dict[str, int]:
        """Run the loop until the coordinator says done or :meth:`stop` is called."""
        import dataclasses

        from ..rollout.loop import RolloutLoop

        cfg = runtime.parse(config_doc)
        if self.stage is not None:  # the tokenizer and evaluator files from the object store
            cfg = self.stage.localize(cfg, tokenizer_only=True)
        loop = RolloutLoop(cfg, worker_id=self.worker_id, should_stop=self._stop.is_set)
        return dataclasses.asdict(asyncio.run(loop.run()))

    def stop(self) -> None:
        self._stop.set()
