"""The trainer role: coordinator + learner + weight publication + checkpoints + progress.

One :meth:`Trainer.step`::

    collect groups (coordinator; DAPO dynamic sampling rounds)      time/generate (reward inside)
    → batch → old log-probs (recompute, or the inference ones)      time/old_logprob
    → reference log-probs (kl.coef > 0)                             time/ref_logprob
    → rewards (overlong, KL-in-reward) → advantages (registry)
    → TIS weights (importanceSampling) → update (epochs × micro-batches, AdamW, clip, schedule)
                                                                    time/update
    → save weights v<version+1>, inference loads them, verified     time/weight_sync
      (maxStaleness > 0: in a thread while the next step trains;     time/publish_background)
    → checkpoint every K steps and at the end (atomic)              time/checkpoint
    → progress record → metrics (jsonl, TensorBoard, Prometheus)

Ranks: the trainer is one torch.distributed process group of ``trainer.nodes × processesPerNode``
processes (:mod:`.distributed`; 1 included). Every rank holds a :class:`Worker` — its shard of the
FSDP2 policy (and reference), the optimiser state of that shard — and trains its rows of each
step's batch. Rank 0 alone is the :class:`Trainer`: it runs the coordinator, collects the step's
episodes, tells the other ranks what to do (:func:`follow`: train on these sequences, gather the
weights, write or read a checkpoint, exit; ``broadcast_object_list``), publishes the gathered
weights, reports progress and writes metrics.

Versions: the initial weights are policy version 0 (or the checkpoint's on resume); after step
``s`` the served version is ``s``. Under bounded staleness (``rollout.maxStaleness`` S > 0) the
publication of version ``s`` runs in a thread while step ``s + 1`` trains (:meth:`Trainer._publish`);
the tasks submitted meanwhile wait for it (``min_version``), so no episode is more than S versions
older than the policy that trains on it, as with an inline publication.

Data order: tasks come from a seeded, resumable cursor; each submitted task gets a sampling seed
derived from the job seed and its submission number, so a resumed run sees the same tasks with the
same seeds as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import random
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

import numpy as np
import torch

from rft_api.layout import published_weights_dir
from rft_api.progress import FinalModel, Progress, ProgressCheckpoint, ProgressErrors, reward_curve
from rft_api.runtime import BIND_HOST_ENV, RuntimeConfig

from ..algos import DynamicSampler, tis_weights
from ..coordinator import Coordinator, CoordinatorConfig, CoordinatorService, EpisodeLimits, Group
from ..coordinator.server import CoordinatorServer
from ..data import DataCursor, DomainMixCursor, Task
from ..metrics_sink import MetricsSink, read_metrics
from ..model.loading import load_tokenizer, resolve_model_dir
from ..progress import ConfigMapProgressSink, FileProgressSink, clip_message, finite, now_rfc3339
from ..rewards.config import evaluator_names
from ..types import Episode
from . import distributed
from .batch import TrainSequence, collate, sequences_from_groups
from .checkpoint import CheckpointManager
from .compiled import wants_compile
from .datasets import load_eval_tasks, load_training_tasks
from .distributed import DistContext
from .inference_sync import InferenceSync
from .learner import Learner, Shard, build_optimizer, build_scheduler, forward_is_deterministic, learner_config
from .model_io import Reference, compute_dtype, load_policy
from .publisher import FINAL_DIR, BackgroundPublication, WeightPublisher, detached_state, export_final_model
from .reload import reload_protocol
from .replicas import InferenceReplicas
from .reward_shaping import RewardShaper
from .signals import (
    advantage_metrics,
    advantages,
    length_metrics,
    reward_metrics,
    shaped_rewards,
    staleness_metrics,
)
from .state import ResumeError, TrainerState, check_checkpoint, load_checkpoint, write_checkpoint
from .tracking import Tracker, start_trackers

log = logging.getLogger(__name__)

SEED_MOD = 2**31 - 1
ERROR_KINDS = ("timeout", "runtime_error", "parse_error")
# When the trainer stops its coordinator: workers that leased or posted within this many seconds are
# told "done" first, waiting at most TELL_DONE_TIMEOUT_S for them to ask (a worker with room for work
# holds a long-polled lease, answered as soon as the run is done; else it asks when a rollout ends).
WORKER_SEEN_WITHIN_S = 30.0
TELL_DONE_TIMEOUT_S = 5.0
# Where a step's weight publication runs under bounded staleness: "background" (the default: the next
# step trains meanwhile) or "inline" (the step waits for it, as a synchronous run always does).
PUBLISH_ENV = "RFT_PUBLISH"
PUBLISH_CHOICES = ("background", "inline")


def task_seed(job_seed: int, seq: int) -> int:
    """The sampling seed of submission ``seq`` (sample ``i`` uses ``seed + i``)."""
    return (job_seed * 1_000_003 + seq * 7_919 + 17) % SEED_MOD


def sampling_params(spec: Any, temperature: float | None = None) -> dict[str, Any]:
    """Sampling fields handed to rollout workers with each lease (vLLM names)."""
    r = spec.rollout
    out: dict[str, Any] = {"max_tokens": r.max_tokens, "temperature": temperature or r.temperature}
    if r.top_p < 1.0:
        out["top_p"] = r.top_p
    if r.top_k != -1:
        out["top_k"] = r.top_k
    return out


def group_rewards(g: Group) -> list[float | None]:
    """The rewards of a group's episodes (for dynamic sampling)."""
    return [e.reward for e in g.episodes]


