"""``rft run JOB.yaml``: the RFTJob manifest the operator takes, run on this machine with Ray.

Roles start as Ray actors — builtin inference server(s), the trainer (with its coordinator), and
rollout worker(s) — exactly the processes a cluster runs, talking over the same HTTP contracts.
The driver steps the trainer, shows a progress bar, and handles Ctrl-C: the first SIGINT stops
after the current step (a step still collecting is abandoned) and writes a checkpoint of the last
completed step that ``--resume`` continues; a second SIGINT aborts at once.

Output directory: ``metrics.jsonl``, ``tensorboard/``, ``checkpoints/`` (with ``weights/`` and the
sampled completions in ``samples/``, which ``rft samples`` prints), ``progress.json``, ``samples.json``,
``reward_curve.png``, ``logs/<role>.log``, ``config.json``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from rft_api import layout, runtime
from rft_api.job import RFTJob

from ..metrics_sink import read_metrics
from .cores import available_cores, claimed_role_cores
from .report import format_summary, plot_reward_curve, reward_summary

log = logging.getLogger(__name__)

EXIT_INTERRUPTED = 130


class LocalRunError(RuntimeError):
    """The local run cannot start or failed; the message says why."""


@dataclass
class RunOptions:
    """Arguments of ``rft run``."""

    manifest: str
    out: str | None = None
    resume: bool = False
    address: str | None = None
    max_steps: int | None = None
    progress_bar: bool = True
    threads: int = 1
    engine_process: bool = False
    """Each inference actor runs its engine in a child process (False: in a thread of the actor)."""
    pin_cores: bool = True
    """On one machine with training and generation overlapping, the trainer's processes keep to cores of
    their own (:mod:`.cores`; False: the system places every process)."""
    allow_unauthenticated_ray: bool = False
    """Attach to a Ray cluster whose nodes run without Ray's token authentication (refused otherwise)."""


@dataclass
class RunResult:
    """What a local run did."""

    out: Path
    steps: int
    interrupted: bool
    seconds: float
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int = 0


class _Interrupts:
    """First SIGINT: request a clean stop. Second: KeyboardInterrupt."""

    def __init__(self) -> None:
        self.count = 0
        self.on_first: Any = None
        self._previous: Any = None

    def __enter__(self) -> "_Interrupts":
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous or signal.SIG_DFL)

    def _handle(self, signum: int, frame: object) -> None:
        self.count += 1
        if self.count == 1:
            print("\nrft run: stopping after the current step (Ctrl-C again to abort)...", flush=True)
            if self.on_first is not None:
                self.on_first()
        else:
            raise KeyboardInterrupt

    @property
    def requested(self) -> bool:
        return self.count > 0


def _out_dir(opts: RunOptions, job_name: str, max_steps: int) -> Path:
    """The output directory, checked against --resume before anything starts."""
    from ..trainer.checkpoint import CheckpointManager

    out = Path(opts.out) if opts.out else Path("runs") / job_name
    latest = out / "checkpoints" / "latest"
    if latest.exists() and not opts.resume:
        raise LocalRunError(f"{out} already holds checkpoints of a run; pass --resume to continue it, "
                            "or choose another --out")
    if opts.resume:
        if not latest.exists():
            raise LocalRunError(f"--resume: no checkpoint under {out / 'checkpoints'}")
        head = CheckpointManager(out / "checkpoints").latest()
        if head is not None and head.step >= max_steps:
            raise LocalRunError(f"--resume: the latest checkpoint is at step {head.step} and the run has "
                                f"{max_steps} steps: nothing to do (raise trainer.maxSteps or --max-steps)")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _unwrap(e: BaseException) -> BaseException:
    """The exception a role raised, out of Ray's wrapper (its message names the problem)."""
    cause = getattr(e, "cause", None)
    return cause if isinstance(cause, BaseException) else e


RAY_CLIENT_ATTEMPTS = 3
"""Connections to a ``ray://`` address tried before giving up: Ray Client's proxier now and then loses
the server process it starts for a connection (ray-project/ray#63202, a fork race in its gRPC poller),
and the next connection gets a new one."""


def _attach_ray(address: str, kwargs: dict[str, Any]) -> None:
    import ray

    for attempt in range(1, RAY_CLIENT_ATTEMPTS + 1):
        try:
            ray.init(address=address, **kwargs)
            return
        except ConnectionAbortedError as e:
            if not address.startswith("ray://") or attempt == RAY_CLIENT_ATTEMPTS:
                raise
            log.warning("the Ray Client server at %s failed to start a session (%s); connecting again (%d of %d)",
                        address, str(e).strip().splitlines()[-1], attempt + 1, RAY_CLIENT_ATTEMPTS)
            ray.shutdown()
            time.sleep(attempt)


