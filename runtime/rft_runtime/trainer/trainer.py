"""The trainer role: the step loop, and the ranks that train together.

One :meth:`Trainer.step`::

    collect groups (coordinator; DAPO dynamic sampling rounds)      time/generate (reward inside)
    → batch → old log-probs (recompute, or the inference ones)      time/old_logprob
    → reference log-probs (kl.coef > 0)                             time/ref_logprob
    → rewards (overlong, KL-in-reward) → advantages (registry)
    → TIS weights (importanceSampling) → update (epochs × micro-batches, AdamW, clip, schedule)
                                                                    time/update
    → save weights v<version+1>, inference loads them, verified     time/weight_sync
      (maxStaleness > 0: in a thread while the next step trains;     time/publish_background)
    → evaluation every K steps (evaluation.everySteps)              time/eval
    → checkpoint every K steps and at the end (atomic)              time/checkpoint
    → progress record → metrics (jsonl, TensorBoard, Prometheus)

Ranks: the trainer is one torch.distributed process group of ``trainer.nodes × processesPerNode``
processes (:mod:`.distributed`; 1 included). Every rank holds a :class:`Worker` — its shard of the
FSDP2 policy (and reference), the optimiser state of that shard — and trains its rows of each
step's batch. Rank 0 alone is the :class:`Trainer`: it runs the coordinator, collects the step's
episodes, tells the other ranks what to do (:func:`follow`: train on these sequences, gather the
weights, write or read a checkpoint, exit; ``broadcast_object_list``), publishes the gathered
weights, reports progress and writes metrics.

The :class:`Trainer` runs the step loop and checkpoints, and wires its collaborators, one concern each:

* :mod:`.feed` — :class:`~.feed.TaskFeed`: the data order (a seeded, resumable cursor; per-submission
  sampling seeds), the tasks submitted to the coordinator ahead under bounded staleness, dynamic
  sampling rounds, the groups collected;
* :mod:`.publication` — :class:`~.publication.Publication`: which version inference serves and when
  rollouts get it (in a thread while the next step trains, under bounded staleness), the final model;
* :mod:`.evaluation` — :class:`~.evaluation.Evaluation`: held-out scores every ``everySteps`` steps;
* :mod:`.report` — :class:`~.report.RunReport`: each step's metrics row, the progress record, the
  job's cumulative counters;
* :mod:`.shutdown` — :class:`~.shutdown.Shutdown`: the stop request, how the run ended, the rollout
  workers told that it did.

Versions: the initial weights are policy version 0 (or the checkpoint's on resume); after step
``s`` the served version is ``s`` (:mod:`.publication` for bounded staleness).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import random
import time
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

import numpy as np
import torch

from rft_api.progress import FinalModel, OutputPush
from rft_api.runtime import BIND_HOST_ENV, RuntimeConfig

from ..algos import tis_weights
from ..coordinator import Coordinator, CoordinatorConfig, CoordinatorService, EpisodeLimits, Group
from ..coordinator.server import CoordinatorServer
from ..model.loading import load_tokenizer, resolve_model_dir
from ..rewards.config import evaluator_names
from . import distributed
from .batch import TrainSequence, collate, sequences_from_groups
from .checkpoint import CheckpointLost, CheckpointManager, step_dir_name
from .compiled import wants_compile
from .distributed import DistContext
from .evaluation import Evaluation
from .feed import TaskFeed, sampling_params
from .finite import NonFiniteSteps, NonFiniteWeights
from .learner import Learner, Shard, build_optimizer, build_scheduler, forward_is_deterministic, learner_config
from .model_io import Reference, compute_dtype, load_sharded_policy
from .publication import Publication, export_final, push_final
from .report import RunReport, overlap_metrics, step_metrics
from .reward_shaping import RewardShaper
from .samples import SampleLog
from .shutdown import Shutdown, StopRequested
from .signals import advantages, shaped_rewards
from .state import ResumeError, TrainerState, check_checkpoint, load_checkpoint, write_checkpoint

__all__ = ["StepResult", "StopRequested", "Trainer", "Worker", "follow", "mismatch_metrics"]

log = logging.getLogger(__name__)


def mismatch_metrics(old: torch.Tensor, inference: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """How far the trainer's recomputed log-probs are from the inference engine's (token contract
    check): mean and max absolute difference, and the k3 estimate of KL(π_inf ‖ π_old)."""
    if not bool(mask.any()):
        return {}
    d = (old - inference)[mask].double()
    k3 = (torch.exp(d) - 1 - d).mean()
    return {"logprob_diff_abs_mean": float(d.abs().mean()), "logprob_diff_abs_max": float(d.abs().max()),
            "mismatch_kl_k3": float(k3)}


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
        compile_layers = wants_compile(spec.trainer.compile or "auto", self.dist.device)
        self.model = load_sharded_policy(spec.model, self.model_dir, spec.trainer.seed, paths.warm_start, self.dist,
                                         compute_dtype(spec.model.dtype, self.dist.device), compile_layers)
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
        try:
            getattr(worker, name)(*args)
        except NonFiniteWeights as e:  # rank 0 saw the same (all ranks agree) and ends the run
            log.error("trainer rank %d: %s", dist.rank, e)


class Trainer:
    """The trainer role. Use :meth:`setup`, then :meth:`step` until :attr:`finished`, then
    :meth:`finish` (final checkpoint, ``done``) and :meth:`close`.

    It runs the step loop and checkpoints; its collaborators do the rest: :attr:`feed` (the tasks
    submitted to the coordinator, the groups collected), :attr:`publication` (inference serves each
    version), :attr:`evaluation` (held-out scores), :attr:`report` (metrics rows, progress record) and
    :attr:`shutdown` (the stop request, how the run ended)."""

    def __init__(self, cfg: RuntimeConfig, *, resume: bool = True, max_steps: int | None = None,
                 should_stop: Callable[[], bool] = lambda: False, require_resume: bool = False,
                 attempt: int | None = None, dist: DistContext | None = None) -> None:
        if dist is None and cfg.spec.trainer.world_size() > 1:
            raise ValueError(f"a trainer of {cfg.spec.trainer.world_size()} processes (trainer.nodes x "
                             "processesPerNode) needs its DistContext: rft trainer and rft run start its ranks")
        self.dist = dist or DistContext(cpu_offload=bool(cfg.spec.trainer.cpu_offload))
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
        self.attempt = int(attempt if attempt is not None else os.environ.get("RFT_TRAINER_ATTEMPT", 0) or 0)
        self.step_count = 0
        self.policy_version = 0  # the trainer's weights
        self.resumed_from: int | None = None
        self.final_model: FinalModel | None = None
        self.output_push: OutputPush | None = None
        self.worker: Worker | None = None
        self._server: CoordinatorServer | None = None
        self.shutdown = Shutdown(should_stop)
        self.feed = TaskFeed(cfg, self.max_steps, min_version=lambda: self.policy_version, should_stop=should_stop)
        self.publication = Publication(cfg, grant=self._grant)
        self.evaluation = Evaluation(cfg)
        self.report = RunReport(cfg, self.attempt, self.max_steps)
        self.finite = NonFiniteSteps(self.spec.trainer.max_non_finite_steps)

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
        self._load_learner()
        self.feed.load()
        self.shape_rewards = RewardShaper(self.spec.dataset.mix)
        self.evaluation.load()
        self.checkpoints = CheckpointManager(Path(self.cfg.paths.checkpoints), self.spec.checkpoint.keep_last,
                                             attempt=self.attempt)
        self.checkpoints.remove_leftovers()  # partial saves of a suspended, evicted or killed trainer
        self.report.open_progress()
        next_seq = self._restore() if self.resume else 0
        self.metrics = self.report.open_metrics(self.step_count, resumed=bool(self.resumed_from))
        self.samples = SampleLog(self.cfg, self.report)
        self._start_coordinator(next_seq)
        return self

    def publish_initial(self) -> "Trainer":
        """Make every inference replica serve the current weights (the base model's, or the checkpoint's
        when resuming; a replica that does not answer yet is retried as every publication is) and keep a
        restarted one on them; after :meth:`prepare`."""
        self.publication.start(self.model, self.tokenizer, self.policy_version, self._gather)
        self._report(message=f"resumed from step {self.resumed_from}" if self.resumed_from is not None else "started")
        return self

    def _load_learner(self) -> None:
        """This rank's :class:`Worker`: tokenizer, sharded policy, reference, optimiser, scheduler."""
        self.worker = Worker(self.cfg, self.dist).load()
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

    def _check_not_lost(self) -> None:
        """No checkpoint to resume from: raise :class:`~.checkpoint.CheckpointLost` when the job's progress
        record (it outlives the checkpoint volume) lists checkpoints, rather than train from step 0."""
        previous = self.report.progress_sink.read() if self.report.progress_sink is not None else None
        if previous is not None and previous.checkpoints:
            steps = ", ".join(str(c.step) for c in previous.checkpoints)
            raise CheckpointLost(
                f"{self.cfg.paths.checkpoints} holds no checkpoint, yet the job's progress record (step "
                f"{previous.step}) lists checkpoints of steps {steps}: the checkpoint volume was deleted or "
                "replaced. Training from step 0 would silently discard those steps; to start over, delete the "
                "RFTJob and create it again")

    def _restore(self) -> int:
        """Restore the latest checkpoint (if any); returns the next submission number."""
        latest = self.checkpoints.latest()
        if latest is None:
            if self.require_resume:
                raise ResumeError(f"--resume: no checkpoint under {self.cfg.paths.checkpoints}")
            self._check_not_lost()
            return 0
        state = check_checkpoint(latest.path, expect_run=self._run_identity())
        self._command("restore", str(latest.path))
        assert self.worker is not None
        self.worker.restore(str(latest.path))
        if state.step != latest.step:
            raise ResumeError(f"{latest.path}: {latest.path.name} holds step {state.step}; the step counter "
                              "would go backwards")
        self.feed.restore(state.cursor, state.pending_tasks)
        self.step_count, self.policy_version = state.step, state.policy_version
        self.report.counters = dict(state.counters)
        self.evaluation.load_state_dict(state.evaluation, state.eval_score)
        best = self.evaluation.state.best_checkpoint
        if best is not None and self.evaluation.state.best_step is not None and Path(best).is_dir():
            self.checkpoints.set_best(self.evaluation.state.best_step)  # lost when killed right after the save
        self.shape_rewards.load_state_dict(state.reward_moments)
        self.resumed_from = state.step
        self.report.merge_previous()  # counters are cumulative over the job, across restarts
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
        self.feed.connect(self.coordinator)
        self._server = CoordinatorServer(self.coordinator, os.environ.get(BIND_HOST_ENV) or "0.0.0.0",
                                         cfg.ports.coordinator, metrics_registry=self.metrics.registry,
                                         advertise_host=urlsplit(cfg.endpoints.coordinator).hostname).start()

    def _grant(self, version: int) -> None:
        """Rollouts may sample from ``version`` (served) from now on."""
        self.coordinator.set_policy_version(version)

    @property
    def coordinator_url(self) -> str:
        """Where rollout workers reach this trainer's coordinator."""
        assert self._server is not None
        return self._server.url

    @property
    def finished(self) -> bool:
        """Every step ran, or the evaluation stopped training early (``evaluation.stopWhen``)."""
        return self.step_count >= self.max_steps or self.evaluation.stop_reason is not None

    @property
    def served_version(self) -> int:
        """The newest version inference serves (one behind while publishing in the background)."""
        return self.publication.served_version

    @property
    def publishes_in_background(self) -> bool:
        """:attr:`.publication.Publication.in_background`."""
        return self.publication.in_background

    def _run_identity(self) -> dict[str, Any]:
        """What a checkpoint must share with the run resuming it (a mismatch is a terminal
        ``ResumeError``): the algorithm, LoRA, the model, and the training tasks' content (a dataset
        edited under a running job would silently misplace the data cursor)."""
        return {"algorithm": self.alg.name, "lora": self.spec.model.lora is not None, "model": self.spec.model.base,
                "dataset": self.feed.fingerprint}

    # ---------------------------------------------------------------- tasks (the feed's, as of the trainer)
    def _next_tasks(self, k: int) -> list[dict[str, Any]]:
        return self.feed.next_tasks(k)

    def _submit(self, tasks: list[dict[str, Any]], **kw: Any) -> list[str]:
        return self.feed.submit(tasks, **kw)

    # ---------------------------------------------------------------- one step
    def step(self) -> dict[str, Any]:
        """Run one training step; returns its metrics (also logged). Raises :class:`StopRequested`
        when asked to stop while collecting (nothing is counted then)."""
        if self.finished:
            raise RuntimeError(f"the run has finished ({self.step_count}/{self.max_steps} steps)")
        step_no = self.step_count + 1
        if step_no == 1 and self.evaluation.wants_baseline():
            self._baseline()
        times = _Phases()
        self.publication.waited_s = None
        with times("time/step"):
            idle0 = self.coordinator.idle_seconds()  # within the step's timer: idle never exceeds the step
            with times("time/generate"):
                self.feed.prefetch(step_no - 1)  # the first step submits its own tasks with the next S steps'
                groups, everything, ds = self.feed.train_groups()
            self.feed.prefetch(step_no)  # the rollouts of the next S steps run while this one trains
            seqs = sequences_from_groups(groups, vocab_size=self.limits.vocab_size, max_len=self.limits.max_model_len)
            seqs, shaped = self.shape_rewards(seqs)
            self._command("train", seqs, step_no)
            assert self.worker is not None
            res = self.worker.train(seqs, step_no, times)
            self._check_finite(step_no, res)
            with times("time/weight_sync"):
                self._publish(self.policy_version + 1)
            self.step_count = step_no
            best = False
            if self.evaluation.due(step_no, last=step_no == self.max_steps):
                with times("time/eval"):
                    best = self.evaluate(step_no)
            with times("time/checkpoint"):
                self._checkpoint_step(step_no, best)
            self.samples.record(step_no, everything, self.tokenizer, last=self.finished)
            idle_generate = self.coordinator.idle_seconds() - idle0
        metrics = res.metrics
        metrics.update(self._step_metrics(seqs, everything, res, ds, times.seconds))
        metrics.update(overlap_metrics(times.seconds, idle_generate))
        if self.publication.waited_s is not None:
            metrics["time/publish_background"] = self.publication.waited_s
        metrics.update(shaped)
        row = self.report.log_step(step_no, metrics)
        self._report()
        return row

    def _check_finite(self, step_no: int, res: StepResult) -> None:
        """Count a step the learner skipped for a non-finite gradient (:mod:`.finite`); at
        ``trainer.maxNonFiniteSteps`` in a row, :class:`~.finite.NonFiniteTraining` ends the run."""
        latest = self.checkpoints.latest()
        self.finite.observe(step_no, int(res.update.get("nonfinite_skipped", 0)), self.learner.cfg.epochs,
                            latest.step if latest is not None else None)

    def _publish(self, version: int) -> None:
        """Make inference serve the updated policy as ``version`` (verified), then grant it to rollouts
        (:meth:`.publication.Publication.serve`: in the background under bounded staleness, where the
        weights are gathered now and the previous publication is waited for first)."""
        self.publication.wait()
        state = self._gather() if self.publication.syncs_weights else None
        self.policy_version = version
        self.publication.serve(version, state)

    def _step_metrics(self, seqs: list[TrainSequence], everything: list[Group], res: StepResult,
                      ds: dict[str, float], times: dict[str, float]) -> dict[str, Any]:
        m = step_metrics(seqs, sequences_from_groups(everything), res.adv, res.update, ds, times,
                         policy_version=self.policy_version, evaluator_names=self.evaluator_names,
                         epochs=self.learner.cfg.epochs, prefetched=len(self.feed.prefetched))
        m.update(self.report.count_episodes(everything))
        for k, v in self.coordinator.counters().items():
            m[f"coord/{k}"] = v
        m.update(self.evaluation.metrics())
        return m

    def evaluate(self, step: int) -> bool:
        """Evaluate the current policy, served (no training), as of ``step``: the score, its best and
        the early stop in :attr:`evaluation`; returns whether it is the new best (after training began)."""
        self.publication.wait()  # under the current policy, served
        best = self.evaluation.run(self.feed, step)
        st = self.evaluation.state
        log.info("evaluation at step %d: score %s (best %s at step %s)%s", step, st.score, st.best_score,
                 st.best_step, f"; stopping: evaluation.stopWhen.{st.stop_reason}" if st.stop_reason else "")
        return best

    def _baseline(self) -> None:
        """The held-out score of the base policy, before the first step (step 0 in the metrics)."""
        started = time.perf_counter()
        self.evaluate(0)
        self.report.log_step(0, {**self.evaluation.metrics(), "time/eval": time.perf_counter() - started})
        self._report(message="baseline evaluated")

    def _checkpoint_step(self, step: int, best: bool) -> None:
        """The checkpoint of a step when one is due: every ``checkpoint.everySteps``, the last step, an
        early stop, and a new best evaluation (``evaluation.keepBest``: kept beyond ``keepLast``)."""
        ev = self.spec.evaluation
        keep_best = best and ev is not None and ev.keep_best
        if keep_best:  # the state saved names its own directory as the best
            self.evaluation.state.best_checkpoint = str(self.checkpoints.root / step_dir_name(step))
        if (step % self.spec.checkpoint.every_steps == 0 or self.finished or keep_best):
            self.save_checkpoint()
        if keep_best:
            self.checkpoints.set_best(step)

    # ---------------------------------------------------------------- checkpoints, progress
    def save_checkpoint(self) -> Path:
        """Write an atomic checkpoint of the current step."""
        state = TrainerState(step=self.step_count, policy_version=self.policy_version,
                             cursor=self.feed.cursor.state_dict(), pending_tasks=self.feed.carried_tasks(),
                             next_seq=self.coordinator.next_seq, counters=dict(self.report.counters),
                             eval_score=self.evaluation.score, evaluation=self.evaluation.state_dict(),
                             run=self._run_identity(),
                             reward_moments=self.shape_rewards.state_dict())

        def write(d: Path) -> None:
            self._command("save", str(d), None)
            assert self.worker is not None
            self.worker.save(str(d), state)

        info = self.checkpoints.save(self.step_count, write)
        log.info("checkpoint %s", info.path)
        return info.path

    def _checkpoint_unless_saved(self) -> None:
        """A checkpoint of the current step, unless the latest is of it already."""
        latest = self.checkpoints.latest()
        if latest is None or latest.step != self.step_count:
            self.save_checkpoint()

    def _report(self, message: str = "", done: bool = False) -> None:
        if self.report.progress_sink is None:
            return
        self.report.write_progress(
            step=self.step_count, policy_version=self.policy_version, evaluation=self.evaluation,
            coordinator=self.coordinator.counters() if hasattr(self, "coordinator") else {},
            checkpoints=self.checkpoints.committed(), final_model=self.final_model, message=message, done=done,
            output=self.output_push)

    # ---------------------------------------------------------------- the end
    def finish(self) -> None:
        """The run is complete: final checkpoint, ``done`` in progress, workers told to stop."""
        self.publication.wait()  # the last version served (or its publication's error raised)
        self._checkpoint_unless_saved()
        self.coordinator.finish()
        self.final_model = export_final(self.model, self.tokenizer, self._gather(), self.cfg, self.model_dir)
        if self.final_model is not None and self.cfg.spec.output is not None:
            self._report(message=f"finished {self.step_count} steps; pushing the final model")
            self.output_push = push_final(self.cfg, self.final_model)
        self._report(message=f"finished {self.step_count} steps", done=True)
        self.shutdown.finished()

    def stop(self, checkpoint: bool = True) -> None:
        """Interrupted: checkpoint the last completed step (so ``--resume`` continues)."""
        self.publication.stop()  # a resumed run publishes its checkpoint's weights again
        if checkpoint and self.step_count > 0:
            self._checkpoint_unless_saved()
        self._report(message=f"stopped at step {self.step_count}")
        self.shutdown.stopped()

    def close(self, tell_workers_s: float | None = None) -> None:
        """Stop the coordinator server, flush metrics, and let the other ranks exit.

        ``tell_workers_s``: how long the coordinator may wait for the rollout workers active lately to be
        told that the run is done (:meth:`.shutdown.Shutdown.tell_workers_done`; 0 where the caller stops
        its workers itself, as ``rft run`` does)."""
        if self.worker is not None:
            self._command("exit")
            self.worker = None
            if self.dist.world_size > 1:
                distributed.leave_group()
        self.publication.close()
        if self._server is not None:
            # workers asking for work now see "done" (and "finished" only if finish() ran: training
            # completed); the server stays up until every recently active worker has been told
            self.shutdown.tell_workers_done(self.coordinator, tell_workers_s)
            self._server.stop()
            self._server = None
        self.report.close(self.shutdown.outcome)  # trackers: FAILED unless finished or stopped
