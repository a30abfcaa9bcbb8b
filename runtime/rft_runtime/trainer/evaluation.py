"""Held-out evaluation: the mean reward on the evaluation tasks under the served policy (no training).

On when ``evaluation.everySteps`` > 0 and the job has a ``dataset.eval``: the first
``evaluation.maxTasks`` evaluation tasks are submitted to the trainer's coordinator
(``purpose="eval"``, ``evaluation.samplesPerPrompt`` samples each at ``evaluation.temperature``, 0
greedy) and scored as rollouts score any task:

- before the first training step, the baseline (``evaluation.atStart``; step 0 in the metrics);
- every ``everySteps`` steps, and after the last step.

Each evaluation gives ``eval_score`` (the mean reward; ``eval_score/<domain>`` when the tasks span
several domains) and ``eval_pass_at_k`` (the share of tasks with a sample scoring at least
``evaluation.passReward``). :class:`Evaluation` keeps the best score and its step (a checkpoint of it
is kept with ``evaluation.keepBest``), the curve, and decides an early stop (``evaluation.stopWhen``:
a target score, or ``patience`` evaluations in a row that do not beat the best by more than
``minDelta``). Its state travels in every checkpoint, so a resumed trainer goes on counting.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rft_api.progress import MAX_CURVE_POINTS, EvalPoint, ProgressEvaluation
from rft_api.runtime import RuntimeConfig

from ..coordinator import Group
from ..data import Task
from .datasets import load_eval_tasks
from .feed import TaskFeed, sampling_params


@dataclass
class EvalState:
    """What an evaluation run leaves behind (saved in checkpoints: ``TrainerState.evaluation``)."""

    baseline: float | None = None
    step: int | None = None
    score: float | None = None
    pass_at_k: float | None = None
    best_step: int | None = None
    best_score: float | None = None
    best_checkpoint: str | None = None
    since_best: int = 0
    """Evaluations after training started that did not beat the best (``stopWhen.patience``)."""
    stop_reason: str | None = None
    curve: list[list[float]] = field(default_factory=list)
    """``[step, score]`` of every evaluation."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EvalState":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


def pass_at_k(groups: list[Group], threshold: float) -> float | None:
    """The share of ``groups`` with an episode whose reward is at least ``threshold`` (None: no group)."""
    scored = [g for g in groups if any(isinstance(e.reward, (int, float)) for e in g.episodes)]
    if not scored:
        return None
    return sum(any(isinstance(e.reward, (int, float)) and e.reward >= threshold for e in g.episodes)
               for g in scored) / len(scored)


