"""Held-out evaluation: the mean reward on the evaluation tasks under the served policy (no training).

On when ``evaluation.everySteps`` > 0 and the job has a ``dataset.eval``: every ``everySteps`` steps
the first ``evaluation.maxTasks`` evaluation tasks are submitted to the trainer's coordinator
(``purpose="eval"``, ``evaluation.samplesPerPrompt`` samples each at ``evaluation.temperature``) and
scored as rollouts score any task. ``eval_score`` in the metrics and the progress record, with
``eval_score/<domain>`` when the tasks span several domains.
"""

from __future__ import annotations

from typing import Any

from rft_api.runtime import RuntimeConfig

from ..data import Task
from .datasets import load_eval_tasks
from .feed import TaskFeed, sampling_params


class Evaluation:
    """The evaluation tasks (none when evaluation is off) and the latest scores."""

    def __init__(self, cfg: RuntimeConfig) -> None:
        self.cfg, self.spec = cfg, cfg.spec
        self.tasks: list[Task] = []
        self.every_steps = 0  # > 0 when there are tasks
        self.score: float | None = None
        self.domain_scores: dict[str, float] = {}  # the mean of each domain, when there are several

    def load(self) -> None:
        """The evaluation tasks, when evaluation is on."""
        spec, ev = self.spec, self.spec.evaluation
        if ev is not None and ev.every_steps > 0 and spec.dataset.eval is not None:
            self.tasks = load_eval_tasks(spec.dataset, self.cfg.paths.datasets)[: ev.max_tasks]
            self.every_steps = ev.every_steps

    def due(self, step: int) -> bool:
        """Whether step ``step`` ends with an evaluation."""
        return bool(self.tasks) and step % self.every_steps == 0

    def run(self, feed: TaskFeed) -> float | None:
        """Mean reward on the evaluation tasks, sampled through ``feed`` from the policy served now; the
        mean of each task domain is kept in :attr:`domain_scores` when there are several."""
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
        return sum(vals) / len(vals) if vals else None

    def metrics(self) -> dict[str, Any]:
        """``eval_score`` (and ``eval_score/<domain>``) once an evaluation scored."""
        if self.score is None:
            return {}
        return {"eval_score": self.score, **{f"eval_score/{d}": v for d, v in self.domain_scores.items()}}