def mismatch_metrics(old: torch.Tensor, inference: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far the trainer's recomputed log-probs are from the inference engine's (token contract
    check): mean and max absolute difference, and the k3 estimate of KL(π_inf ‖ π_old)."""
    if not bool(mask.any()):
        return {}
    d = (old - inference)[mask].double()
    k3 = (torch.exp(d) - 1 - d).mean()
    return {"logprob_diff_abs_mean": float(d.abs().mean()), "logprob_diff_abs_max": float(d.abs().max()),
            "mismatch_kl_k3": float(k3)}


def episode_error_kinds(ep: Episode) -> list[str]:
    """The reward error flags set on an episode (timeout, runtime_error, parse_error)."""
    return [k for k in ERROR_KINDS if getattr(ep.errors, k)]


def overlap_metrics(times: dict[str, float], idle_generate: float) -> dict[str, float]:
    """How much of a step's generation, training and publication ran at the same time.

    ``t_R`` is the time the rollout workers had work during the step (the step's wall time less
    ``idle_generate``, the seconds the coordinator had no task queued or leased), ``t_T`` the
    training phases (old and reference log-probs, the update) and ``t_W`` the weight publication (the
    part of it the step waited for: gathering and copying the weights, when it runs in the background).
    ``overlap/bound`` is the speed-up that overlapping generation with training can give when a
    publication stops both, ``(t_R + t_T + t_W) / (max(t_R, t_T) + t_W)``; ``overlap/achieved`` the
    one this step got, ``(t_R + t_T + t_W) / time/step`` (about 1 for a synchronous step). Rollouts
    that go on generating during a publication can take ``achieved`` above ``bound``."""
    step = times.get("time/step", 0.0)
    t_t = sum(times.get(k, 0.0) for k in ("time/old_logprob", "time/ref_logprob", "time/update"))
    t_w = times.get("time/weight_sync", 0.0)
    t_r = max(step - idle_generate, 0.0)
    return {"time/train": t_t, "time/publish": t_w, "time/idle_train": times.get("time/generate", 0.0),
            "time/idle_generate": idle_generate, "time/rollout_busy": t_r,
            "overlap/bound": (t_r + t_t + t_w) / max(max(t_r, t_t) + t_w, 1e-9),
            "overlap/achieved": (t_r + t_t + t_w) / max(step, 1e-9)}


class _Phases:
    """Wall-clock seconds per named phase: ``with phases("time/update"): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0


class StopRequested(Exception):
    """The trainer was asked to stop while collecting a step (the step is not counted)."""


@dataclasses.dataclass
class StepResult:
    """What a step's training computed (the same on every rank)."""

    old: torch.Tensor
    ref: torch.Tensor | None
    adv: Any
    tis: torch.Tensor | None
    metrics: dict[str, Any]
    update: dict[str, float]


class Worker:
    """One rank's part of the trainer: tokenizer, the policy (FSDP2-sharded over the process group,
    LoRA-wrapped when configured), the reference, optimiser and scheduler; a step's learning signals
    and update on its rows; checkpoints of its shards. Every method that touches the model is
    collective: all ranks call it together (rank 0 first tells the others, see :func:`follow`)."""

    def __init__(self, cfg: RuntimeConfig, dist: DistContext) -> None:
        self.cfg, self.spec, self.alg, self.dist = cfg, cfg.spec, cfg.algorithm, dist

    def load(self) -> "Worker":
        spec, paths = self.spec, self.cfg.paths
        if self.cfg.trainer.threads:
            torch.set_num_threads(self.cfg.trainer.threads)
        random.seed(spec.trainer.seed)
        np.random.seed(spec.trainer.seed % (2**32))
        torch.manual_seed(spec.trainer.seed)
        distributed.ensure_group(self.dist)
        self.model_dir = resolve_model_dir(paths)
        self.tokenizer = load_tokenizer(self.model_dir, paths.tokenizer, spec.model.chat_template)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        model = load_policy(spec.model, self.model_dir, spec.trainer.seed, paths.warm_start)
        compile_layers = wants_compile(spec.trainer.compile or "auto", self.dist.device)
        self.model = distributed.shard(model, self.dist, compute_dtype(spec.model.dtype, self.dist.device),
                                       compile_layers)
        self.reference = (Reference(self.model, spec.model, self.model_dir, paths.warm_start, self.dist,
                                    compile_layers) if self.alg.kl_coef > 0 else None)
        params = [p for p in self.model.parameters() if p.requires_grad]
        opt = build_optimizer(params, spec.trainer.learning_rate, spec.trainer.weight_decay)
        sched = build_scheduler(opt, spec.trainer.scheduler.kind, spec.trainer.scheduler.warmup_steps,
                                spec.trainer.max_steps)
        self.shard = Shard(self.dist.rank, self.dist.world_size)
        self.learner = Learner(self.model, learner_config(self.alg, spec), opt, sched, shard=self.shard)
        return self

    def train(self, seqs: list[TrainSequence], step_no: int, times: "_Phases | None" = None) -> StepResult:
        """A step's learning signals and update on this rank's rows of ``seqs``."""
        times = times or _Phases()
        batch = collate(seqs, self.pad_id)
        old, ref, adv, tis, metrics = self._learning_signals(seqs, batch, times)
        with times("time/update"):
            upd = self.learner.update(batch, adv.advantages, adv.valid, old, ref_logprobs=ref, tis_weights=tis)
        if old is None:  # recomputed by the update's own forward
            old = self.learner.update_logprobs
            assert old is not None
            metrics.update(mismatch_metrics(old, batch.inference_logprobs, batch.loss_mask))
        return StepResult(old, ref, adv, tis, metrics, upd)

    @functools.cached_property
    def old_from_update(self) -> bool:
        """Whether the recomputed old log-probs come from the update's own forward rather than a pass of
        their own before it. They are the same numbers where the update makes one pass
        (``epochsPerStep`` 1: the parameters change only after its last micro-batch), nothing needs them
        before it (KL in the reward, TIS) and the training forward has no dropout; the pass they save
        is a no-gradient forward of the whole batch, a fifth of a step of the sample job on the CPU.
        TRL takes its old log-probs the same way when it makes one iteration a batch. Decided once: the
        model and the algorithm's settings do not change during a run."""
        a = self.alg
        return (a.old_logprobs == "recompute" and self.learner.cfg.epochs == 1 and not a.importance_sampling
                and not (a.kl_coef > 0 and a.kl_placement == "reward") and forward_is_deterministic(self.model))

    def _learning_signals(self, seqs: list[TrainSequence], batch: Any, times: "_Phases") -> tuple[Any, ...]:
        """(old log-probs (None: from the update's forward, :attr:`old_from_update`), reference log-probs
        or None, advantages, TIS weights or None, metrics)."""
        lcfg = self.learner.cfg
        metrics: dict[str, Any] = {}
        old: torch.Tensor | None
        with times("time/old_logprob"):
            if self.alg.old_logprobs == "recompute" and self.old_from_update:
                old = None  # from the update's forward (:meth:`train`)
            elif self.alg.old_logprobs == "recompute":
                old = self.learner.logprobs(batch)
                metrics.update(mismatch_metrics(old, batch.inference_logprobs, batch.loss_mask))
            else:
                old = batch.inference_logprobs.clone()
        ref = None
        if self.reference is not None:
            with times("time/ref_logprob"):
                ref = self.reference.logprobs(batch, lcfg.temperature, lcfg.micro_batch_size, self.shard)
        rewards = shaped_rewards(seqs, self.alg, self.spec.rollout.max_tokens, batch=batch,
                                 old_logprobs=old, ref_logprobs=ref)
        adv = advantages(seqs, rewards, self.alg)
        tis = None
        if self.alg.importance_sampling and self.alg.old_logprobs == "recompute":
            isc = self.alg.importance_sampling
            assert old is not None  # old_from_update is False where TIS needs them
            out = tis_weights(old, batch.inference_logprobs, batch.loss_mask, level=isc["level"],
                              mode=isc["mode"], cap=float(isc["cap"]))
            tis = out.weights
            metrics.update({f"tis/{k}": float(v) for k, v in out.metrics.items()})
        return old, ref, adv, tis, metrics

    def gather(self) -> dict[str, torch.Tensor]:
        """The whole policy's state dict on rank 0 (CPU; empty elsewhere), for publishing."""
        return distributed.full_state_dict(self.model)

    def save(self, directory: str, state: TrainerState | None) -> None:
        """Write this rank's part of a checkpoint into ``directory`` (rank 0: with ``state``)."""
        write_checkpoint(Path(directory), state, self.model, self.learner.optimizer, self.learner.scheduler)

    def restore(self, directory: str) -> None:
        """Load the model and optimiser shards (resharded to this world size), scheduler and RNG."""
        load_checkpoint(Path(directory), self.model, self.learner.optimizer, self.learner.scheduler)


_COMMANDS = ("train", "gather", "save", "restore", "exit")


def follow(cfg: RuntimeConfig, dist: DistContext) -> None:
    """A rank other than 0: load its :class:`Worker`, then do what rank 0 says until it says exit
    (rank 0 gone: the collective fails and so does this process)."""
    worker = Worker(cfg, dist).load()
    while True:
        name, args = distributed.broadcast()
        if name not in _COMMANDS:
            raise RuntimeError(f"trainer rank {dist.rank}: unknown command {name!r} from rank 0")
        if name == "exit":
            distributed.leave_group()
            return
        getattr(worker, name)(*args)


class Trainer:
    """The trainer role. Use :meth:`setup`, then :meth:`step` until :attr:`finished`, then
    :meth:`finish` (final checkpoint, ``done``) and :meth:`close`."""

    def __init__(self, cfg: RuntimeConfig, *, resume: bool = True, max_steps: int | None = None,
                 should_stop: Callable[[], bool] = lambda: False, require_resume: bool = False,
                 attempt: int | None = None, dist: DistContext | None = None) -> None:
        if dist is None and cfg.spec.trainer.world_size() > 1:
            raise ValueError(f"a trainer of {cfg.spec.trainer.world_size()} processes (trainer.nodes x "
                             "processesPerNode) needs its DistContext: rft trainer and rft run start its ranks")
        self.dist = dist or DistContext()
        if not self.dist.is_main:
            raise ValueError(f"the Trainer is rank 0; rank {self.dist.rank} follows it (trainer.follow)")
        self.cfg = cfg
        self.spec = cfg.spec
        self.alg = cfg.algorithm
        self.resume = resume
        self.require_resume = require_resume
        self.max_steps = int(max_steps if max_steps is not None else self.spec.trainer.max_steps)
        if self.max_steps < 1:
            raise ValueError(f"max steps must be >= 1, got {self.max_steps}")
        self.should_stop = should_stop
        self.attempt = int(attempt if attempt is not None else os.environ.get("RFT_TRAINER_ATTEMPT", 0) or 0)
        self.step_count = 0
        self.policy_version = 0  # the trainer's weights
        self.served_version = 0  # the newest version inference serves (one behind while publishing)
        self._publication = BackgroundPublication()
        self._publication_s: float | None = None  # how long the publication this step waited for ran
        self.eval_score: float | None = None
        self.eval_domain_scores: dict[str, float] = {}
        self.counters: dict[str, float] = {}
        self._coord_base = {"dropped": 0, "reissued": 0, "refused": 0}  # coordinator counters of earlier attempts
        self._pending: list[dict[str, Any]] = []
        # Bounded staleness S: the tasks of up to S later steps, submitted ahead (oldest first), so the
        # rollouts of steps t+1..t+S run while step t trains.
        self._prefetched: deque[list[str]] = deque()
        self._prefetched_tasks: deque[list[dict[str, Any]]] = deque()
        self.history: list[dict[str, Any]] = []
        self.resumed_from: int | None = None
        self._server: CoordinatorServer | None = None
        self._inference_sync: InferenceSync | None = None
        self.trackers: list[Tracker] = []
        self._tracker_status = "FAILED"

    # ---------------------------------------------------------------- setup
    def setup(self) -> "Trainer":
        """Load everything, restore the latest checkpoint when resuming, start the coordinator,
        and make inference serve the current weights: :meth:`prepare`, then :meth:`publish_initial`."""
        return self.prepare().publish_initial()

    def prepare(self) -> "Trainer":
        """Everything :meth:`setup` does before it talks to inference: the policy, the data, the
        checkpoint it resumes from, metrics, trackers and the coordinator (rollout workers can connect
        from here on; they get work once steps run). ``rft run`` calls it while the inference servers
        are still loading their models."""
        cfg, spec = self.cfg, self.spec
        self._load_learner()
        self._load_data()
        self.checkpoints = CheckpointManager(Path(cfg.paths.checkpoints), spec.checkpoint.keep_last,
                                             attempt=self.attempt)
        self.progress_sink = self._progress_sink()
        next_seq = self._restore() if self.resume else 0
        self.metrics = MetricsSink(cfg.paths.metrics_dir, purge_step=(self.step_count + 1) if self.resumed_from else None)
        self.metrics.truncate_after(self.step_count)
        # the whole job's per-step rows (earlier attempts' too) for the progress record's reward curve
        self._curve_rows = read_metrics(self.metrics.jsonl_path) if self.metrics.jsonl_path is not None else []
        self.trackers = self._start_trackers()
        self._start_coordinator(next_seq)
        return self

    def publish_initial(self) -> "Trainer":
        """Make every inference replica serve the current weights (the base model's, or the checkpoint's
        when resuming; a replica that does not answer yet is retried as every publication is) and keep a
        restarted one on them; after :meth:`prepare`."""
        cfg, spec = self.cfg, self.spec
        inf = spec.inference
        replicas = InferenceReplicas(cfg.endpoints.inference, cfg.endpoints.inference_replicas)
        self.publisher = WeightPublisher(published_weights_dir(cfg.paths.checkpoints), replicas,
                                         keep=spec.rollout.policy_versions_served(),
                                         protocol=reload_protocol(inf.engine, inf.weight_sync, cfg.endpoints.served_model_name,
                                                                   cfg.trainer.weight_transfer or "path"))
        if spec.inference.weight_sync != "none":
            self.publisher.publish(self.model, self.policy_version, self.tokenizer, state_dict=self._gather())
            # a restarted inference server comes back with the base weights: bring it to the current ones
            self._inference_sync = InferenceSync(self.publisher, lambda: self.served_version).start()
        self.served_version = self.policy_version
        _ = self.publishes_in_background  # a bad $RFT_PUBLISH is refused now, not after the first step
        self._report(message=f"resumed from step {self.resumed_from}" if self.resumed_from is not None else "started")
        return self

    def _start_trackers(self) -> list[Tracker]:
        """The experiment trackers of ``spec.tracking`` (MLflow, W&B offline), started."""
        job = self.cfg.job
        return start_trackers(self.spec.tracking, job.name, job.namespace, Path(self.cfg.paths.checkpoints) / "tracking",
                              self.spec.model_dump(by_alias=True, mode="json", exclude_none=True),
                              {"rft.job": job.name, "rft.namespace": job.namespace,
                               "rft.algorithm": self.cfg.algorithm.name})

    def _load_learner(self) -> None:
        """This rank's :class:`Worker`: tokenizer, sharded policy, reference, optimiser, scheduler."""
        self.worker: Worker | None = Worker(self.cfg, self.dist).load()
        w = self.worker
        self.model_dir, self.tokenizer, self.pad_id = w.model_dir, w.tokenizer, w.pad_id
        self.model, self.reference, self.learner = w.model, w.reference, w.learner
        self.evaluator_names = evaluator_names(self.spec.evaluator)

    def _command(self, name: str, *args: Any) -> None:
        """Tell the other ranks to run ``Worker.<name>(*args)`` (rank 0 then runs its own part)."""
        assert name in _COMMANDS
        if self.dist.world_size > 1:
            distributed.broadcast((name, args))

    def _gather(self) -> dict[str, torch.Tensor]:
        self._command("gather")
        assert self.worker is not None
        return self.worker.gather()

    def _load_data(self) -> None:
        """Training tasks behind a seeded cursor; the evaluation tasks when evaluation is on."""
        spec, files = self.spec, self.cfg.paths.datasets
        self.tasks = load_training_tasks(spec.dataset, files)
        self.shape_rewards = RewardShaper(spec.dataset.mix)
        self.cursor: DataCursor | DomainMixCursor
        if spec.dataset.mix:
            self.cursor = DomainMixCursor(self.tasks, [(m.domain, m.weight) for m in spec.dataset.mix],
                                          seed=spec.dataset.order_seed(), shuffle=spec.dataset.shuffle)
            log.info("domain mix per step of %d prompts: %s", spec.rollout.prompts_per_step,
                     ", ".join(f"{d} {n}" for d, n in self.cursor.counts(spec.rollout.prompts_per_step).items()))
        else:
            self.cursor = DataCursor(self.tasks, seed=spec.dataset.order_seed(), shuffle=spec.dataset.shuffle)
        self.eval_tasks: list[Task] = []
        ev = spec.evaluation
        if ev is not None and ev.every_steps > 0 and spec.dataset.eval is not None:
            self.eval_tasks = load_eval_tasks(spec.dataset, files)[: ev.max_tasks]

    def _restore(self) -> int:
        """Restore the latest checkpoint (if any); returns the next submission number."""
        latest = self.checkpoints.latest()
        if latest is None:
            if self.require_resume:
                raise ResumeError(f"--resume: no checkpoint under {self.cfg.paths.checkpoints}")
            return 0
        state = check_checkpoint(latest.path, expect_run=self._run_identity())
        self._command("restore", str(latest.path))
        assert self.worker is not None
        self.worker.restore(str(latest.path))
        if state.step != latest.step:
            raise ResumeError(f"{latest.path}: {latest.path.name} holds step {state.step}; the step counter "
                              "would go backwards")
        self.cursor.load_state_dict(state.cursor)
        self.step_count, self.policy_version = state.step, state.policy_version
        self._pending = list(state.pending_tasks)
        self.counters = dict(state.counters)
        self.eval_score = state.eval_score
        self.shape_rewards.load_state_dict(state.reward_moments)
        self.resumed_from = state.step
        previous = self.progress_sink.read()
        if previous is not None:  # counters are cumulative over the job, across restarts
            self._merge_previous_counters(previous)
        log.info("resumed from %s (step %d, policy version %d)", latest.path, state.step, state.policy_version)
        if self.finished:  # killed after its final checkpoint: training is complete, finish() reports it
            log.info("the checkpoint at step %d completes the run's %d steps", state.step, self.max_steps)
        return state.next_seq

    def episode_limits(self) -> EpisodeLimits:
        """What a posted episode may contain: token ids inside the policy's vocabulary (its embedding
        table), the first prompt within ``rollout.maxPromptTokens``, every step within the context
        (``inference.maxModelLen``, else the model's ``max_position_embeddings``)."""
        vocab = self.model.get_input_embeddings().num_embeddings  # type: ignore[operator]
        context = self.spec.inference.max_model_len or getattr(self.model.config, "max_position_embeddings", None)
        return EpisodeLimits(vocab_size=int(vocab), max_prompt_tokens=self.spec.rollout.max_prompt_tokens,
                             max_model_len=int(context) if context else None)

    def _start_coordinator(self, next_seq: int) -> None:
        spec, cfg = self.spec, self.cfg
        self.limits = self.episode_limits()
        coord = Coordinator(
            CoordinatorConfig(n=spec.rollout.samples_per_prompt, lease_timeout_s=spec.rollout.lease_timeout_seconds,
                              max_staleness=spec.rollout.max_staleness, sampling=sampling_params(spec),
                              limits=self.limits),
            policy_version=self.policy_version, seq_start=next_seq)
        self.coordinator = CoordinatorService(coord)
        self._server = CoordinatorServer(self.coordinator, os.environ.get(BIND_HOST_ENV) or "0.0.0.0",
                                         cfg.ports.coordinator, metrics_registry=self.metrics.registry,
                                         advertise_host=urlsplit(cfg.endpoints.coordinator).hostname).start()

    @property
    def coordinator_url(self) -> str:
        """Where rollout workers reach this trainer's coordinator."""
        assert self._server is not None
        return self._server.url

    @property
    def finished(self) -> bool:
        return self.step_count >= self.max_steps

    def _run_identity(self) -> dict[str, Any]:
        """What a checkpoint must share with the run resuming it (a mismatch is a terminal
        ``ResumeError``): the algorithm, LoRA, the model, and the training tasks' content (a dataset
        edited under a running job would silently misplace the data cursor)."""
        return {"algorithm": self.alg.name, "lora": self.spec.model.lora is not None, "model": self.spec.model.base,
                "dataset": self._dataset_fingerprint()}

    def _dataset_fingerprint(self) -> str:
        if not hasattr(self, "_dataset_fp"):
            blob = json.dumps([dataclasses.asdict(t) for t in self.tasks], sort_keys=True, default=str)
            self._dataset_fp = hashlib.sha256(blob.encode()).hexdigest()[:16]
        return self._dataset_fp

    def _progress_sink(self) -> Any:
        target = self.cfg.progress
        if target.sink == "configmap":
            return ConfigMapProgressSink(target.config_map or f"{self.cfg.job.name}-progress", self.cfg.job.namespace)
        return FileProgressSink(self.cfg.paths.metrics_dir)

    def _merge_previous_counters(self, previous: Progress) -> None:
        e = previous.errors
        for key, val in (("samples_scored", previous.samples_scored), ("errors/timeout", e.timeouts),
                         ("errors/runtime_error", e.runtime_errors), ("errors/parse_error", e.parse_errors)):
            self.counters[key] = max(self.counters.get(key, 0), val)
        self._coord_base = {"dropped": e.dropped_episodes, "reissued": e.reissued_leases,
                            "refused": e.refused_episodes}

    # ---------------------------------------------------------------- tasks
    def _next_tasks(self, k: int) -> list[dict[str, Any]]:
        out = self._pending[:k]
        self._pending = self._pending[k:]
        if len(out) < k:
            out += [t.to_dict() for t in self.cursor.next_batch(k - len(out))]
        return out

    def _submit(self, tasks: list[dict[str, Any]], **kw: Any) -> list[str]:
        """Queue ``tasks``, sampled from the trainer's current policy or a newer one (while its
        publication runs in the background they wait for it)."""
        seq0 = self.coordinator.next_seq
        seeds = [task_seed(self.spec.trainer.seed, seq0 + i) for i in range(len(tasks))]
        return self.coordinator.submit(tasks, seeds=seeds, min_version=self.policy_version, **kw)

    def _collect(self, keys: list[str]) -> list[Group]:
        groups = self.coordinator.collect(keys, stall_timeout_s=self.cfg.trainer.stall_timeout_seconds,
                                          should_stop=self.should_stop)
        if groups is None:
            raise StopRequested()
        return groups

    def _train_groups(self) -> tuple[list[Group], list[Group], dict[str, float]]:
        """(groups to train on, every group generated this step, dynamic-sampling stats)."""
        target = self.spec.rollout.prompts_per_step
        prefetched: list[str] = []
        if self._prefetched:
            prefetched = self._prefetched.popleft()
            self._prefetched_tasks.popleft()
        if not self.alg.dynamic_sampling:
            keys = prefetched or self._submit(self._next_tasks(target))
            groups = self._collect(keys)
            return groups, groups, {}
        sampler: DynamicSampler[Group] = DynamicSampler(target, self.alg.dynamic_sampling_max_rounds + 1,
                                                        rewards_of=group_rewards)
        everything: list[Group] = []
        while not sampler.done:
            need = sampler.groups_needed()
            keys = prefetched or self._submit(self._next_tasks(need))
            prefetched = []
            groups = self._collect(keys)
            everything += groups
            sampler.add_round(groups)
        res = sampler.result()
        train = res.groups or res.dropped  # nothing with signal: zero advantages, a no-op gradient
        stats = {"ds_rounds": float(res.rounds), "ds_kept_groups": float(len(res.groups)),
                 "ds_dropped_groups": float(len(res.dropped)), "ds_surplus_groups": float(len(res.surplus)),
                 "ds_complete": float(res.complete)}
        return train, everything, stats

    # ---------------------------------------------------------------- one step
    def step(self) -> dict[str, Any]:
        """Run one training step; returns its metrics (also logged). Raises :class:`StopRequested`
        when asked to stop while collecting (nothing is counted then)."""
        if self.finished:
            raise RuntimeError(f"the run has finished ({self.step_count}/{self.max_steps} steps)")
        step_no = self.step_count + 1
        times = _Phases()
        self._publication_s = None
        with times("time/step"):
            idle0 = self.coordinator.idle_seconds()  # within the step's timer: idle never exceeds the step
            with times("time/generate"):
                self._prefetch(step_no - 1)  # the first step submits its own tasks with the next S steps'
                groups, everything, ds = self._train_groups()
            self._prefetch(step_no)  # the rollouts of the next S steps run while this one trains
            seqs = sequences_from_groups(groups, vocab_size=self.limits.vocab_size, max_len=self.limits.max_model_len)
            seqs, shaped = self.shape_rewards(seqs)
            self._command("train", seqs, step_no)
            assert self.worker is not None
            res = self.worker.train(seqs, step_no, times)
            adv, upd, metrics = res.adv, res.update, res.metrics
            with times("time/weight_sync"):
                self._publish(self.policy_version + 1)
            self.step_count = step_no
            if self.eval_tasks and step_no % self.spec.evaluation.every_steps == 0:
                with times("time/eval"):
                    self.eval_score = self.evaluate()
            with times("time/checkpoint"):
                if step_no % self.spec.checkpoint.every_steps == 0 or step_no == self.max_steps:
                    self.save_checkpoint()
            idle_generate = self.coordinator.idle_seconds() - idle0
        metrics.update(self._step_metrics(seqs, sequences_from_groups(everything), everything, adv, upd, ds,
                                          times.seconds))
        metrics.update(overlap_metrics(times.seconds, idle_generate))
        if self._publication_s is not None:
            metrics["time/publish_background"] = self._publication_s
        metrics.update(shaped)
        if self.trackers:
            metrics["tracking_errors"] = sum(t.errors for t in self.trackers)
        row = self.metrics.log(step_no, metrics)
        for tracker in self.trackers:
            tracker.log_metrics(step_no, row)
        self.history.append(row)
        self._curve_rows.append(row)
        self._report()
        return row

    def _prefetch(self, step_no: int) -> None:
        """Bounded staleness S: keep the tasks of the S steps after ``step_no`` (never past the last)
        submitted, so the rollouts run ahead while the trainer trains. Their episodes are at most S
        versions old when their step takes them (the coordinator drops a group that became staler and
        samples it again)."""
        depth = min(self.spec.rollout.max_staleness, self.max_steps - step_no)
        while len(self._prefetched) < depth:
            tasks = self._next_tasks(self.spec.rollout.prompts_per_step)
            self._prefetched_tasks.append(tasks)
            self._prefetched.append(self._submit(tasks))

    @functools.cached_property
    def publishes_in_background(self) -> bool:
        """Whether a step's publication runs in a thread while the next step trains: under bounded
        staleness (a synchronous run's next rollouts need the new weights at once), unless
        ``$RFT_PUBLISH`` is ``inline``."""
        where = os.environ.get(PUBLISH_ENV) or "background"
        if where not in PUBLISH_CHOICES:
            raise ValueError(f"{PUBLISH_ENV} must be one of {', '.join(PUBLISH_CHOICES)}, got {where!r}")
        return where == "background" and self.spec.rollout.max_staleness > 0 \
            and self.spec.inference.weight_sync != "none"

    def _publish(self, version: int) -> None:
        """Make inference serve the updated policy as ``version`` (verified), then grant it to rollouts.

        In the background (:attr:`publishes_in_background`): the weights are gathered and copied now (the
        next step's optimiser changes them in place), written and loaded in a thread while the next step
        trains; the previous publication is waited for first, so at most one runs and versions are served
        in order. The tasks submitted until it is done wait for it (:meth:`_submit`), and an error of
        the publication is raised by the next call (or :meth:`finish`)."""
        self._await_publication()
        if self.spec.inference.weight_sync == "none":
            self.policy_version = self.served_version = version
            self.coordinator.set_policy_version(version)
            return
        state = self._gather()
        self.policy_version = version
        if self.publishes_in_background:
            self._publication.start(self._serve, version, detached_state(state, self.model))
        else:
            self._serve(version, state)

    def _serve(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Publish ``state`` as ``version`` and grant it to rollouts (in the publication's thread when it
        runs in the background)."""
        assert self._inference_sync is not None
        with self._inference_sync.lock:  # never re-synced to a version that is being replaced
            self.publisher.publish(self.model, version, self.tokenizer, state_dict=state)
            self.served_version = version
        self.coordinator.set_policy_version(version)

    def _await_publication(self) -> None:
        """Wait for the publication running in the background (its error raised here)."""
        if self._publication.running:
            self._publication_s = self._publication.wait()

    def _step_metrics(self, seqs: list[TrainSequence], all_seqs: list[TrainSequence], everything: list[Group],
                      adv: Any, upd: dict[str, float], ds: dict[str, float],
                      times: dict[str, float]) -> dict[str, Any]:
        m: dict[str, Any] = {"policy_version": self.policy_version}
        m.update(reward_metrics(all_seqs, self.evaluator_names))
        m.update(advantage_metrics(adv))
        m.update(length_metrics(all_seqs))
        m.update(staleness_metrics(seqs, self.policy_version - 1))
        m.update(upd)
        m.update(ds)
        m.update(times)
        m["prefetched_steps"] = len(self._prefetched)
        gen_tokens = sum(s.model_tokens for s in all_seqs)
        train_tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in seqs) * self.learner.cfg.epochs
        m["tokens_generated"] = gen_tokens
        m["tokens_per_s"] = gen_tokens / max(times["time/step"], 1e-9)
        m["gen_tokens_per_s"] = gen_tokens / max(times["time/generate"], 1e-9)
        m["train_tokens_per_s"] = train_tokens / max(times["time/update"], 1e-9)
        reward_s = 0.0
        errors = {k: 0 for k in ERROR_KINDS}
        for g in everything:
            for ep in g.episodes:
                rs = ep.metrics.get("time/reward")
                if isinstance(rs, (int, float)) and math.isfinite(rs):
                    reward_s += float(rs)
                for kind in episode_error_kinds(ep):
                    errors[kind] += 1
        m["time/reward"] = reward_s
        n_eps = sum(len(g.episodes) for g in everything)
        self.counters["samples_scored"] = self.counters.get("samples_scored", 0) + n_eps
        for k, v in errors.items():
            self.counters[f"errors/{k}"] = self.counters.get(f"errors/{k}", 0) + v
            m[f"errors/{k}"] = v
        for k, v in self.coordinator.counters().items():
            m[f"coord/{k}"] = v
        if self.eval_score is not None:
            m["eval_score"] = self.eval_score
            m.update({f"eval_score/{d}": v for d, v in self.eval_domain_scores.items()})
        return m

    # ---------------------------------------------------------------- evaluation
    def evaluate(self) -> float | None:
        """Mean reward on the evaluation tasks under the current policy (no training); the mean of
        each task domain is kept in ``eval_domain_scores`` when there are several (``eval_score/<domain>``
        in the metrics)."""
        ev = self.spec.evaluation
        assert ev is not None
        self._await_publication()  # under the current policy, served
        sampling = sampling_params(self.spec, ev.temperature)
        keys = self._submit([t.to_dict() for t in self.eval_tasks], purpose="eval", n=ev.samples_per_prompt,
                            sampling=sampling)
        groups = self._collect(keys)
        by_domain: dict[str, list[float]] = {}
        for g in groups:
            domain = str(g.task.get("domain") or "default")
            by_domain.setdefault(domain, []).extend(
                float(e.reward) for e in g.episodes if isinstance(e.reward, (int, float)))
        scores = {d: sum(v) / len(v) for d, v in sorted(by_domain.items()) if v}
        self.eval_domain_scores = scores if len(scores) > 1 else {}
        vals = [v for vs in by_domain.values() for v in vs]
        return sum(vals) / len(vals) if vals else None

    # ---------------------------------------------------------------- checkpoints, progress
    def save_checkpoint(self) -> Path:
        """Write an atomic checkpoint of the current step."""
        # Prefetched tasks stay live in the coordinator; a resumed run submits them again.
        pending = [t for tasks in self._prefetched_tasks for t in tasks] + list(self._pending)
        state = TrainerState(step=self.step_count, policy_version=self.policy_version,
                             cursor=self.cursor.state_dict(), pending_tasks=pending,
                             next_seq=self.coordinator.next_seq, counters=dict(self.counters),
                             eval_score=self.eval_score, run=self._run_identity(),
                             reward_moments=self.shape_rewards.state_dict())
        def write(d: Path) -> None:
            self._command("save", str(d), None)
            assert self.worker is not None
            self.worker.save(str(d), state)

        info = self.checkpoints.save(self.step_count, write)
        log.info("checkpoint %s", info.path)
        return info.path

    def _report(self, message: str = "", done: bool = False) -> None:
        if self.progress_sink is None:
            return
        rows = getattr(self, "_curve_rows", None) or self.history  # the whole job's rows (earlier attempts too)
        last = rows[-1] if rows else {}
        counters = self.coordinator.counters() if hasattr(self, "coordinator") else {}
        base = self._coord_base
        rec = Progress(
            attempt=self.attempt, step=self.step_count, total_steps=self.max_steps,
            policy_version=self.policy_version, reward_mean=finite(last.get("reward_mean")),
            reward_std=finite(last.get("reward_std")), eval_score=finite(self.eval_score),
            eval_domain_scores=dict(self.eval_domain_scores),
            samples_scored=int(self.counters.get("samples_scored", 0)),
            errors=ProgressErrors(
                timeouts=int(self.counters.get("errors/timeout", 0)),
                runtime_errors=int(self.counters.get("errors/runtime_error", 0)),
                parse_errors=int(self.counters.get("errors/parse_error", 0)),
                dropped_episodes=int(base["dropped"] + counters.get("episodes_dropped_stale", 0)
                                     + counters.get("episodes_duplicate", 0)),
                reissued_leases=int(base["reissued"] + counters.get("tasks_reissued", 0)),
                refused_episodes=int(base["refused"] + counters.get("episodes_refused_lease", 0)
                                     + counters.get("episodes_dropped_invalid", 0)),
            ),
            checkpoints=[ProgressCheckpoint(step=c.step, path=str(c.path), time=c.time)
                         for c in self.checkpoints.committed()],
            done=done, message=clip_message(message), update_time=now_rfc3339(),
            reward_curve=reward_curve(rows), final_model=getattr(self, "final_model", None),
            domain_rewards={k.split("/")[1]: v for k, v in last.items()
                            if k.startswith("domain/") and k.endswith("/mean") and finite(v) is not None},
        )
        try:
            self.progress_sink.write(rec)
        except Exception as e:  # noqa: BLE001 - progress is best effort; training goes on
            log.warning("progress report failed: %s", e)

    def finish(self) -> None:
        """The run is complete: final checkpoint, ``done`` in progress, workers told to stop."""
        self._await_publication()  # the last version served (or its publication's error raised)
        if self.checkpoints.latest() is None or self.checkpoints.latest().step != self.step_count:
            self.save_checkpoint()
        self.coordinator.finish()
        fmt, merged = export_final_model(self.model, Path(self.cfg.paths.checkpoints), self.tokenizer,
                                         state_dict=self._gather(), base_model_dir=self.model_dir,
                                         merge_adapter=self.spec.checkpoint.merge_final_adapter)
        self.final_model = FinalModel(path=FINAL_DIR, format=fmt, merged_path=merged)
        log.info("final model (%s) at %s", fmt, Path(self.cfg.paths.checkpoints) / FINAL_DIR)
        self._report(message=f"finished {self.step_count} steps", done=True)
        self._tracker_status = "FINISHED"

    def stop(self, checkpoint: bool = True) -> None:
        """Interrupted: checkpoint the last completed step (so ``--resume`` continues)."""
        self._publication.close()  # a resumed run publishes its checkpoint's weights again
        if checkpoint and self.step_count > 0:
            latest = self.checkpoints.latest()
            if latest is None or latest.step != self.step_count:
                self.save_checkpoint()
        self._report(message=f"stopped at step {self.step_count}")
        self._tracker_status = "KILLED"

    def close(self, tell_workers_s: float | None = None) -> None:
        """Stop the coordinator server, flush metrics, and let the other ranks exit.

        ``tell_workers_s``: how long the coordinator may wait for the rollout workers active in the last
        :data:`WORKER_SEEN_WITHIN_S` seconds to be told that the run is done (default
        :data:`TELL_DONE_TIMEOUT_S`; 0 where the caller stops its workers itself, as ``rft run`` does)."""
        if getattr(self, "worker", None) is not None:
            self._command("exit")
            self.worker = None
            if self.dist.world_size > 1:
                distributed.leave_group()
        self._publication.close()
        if self._inference_sync is not None:
            self._inference_sync.stop()
            self._inference_sync = None
        if self._server is not None:
            # workers asking for work now see "done" (and "finished" only if finish() ran: training
            # completed); the server stays up until every recently active worker has been told, so none
            # is left retrying an absent coordinator (a bounded wait: a worker may have died meanwhile)
            self.coordinator.finish(complete=False)
            wait_s = TELL_DONE_TIMEOUT_S if tell_workers_s is None else tell_workers_s
            untold = self.coordinator.wait_workers_told_done(seen_within_s=WORKER_SEEN_WITHIN_S, timeout_s=wait_s)
            if untold and wait_s > 0:
                log.info("rollout workers not told that the run is done before the coordinator stopped: %s",
                         ", ".join(untold))
            self._server.stop()
            self._server = None
        for tracker in getattr(self, "trackers", []):
            tracker.finish(self._tracker_status)  # FAILED unless finished or stopped
        self.trackers = []
        if hasattr(self, "metrics"):
            self.metrics.close()