class Evaluation:
    """The evaluation tasks (none when evaluation is off), the latest and best scores, the stop rule."""

    def __init__(self, cfg: RuntimeConfig) -> None:
        self.cfg, self.spec = cfg, cfg.spec
        self.tasks: list[Task] = []
        self.every_steps = 0  # > 0 when there are tasks
        self.state = EvalState()
        self.domain_scores: dict[str, float] = {}  # the mean of each domain, when there are several

    @property
    def score(self) -> float | None:
        """The last evaluation's mean reward."""
        return self.state.score

    @property
    def stop_reason(self) -> str | None:
        """Why training should stop now (``evaluation.stopWhen``), or None."""
        return self.state.stop_reason

    def load(self) -> None:
        """The evaluation tasks, when evaluation is on."""
        spec, ev = self.spec, self.spec.evaluation
        if ev is not None and ev.every_steps > 0 and spec.dataset.eval is not None:
            self.tasks = load_eval_tasks(spec.dataset, self.cfg.paths.datasets)[: ev.max_tasks]
            self.every_steps = ev.every_steps

    def wants_baseline(self) -> bool:
        """Whether the baseline is still to be measured (before the first step of a fresh run)."""
        ev = self.spec.evaluation
        return bool(self.tasks) and ev is not None and ev.at_start and self.state.step is None

    def due(self, step: int, last: bool) -> bool:
        """Whether step ``step`` ends with an evaluation (``last``: it is the run's last step)."""
        return bool(self.tasks) and (step % self.every_steps == 0 or last)

    def run(self, feed: TaskFeed, step: int) -> bool:
        """Evaluate the policy served now (through ``feed``) as of step ``step``; returns whether the
        score beat the best (the baseline included), by more than ``stopWhen.minDelta``."""
        ev = self.spec.evaluation
        assert ev is not None
        sampling = sampling_params(self.spec, ev.temperature)
        keys = feed.submit([t.to_dict() for t in self.tasks], purpose="eval", n=ev.samples_per_prompt,
                           sampling=sampling)
        groups = feed.collect(keys)
        by_domain: dict[str, list[float]] = {}
        for g in groups:
            domain = str(g.task.get("domain") or "default")
            by_domain.setdefault(domain, []).extend(
                float(e.reward) for e in g.episodes if isinstance(e.reward, (int, float)))
        scores = {d: sum(v) / len(v) for d, v in sorted(by_domain.items()) if v}
        self.domain_scores = scores if len(scores) > 1 else {}
        vals = [v for vs in by_domain.values() for v in vs]
        score = sum(vals) / len(vals) if vals else None
        return self._observe(step, score, pass_at_k(groups, ev.pass_reward))

    def _observe(self, step: int, score: float | None, passed: float | None) -> bool:
        """Record an evaluation; returns whether it is the new best. Decides the early stop."""
        ev, st = self.spec.evaluation, self.state
        assert ev is not None
        st.step, st.score, st.pass_at_k = step, score, passed
        if step == 0:
            st.baseline = score
        if score is None:
            return False
        st.curve.append([step, score])
        if len(st.curve) > MAX_CURVE_POINTS:  # thin out evenly, keeping the first and the last
            st.curve = st.curve[:1] + st.curve[1:-1:2] + st.curve[-1:]
        delta = ev.stop_when.min_delta if ev.stop_when is not None else 0.0
        improved = st.best_score is None or score > st.best_score + delta
        if improved:
            st.best_step, st.best_score, st.since_best = step, score, 0
            st.best_checkpoint = None  # set by the trainer once a checkpoint of this step is kept
        elif step > 0:
            st.since_best += 1
        w = ev.stop_when
        if w is not None and step > 0:
            if w.score_at_least is not None and score >= w.score_at_least:
                st.stop_reason = "scoreAtLeast"
            elif w.patience is not None and st.since_best >= w.patience:
                st.stop_reason = "patience"
        return improved and step > 0

    def metrics(self) -> dict[str, Any]:
        """``eval_score`` (``eval_score/<domain>``), ``eval_pass_at_k`` and ``eval_best_score`` once
        an evaluation scored."""
        st = self.state
        if st.score is None:
            return {}
        out = {"eval_score": st.score, **{f"eval_score/{d}": v for d, v in self.domain_scores.items()}}
        if st.pass_at_k is not None:
            out["eval_pass_at_k"] = st.pass_at_k
        if st.best_score is not None:
            out["eval_best_score"] = st.best_score
        return out

    def record(self) -> ProgressEvaluation | None:
        """The progress record's ``evaluation`` (None before the first evaluation)."""
        st = self.state
        if st.step is None:
            return None
        return ProgressEvaluation(
            baseline=st.baseline, step=st.step, score=st.score, pass_at_k=st.pass_at_k, best_step=st.best_step,
            best_score=st.best_score, best_checkpoint=st.best_checkpoint,
            stop_reason=st.stop_reason,
            curve=[EvalPoint(step=int(s), score=float(v)) for s, v in st.curve])

    def state_dict(self) -> dict[str, Any]:
        return asdict(self.state)

    def load_state_dict(self, d: dict[str, Any], eval_score: float | None = None) -> None:
        """Restore :meth:`state_dict` (a checkpoint older than it has only ``eval_score``)."""
        self.state = EvalState.from_dict(d) if d else EvalState(score=eval_score)