def _cluster_auth_mode() -> str:
    """Ray's authentication mode as the attached cluster's own worker processes have it (they take it
    from their node's configuration, not from this driver)."""
    import ray

    @ray.remote(num_cpus=0)
    def mode() -> str:
        from ray._private.authentication.authentication_utils import is_token_auth_enabled

        return "token" if is_token_auth_enabled() else "disabled"

    return str(ray.get(mode.remote(), timeout=120))


def _check_cluster_auth(address: str, allow_unauthenticated: bool) -> None:
    """Refuse a Ray cluster that runs without token authentication: whoever reaches its ports could run
    code in the roles' processes, which hold the run's token and the job's data."""
    mode = _cluster_auth_mode()
    if mode == "token":
        return
    if allow_unauthenticated:
        log.warning("the Ray cluster at %s runs without authentication (RAY_AUTH_MODE=%s on its nodes); "
                    "going on as --allow-unauthenticated-ray asks", address, mode)
        return
    import ray

    ray.shutdown()
    raise LocalRunError(f"the Ray cluster at {address} runs without authentication (RAY_AUTH_MODE={mode} on its "
                        "nodes): anyone who reaches its ports can run code next to the job's roles. Start its nodes "
                        "with RAY_AUTH_MODE=token (and give this shell the token: RAY_AUTH_TOKEN_PATH), or pass "
                        "--allow-unauthenticated-ray on a network only you reach")


def _init_ray(address: str | None, token: str, allow_unauthenticated: bool = False) -> None:
    """Start (or attach to) Ray; every actor gets the run's token in ``$RFT_JOB_TOKEN``."""
    import ray

    from .actors import ACTOR_ENV

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env = {**ACTOR_ENV, runtime.JOB_TOKEN_ENV: token}
    if address and os.environ.get(runtime.BIND_HOST_ENV):  # the roles' servers bind (and advertise) it
        env[runtime.BIND_HOST_ENV] = os.environ[runtime.BIND_HOST_ENV]
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.WARNING,
                              "runtime_env": {"env_vars": env}, "configure_logging": False}
    if address:
        _attach_ray(address, kwargs)
        _check_cluster_auth(address, allow_unauthenticated)
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        print(f"attached to the Ray cluster at {address}: {len(nodes)} node(s), "
              f"{int(ray.cluster_resources().get('CPU', 0))} CPUs", flush=True)
    else:
        # Ray of our own: the actors' environment is the one its processes start with (its raylet
        # passes it to every worker), not a runtime_env, so that the workers Ray starts ahead are
        # fit for the actors: each actor then starts in a worker already up (about 1 s sooner apiece
        # on 2 cores). The driver's own environment is put back once Ray is up.
        del kwargs["runtime_env"]
        with _environ(env):
            ray.init(num_cpus=max(2, os.cpu_count() or 2), **kwargs)


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``env`` added, restored afterwards."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_local(opts: RunOptions) -> RunResult:
    """Run a manifest locally (see the module docstring)."""
    from rft_api.job import load_manifest

    job = load_manifest(opts.manifest)
    spec = job.spec
    if spec.inference.engine != "builtin":
        raise LocalRunError(f"spec.inference.engine: rft run starts the builtin server only, got "
                            f"{spec.inference.engine!r}; use engine: builtin locally")
    from ..serve.server import ExtraArgsError, engine_settings

    try:  # the engine options rft serve would take from them on a cluster, checked before anything starts
        engine_settings(list(spec.inference.extra_args))
    except ExtraArgsError as exc:
        raise LocalRunError(f"spec.inference.extraArgs: {exc}") from exc
    out = _out_dir(opts, job.name, opts.max_steps or spec.trainer.max_steps)
    started = time.perf_counter()
    from ..model import default_cache_dir
    from ..model.loading import resolve_model_dir

    cache = default_cache_dir()
    paths = local_paths(job, opts.manifest, out, cache)
    _fetch_inputs(spec, paths)
    model_dir = resolve_model_dir(paths)  # build a builtin model once, before the actors
    import ray

    piece_bytes = None
    if opts.address:  # checked before Ray starts
        from .staging import piece_bytes_from_env

        try:
            piece_bytes = piece_bytes_from_env()
        except ValueError as e:
            raise LocalRunError(str(e)) from None
    # A fresh data-plane token per run: the roles' servers require it, their clients send it (as on a
    # cluster, where the operator's Secret <job>-token carries it). It is never written to the output.
    _init_ray(opts.address, secrets.token_urlsafe(32), opts.allow_unauthenticated_ray)
    local = not opts.address
    shipment = None
    if not local:  # a Ray cluster: files travel through the object store, not by path (.staging)
        from .staging import ship

        paths = paths.model_copy(update={"model": str(model_dir)})
        shipment = ship(paths, secrets.token_hex(6), resume_from=out if opts.resume else None, piece_bytes=piece_bytes)
        print(f"inputs in the object store: {shipment.summary()}", flush=True)
    actors: list[Any] = []
    interrupted = False
    steps_done = 0
    try:
        steps_done, interrupted = _run_roles(opts, job, model_dir, paths, out, shipment, actors)
    except ray.exceptions.RayError as e:
        inner = _unwrap(e)
        if inner is e:
            raise LocalRunError(f"a role failed: {e}") from None
        if shipment is not None:  # name the user's files, not a node's copies of them
            from .staging import driver_paths

            raise LocalRunError(driver_paths(shipment, f"{type(inner).__name__}: {inner}")) from None
        raise inner from None
    finally:
        if shipment is not None:
            try:
                _collect_and_clean(actors, out)
            except Exception as e:  # noqa: BLE001 - the teardown below must still run
                log.warning("could not collect the roles' logs: %s", e)
        for a in actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - best effort teardown
                pass
        ray.shutdown()
    rows = read_metrics(out / "metrics.jsonl")
    if rows:
        plot_reward_curve(rows, out / "reward_curve.png", title=f"{job.name} ({spec.trainer.algorithm})")
    seconds = time.perf_counter() - started
    summary = reward_summary(rows)
    (out / "summary.json").write_text(json.dumps({**summary, "seconds": seconds, "interrupted": interrupted}, indent=1))
    print(format_summary(job.name, summary, seconds, out, interrupted), flush=True)
    return RunResult(out, steps_done, interrupted, seconds, summary, EXIT_INTERRUPTED if interrupted else 0)


