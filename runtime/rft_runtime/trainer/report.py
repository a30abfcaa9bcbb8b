"""What the trainer reports: each step's metrics row and the progress record.

A step's row (:func:`step_metrics`, :func:`overlap_metrics`, the episodes' reward time and error
counts) goes to ``metrics.jsonl``, TensorBoard and Prometheus (:class:`..metrics_sink.MetricsSink`)
and to the experiment trackers (MLflow, W&B offline). The progress record (``<job>-progress``
ConfigMap or ``progress.json``, the one the operator reads) has the job's cumulative counters — over
every trainer attempt: a resumed attempt carries on from its predecessor's record — and the reward
curve of the job's rows, earlier attempts' included.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from rft_api.progress import FinalModel, OutputPush, Progress, ProgressCheckpoint, ProgressErrors, reward_curve
from rft_api.runtime import RuntimeConfig

from ..coordinator import Group
from ..metrics_sink import MetricsSink, read_metrics
from ..progress import ConfigMapProgressSink, FileProgressSink, ProgressSink, clip_message, finite, now_rfc3339
from ..types import Episode
from .batch import TrainSequence
from .checkpoint import CheckpointInfo
from .signals import advantage_metrics, length_metrics, reward_metrics, staleness_metrics
from .tracking import Tracker, start_trackers

if TYPE_CHECKING:
    from .evaluation import Evaluation

log = logging.getLogger(__name__)

ERROR_KINDS = ("timeout", "runtime_error", "parse_error")


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


def step_metrics(seqs: list[TrainSequence], all_seqs: list[TrainSequence], adv: Any, upd: dict[str, float],
                 ds: dict[str, float], times: dict[str, float], *, policy_version: int,
                 evaluator_names: list[str], epochs: int, prefetched: int) -> dict[str, Any]:
    """A step's rewards, advantages, lengths, staleness, update, dynamic sampling, phase times and
    throughput: ``seqs`` the sequences trained on, ``all_seqs`` every one generated."""
    m: dict[str, Any] = {"policy_version": policy_version}
    m.update(reward_metrics(all_seqs, evaluator_names))
    m.update(advantage_metrics(adv))
    m.update(length_metrics(all_seqs))
    m.update(staleness_metrics(seqs, policy_version - 1))
    m.update(upd)
    m.update(ds)
    m.update(times)
    m["prefetched_steps"] = prefetched
    gen_tokens = sum(s.model_tokens for s in all_seqs)
    train_tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in seqs) * epochs
    m["tokens_generated"] = gen_tokens
    m["tokens_per_s"] = gen_tokens / max(times["time/step"], 1e-9)
    m["gen_tokens_per_s"] = gen_tokens / max(times["time/generate"], 1e-9)
    m["train_tokens_per_s"] = train_tokens / max(times["time/update"], 1e-9)
    return m


class RunReport:
    """The metrics sink and trackers (:meth:`open_metrics`), the progress sink (:meth:`open_progress`),
    the job's cumulative counters, and the rows of the steps run (:attr:`history`: this attempt's;
    :attr:`curve_rows`: the job's)."""

    def __init__(self, cfg: RuntimeConfig, attempt: int, max_steps: int) -> None:
        self.cfg, self.attempt, self.max_steps = cfg, attempt, max_steps
        self.progress_sink: ProgressSink | None = None
        self.metrics: MetricsSink | None = None
        self.trackers: list[Tracker] = []
        self.counters: dict[str, float] = {}
        self._coord_base = {"dropped": 0, "reissued": 0, "refused": 0}  # coordinator counters of earlier attempts
        self.history: list[dict[str, Any]] = []
        self.curve_rows: list[dict[str, Any]] = []

    def open_progress(self) -> None:
        target = self.cfg.progress
        if target.sink == "configmap":
            self.progress_sink = ConfigMapProgressSink(target.config_map or f"{self.cfg.job.name}-progress",
                                                       self.cfg.job.namespace)
        else:
            self.progress_sink = FileProgressSink(self.cfg.paths.metrics_dir)

    def merge_previous(self) -> None:
        """Carry on the counters of the previous attempt's progress record (cumulative over the job)."""
        assert self.progress_sink is not None
        previous = self.progress_sink.read()
        if previous is None:
            return
        e = previous.errors
        for key, val in (("samples_scored", previous.samples_scored), ("errors/timeout", e.timeouts),
                         ("errors/runtime_error", e.runtime_errors), ("errors/parse_error", e.parse_errors)):
            self.counters[key] = max(self.counters.get(key, 0), val)
        self._coord_base = {"dropped": e.dropped_episodes, "reissued": e.reissued_leases,
                            "refused": e.refused_episodes}

    def open_metrics(self, step: int, resumed: bool) -> MetricsSink:
        """The metrics sink (rows after ``step`` dropped: a resumed attempt writes them again) and the
        experiment trackers, started."""
        self.metrics = MetricsSink(self.cfg.paths.metrics_dir, purge_step=(step + 1) if resumed else None)
        self.metrics.truncate_after(step if resumed else -1)  # a fresh start redoes the baseline (step 0) too
        # the whole job's per-step rows (earlier attempts' too) for the progress record's reward curve
        self.curve_rows = read_metrics(self.metrics.jsonl_path) if self.metrics.jsonl_path is not None else []
        self.trackers = self._start_trackers()
        return self.metrics

    def _start_trackers(self) -> list[Tracker]:
        """The experiment trackers of ``spec.tracking`` (MLflow, W&B offline), started."""
        cfg, job = self.cfg, self.cfg.job
        return start_trackers(cfg.spec.tracking, job.name, job.namespace, Path(cfg.paths.checkpoints) / "tracking",
                              cfg.spec.model_dump(by_alias=True, mode="json", exclude_none=True),
                              {"rft.job": job.name, "rft.namespace": job.namespace,
                               "rft.algorithm": cfg.algorithm.name})

    def count_episodes(self, groups: list[Group]) -> dict[str, Any]:
        """The seconds spent scoring ``groups``' episodes and their reward errors of each kind (added
        to the job's counters, with the episodes scored)."""
        reward_s = 0.0
        errors = {k: 0 for k in ERROR_KINDS}
        for g in groups:
            for ep in g.episodes:
                rs = ep.metrics.get("time/reward")
                if isinstance(rs, (int, float)) and math.isfinite(rs):
                    reward_s += float(rs)
                for kind in episode_error_kinds(ep):
                    errors[kind] += 1
        m: dict[str, Any] = {"time/reward": reward_s}
        n_eps = sum(len(g.episodes) for g in groups)
        self.counters["samples_scored"] = self.counters.get("samples_scored", 0) + n_eps
        for k, v in errors.items():
            self.counters[f"errors/{k}"] = self.counters.get(f"errors/{k}", 0) + v
            m[f"errors/{k}"] = v
        return m

    def log_step(self, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """Write a step's row (metrics sink, trackers); returns it."""
        assert self.metrics is not None
        if self.trackers:
            metrics["tracking_errors"] = sum(t.errors for t in self.trackers)
        row = self.metrics.log(step, metrics)
        for tracker in self.trackers:
            tracker.log_metrics(step, row)
        self.history.append(row)
        self.curve_rows.append(row)
        return row

    def write_progress(self, *, step: int, policy_version: int, evaluation: Evaluation,
                       coordinator: Mapping[str, int], checkpoints: list[CheckpointInfo],
                       final_model: FinalModel | None, message: str = "", done: bool = False,
                       output: OutputPush | None = None) -> None:
        """Write the progress record (best effort: a failure is logged); ``coordinator``: the
        coordinator's counters of this attempt."""
        if self.progress_sink is None:
            return
        rows = self.curve_rows or self.history  # the whole job's rows (earlier attempts too)
        last = rows[-1] if rows else {}
        rec = Progress(
            attempt=self.attempt, step=step, total_steps=self.max_steps,
            policy_version=policy_version, reward_mean=finite(last.get("reward_mean")),
            reward_std=finite(last.get("reward_std")), eval_score=finite(evaluation.score),
            eval_domain_scores=dict(evaluation.domain_scores), evaluation=evaluation.record(),
            samples_scored=int(self.counters.get("samples_scored", 0)),
            errors=self._errors(coordinator),
            checkpoints=[ProgressCheckpoint(step=c.step, path=str(c.path), time=c.time) for c in checkpoints],
            done=done, message=clip_message(message), update_time=now_rfc3339(),
            reward_curve=reward_curve(rows), final_model=final_model, output=output,
            domain_rewards={k.split("/")[1]: v for k, v in last.items()
                            if k.startswith("domain/") and k.endswith("/mean") and finite(v) is not None},
        )
        try:
            self.progress_sink.write(rec)
        except Exception as e:  # noqa: BLE001 - progress is best effort; training goes on
            log.warning("progress report failed: %s", e)

    def _errors(self, coordinator: Mapping[str, int]) -> ProgressErrors:
        """The job's error counts: reward errors, and the coordinator's over every attempt."""
        base, c = self._coord_base, coordinator
        return ProgressErrors(
            timeouts=int(self.counters.get("errors/timeout", 0)),
            runtime_errors=int(self.counters.get("errors/runtime_error", 0)),
            parse_errors=int(self.counters.get("errors/parse_error", 0)),
            dropped_episodes=int(base["dropped"] + c.get("episodes_dropped_stale", 0) + c.get("episodes_duplicate", 0)),
            reissued_leases=int(base["reissued"] + c.get("tasks_reissued", 0)),
            refused_episodes=int(base["refused"] + c.get("episodes_refused_lease", 0)
                                 + c.get("episodes_dropped_invalid", 0)),
        )

    def close(self, outcome: str) -> None:
        """Tell the trackers how the run ended (``FINISHED``, ``KILLED``, ``FAILED``) and flush the metrics."""
        for tracker in self.trackers:
            tracker.finish(outcome)
        self.trackers = []
        if self.metrics is not None:
            self.metrics.close()