def inputs_cache() -> Path:
    """Where ``rft run`` fetches hf:// and s3:// models and datasets: ``$RFT_INPUTS_CACHE``, or
    ``inputs/`` next to the model cache (one copy per source, reused by every later run)."""
    env = os.environ.get("RFT_INPUTS_CACHE")
    from ..model import default_cache_dir

    return Path(env) if env else default_cache_dir().parent / "inputs"


def _fetch_inputs(spec: Any, paths: runtime.Paths) -> None:
    """Fetch the job's hf:// and s3:// inputs (as the fetch Job does on a cluster) and validate its
    datasets, before any role starts; a failure names the field and the URI."""
    if not paths.inputs:
        return
    from ..data import DatasetError
    from ..fetching import fetch_all
    from ..storage.errors import StorageError

    try:
        fetch_all(spec, paths.inputs)
    except StorageError as e:
        raise LocalRunError(f"{e} ({e.reason})") from None
    except DatasetError as e:
        raise LocalRunError(str(e)) from None


def local_paths(job: RFTJob, manifest: str, out: Path, model_cache: Path) -> runtime.Paths:
    """The job's paths on this machine: checkpoints and metrics under ``out``, every spec path resolved
    as in a pod (:mod:`rft_api.layout`), and each ``configMapKeyRef`` (datasets, evaluator files)
    taken from a ConfigMap in the manifest file and written where a pod would have it mounted."""
    spec = job.spec
    mounts = out / "mounts"
    dataset_dir, evaluator_dir = mounts / "datasets", mounts / "evaluator"
    configmaps = _manifest_configmaps(manifest)

    def place(field: str, ref: Any, dest: Path) -> None:
        data = configmaps.get(ref.name)
        if data is None:
            raise LocalRunError(f"{field}.configMapKeyRef: ConfigMap {ref.name!r} is not in {manifest} (rft run "
                                "reads ConfigMaps from the manifest file)")
        if ref.key not in data:
            raise LocalRunError(f"{field}.configMapKeyRef: ConfigMap {ref.name!r} has no key {ref.key!r}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(data[ref.key])

    for where, mount, src, _ in spec.dataset.sources():
        if src.config_map_key_ref is not None:
            place(where, src.config_map_key_ref, dataset_dir / mount / src.config_map_key_ref.key)
    for i, e in enumerate(spec.evaluator.entries()):
        ref = e.file_ref()
        if ref is not None:
            kind = "file" if e.file is not None else "evalProtocol"
            place(f"spec.evaluator (evaluator {i}).{kind}", ref, evaluator_dir / str(i) / ref.key)
    return runtime.spec_paths(spec, checkpoints=str(out / "checkpoints"), model_cache=str(model_cache),
                              inputs_root=str(inputs_cache()), claims_root=os.environ.get("RFT_CLAIMS_DIR", layout.CLAIMS_DIR),
                              output=str(out), dataset_dir=str(dataset_dir), evaluator_dir=str(evaluator_dir))


def _manifest_configmaps(manifest: str) -> dict[str, dict[str, str]]:
    import yaml

    with open(manifest) as f:
        docs = [d for d in yaml.safe_load_all(f) if isinstance(d, dict)]
    return {d.get("metadata", {}).get("name", ""): dict(d.get("data") or {}) for d in docs if d.get("kind") == "ConfigMap"}


def literal_env(entries: list[Any]) -> dict[str, str]:
    """A role's ``env`` entries that carry a literal ``value``, for ``rft run`` to set in that role's
    processes. ``rft run`` has no Secrets: an entry by ``valueFrom.secretKeyRef`` is left to the environment
    it was started in (a variable of that name set there reaches every role, as any variable does)."""
    return {e.name: e.value for e in entries if e.value is not None}


def _free_port() -> int:
    """A free loopback port (the trainer's rendezvous when it has several processes)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cluster_resources(spec: Any, role: str, threads: int) -> dict[str, float]:
    """What a role's actor asks a Ray cluster for: ``threads`` CPUs per process, and the GPUs of its
    pod spec (``resources`` ``nvidia.com/gpu``; the trainer's for each of its ``nodes``, whose
    processes all run on the actor's node)."""
    from rft_api.spec import gpu_count

    if role == "trainer":
        t = spec.trainer
        return {"num_cpus": threads * t.world_size(), "num_gpus": t.nodes * gpu_count(t.resources)}
    if role == "inference":
        return {"num_cpus": threads, "num_gpus": gpu_count(spec.inference.resources)}
    return {"num_cpus": threads, "num_gpus": 0}


def _collect_and_clean(actors: list[Any], out: Path, timeout_s: float = 30.0) -> None:
    """On a Ray cluster: copy every actor's logs into ``<out>/logs`` (those that still answer), then
    have each remove the run's directory on its node."""
    import ray

    from .staging import write_logs

    refs = {a.logs.remote(): a for a in actors}
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    for ref in ready:
        try:
            write_logs(out, ray.get(ref))
        except ray.exceptions.RayError as e:
            log.warning("could not copy an actor's logs: %s", e)
    ray.wait([a.cleanup.remote() for a in actors], num_returns=len(actors), timeout=timeout_s)


def _run_roles(opts: RunOptions, job: RFTJob, model_dir: Path, paths: runtime.Paths, out: Path, shipment: Any,
               actors: list[Any]) -> tuple[int, bool]:
    """Start the role actors, drive the trainer, and shut the roles down; returns (steps, interrupted).
    ``shipment``: the run's files in the object store (a Ray cluster), None on one machine. On one
    machine the roles are kept to the cores this run claims (cores.py) while it trains."""
    pinned = shipment is None and opts.pin_cores
    plan = claimed_role_cores(available_cores(), max_staleness=job.spec.rollout.max_staleness,
                              trainer_processes=job.spec.trainer.world_size(), threads=opts.threads) \
        if pinned else contextlib.nullcontext()
    with plan as cores:
        return _start_and_drive(opts, job, model_dir, paths, out, shipment, actors, cores)


def _start_and_drive(opts: RunOptions, job: RFTJob, model_dir: Path, paths: runtime.Paths, out: Path, shipment: Any,
                     actors: list[Any], cores: dict[str, tuple[int, ...]] | None) -> tuple[int, bool]:
    import ray

    spec = job.spec
    from .actors import InferenceActor, RolloutActor, TrainerActor, node_host
    from .staging import OutputSync

    local = shipment is None

    def placed(cls: Any, role: str) -> Any:
        return cls if local else cls.options(**cluster_resources(spec, role, opts.threads))

    logs = out / "logs"
    if cores:
        log.info("cores: trainer %s, inference and rollout %s", ",".join(map(str, cores["trainer"])),
                 ",".join(map(str, cores["inference"])))
    cpus = cores or {}
    # Every role's process starts now, in parallel. The inference servers bind their sockets first and
    # load the model while the trainer builds itself up to its coordinator and the rollout workers
    # start; the trainer publishes its weights once the servers answer.
    from ..serve.server import engine_settings

    infer = [placed(InferenceActor, "inference").remote(
                 str(model_dir), job.name, local=local, threads=opts.threads, dtype=spec.model.dtype,
                 max_model_len=spec.inference.max_model_len, log_file=str(logs / f"inference-{i}.log"),
                 shipment=shipment, role=f"inference-{i}", engine_process=opts.engine_process,
                 cpus=cpus.get("inference"), settings=engine_settings(list(spec.inference.extra_args)),
                 env=literal_env(spec.inference.env))
             for i in range(max(1, spec.inference.replicas))]
    actors += infer
    trainer = placed(TrainerActor, "trainer").remote(threads=opts.threads, local=local,
                                                     log_file=str(logs / "trainer.log"), shipment=shipment,
                                                     cpus=cpus.get("trainer"), env=literal_env(spec.trainer.env))
    actors.append(trainer)
    rollouts = [placed(RolloutActor, "rollout").remote(f"local-rollout-{i}", threads=opts.threads,
                                                       log_file=str(logs / f"rollout-{i}.log"), shipment=shipment,
                                                       cpus=cpus.get("rollout"))
                for i in range(max(1, spec.rollout.replicas))]
    actors += rollouts
    sync = None if local else OutputSync(out)
    urls = ray.get([a.url.remote() for a in infer])  # each socket is bound: its URL is final
    serving = [a.start.remote() for a in infer]
    host = node_host(local)
    cfg = runtime.build(
        job, endpoints=runtime.Endpoints(inference=urls, served_model_name=job.name,
                                         coordinator=f"http://{host}:0"),
        ports=runtime.Ports(coordinator=0, rendezvous=_free_port() if spec.trainer.world_size() > 1 else 29500),
        paths=paths, scoring="rollout",
        progress=runtime.ProgressTarget(sink="file"),
        trainer=runtime.TrainerSettings(threads=opts.threads, weight_transfer="path" if local else "http"))
    info = ray.get(trainer.prepare.remote(cfg.to_json(), resume=opts.resume, require_resume=opts.resume,
                                          max_steps=opts.max_steps, work_dir=str(out)))
    cfg = cfg.model_copy(update={"endpoints": cfg.endpoints.model_copy(
        update={"coordinator": info["coordinator_url"]})})
    doc = cfg.to_json()
    (out / "config.json").write_text(doc)
    runs = [r.run.remote(doc) for r in rollouts]  # they connect to the coordinator and wait for work
    ray.get(serving)
    ray.get(trainer.publish_initial.remote())
    steps_done, interrupted = _drive(trainer, info, opts, runs, after_step=(lambda: sync.pull(trainer)) if sync else None)
    if interrupted:
        steps_done = ray.get(trainer.stop.remote())
    else:
        ray.get(trainer.finish.remote())
    if sync is not None:  # the last checkpoint (or the stop's), the final model, the last metrics
        sync.pull(trainer)
    # Rollout workers stop while the coordinator still answers (they see "done" or the stop flag);
    # one that does not stop in time is killed with the other actors.
    for r in rollouts:
        r.stop.remote()
    ray.wait(runs, num_returns=len(runs), timeout=30)
    ray.get(trainer.close.remote())
    return steps_done, interrupted


def _drive(trainer: Any, info: dict[str, Any], opts: RunOptions, runs: list[Any],
           after_step: Any = None) -> tuple[int, bool]:
    """Step the trainer to the end (or a Ctrl-C); returns (last step, interrupted). ``after_step``:
    called after every step (on a cluster: copy the trainer's new outputs into ``--out``)."""
    import ray
    from tqdm import tqdm

    step, total = int(info["step"]), int(info["max_steps"])
    bar = tqdm(total=total, initial=step, desc="rft run", unit="step", disable=not opts.progress_bar,
               dynamic_ncols=True)
    with _Interrupts() as intr:
        intr.on_first = lambda: trainer.request_stop.remote()
        try:
            while step < total and not intr.requested:
                ref = trainer.step.remote()
                while True:
                    ready, _ = ray.wait([ref] + runs, num_returns=1, timeout=1.0)
                    if ref in ready:
                        break
                    for r in ready:  # a rollout worker ended early: surface its error
                        ray.get(r)
                        raise LocalRunError("a rollout worker stopped before training finished")
                row = ray.get(ref)
                if row is None:
                    break
                step = int(row["step"])
                if after_step is not None:
                    after_step()
                bar.update(1)
                bar.set_postfix(reward=f"{row.get('reward_mean', float('nan')):.3f}",
                                tok_s=f"{row.get('tokens_per_s', 0.0):.0f}")
                if step < total and ray.get(trainer.finished.remote()):  # evaluation.stopWhen
                    break
        finally:
            bar.close()
        return step, intr.requested and step < total
