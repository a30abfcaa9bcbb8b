"""Per-domain reward post-processing (``dataset.mix[].rewardClip``, ``rewardScale``,
``rewardNormalization``), as ROLL's RLVR pipeline applies it per domain before the advantages.

For a sequence of domain ``d`` with reward ``r`` (``None`` stays ``None``), in this order:

1. clip: ``r₁ = min(max(r, lo_d), hi_d)`` (either bound may be absent);
2. scale: ``r₂ = s_d · r₁``;
3. normalise:
   - ``none``: ``r₃ = r₂``;
   - ``batch``: ``r₃ = (r₂ − μ) / (σ + ε)`` with ``μ``, ``σ`` the mean and (population) standard
     deviation of the domain's non-null ``r₂`` in this step;
   - ``running``: the same with ``μ``, ``σ`` of every non-null ``r₂`` of the domain over the job so far,
     this step's included (Chan et al.'s parallel update of count, mean and M2, kept in the checkpoint).

``ε = 1e-6``. The shaped rewards feed the advantage estimator only: the logged rewards
(``reward_mean``, ``domain/<d>/mean``, the status) stay as the evaluators scored them. A domain without
settings, and every domain when ``dataset.mix`` is unset, is left as is.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

from .batch import TrainSequence

__all__ = ["RewardShaper", "EPS"]

EPS = 1e-6


@dataclasses.dataclass
class _Moments:
    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def update(self, values: Sequence[float]) -> None:
        if not values:
            return
        n = len(values)
        mean = sum(values) / n
        m2 = sum((v - mean) ** 2 for v in values)
        total = self.count + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.count * n / total
        self.count = total

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count else 0.0


class RewardShaper:
    """Applies the mix's per-domain settings to a step's sequences (module docstring)."""

    def __init__(self, mix: Sequence[Any] | None) -> None:
        self.settings = {m.domain: m for m in (mix or [])
                         if m.reward_clip is not None or m.reward_scale != 1.0 or m.reward_normalization != "none"}
        self.running: dict[str, _Moments] = {}

    @property
    def active(self) -> bool:
        return bool(self.settings)

    def __call__(self, seqs: list[TrainSequence]) -> tuple[list[TrainSequence], dict[str, float]]:
        """The sequences with shaped rewards (copies; the input is not changed) and metrics
        ``domain/<d>/shaped_mean`` and ``domain/<d>/shaped_std``."""
        if not self.active:
            return seqs, {}
        shaped: dict[int, float | None] = {}
        metrics: dict[str, float] = {}
        for domain, m in self.settings.items():
            idx = [i for i, s in enumerate(seqs) if s.domain == domain and s.reward is not None]
            vals = [_clip_scale(float(seqs[i].reward), m) for i in idx]  # type: ignore[arg-type]
            if m.reward_normalization == "batch" and vals:
                mu = sum(vals) / len(vals)
                sd = math.sqrt(sum((v - mu) ** 2 for v in vals) / len(vals))
                vals = [(v - mu) / (sd + EPS) for v in vals]
            elif m.reward_normalization == "running" and vals:
                mom = self.running.setdefault(domain, _Moments())
                mom.update(vals)
                vals = [(v - mom.mean) / (mom.std + EPS) for v in vals]
            shaped.update(zip(idx, vals))
            if vals:
                mu = sum(vals) / len(vals)
                metrics[f"domain/{domain}/shaped_mean"] = mu
                metrics[f"domain/{domain}/shaped_std"] = math.sqrt(sum((v - mu) ** 2 for v in vals) / len(vals))
        out = [dataclasses.replace(s, reward=shaped[i]) if i in shaped else s for i, s in enumerate(seqs)]
        return out, metrics

    def state_dict(self) -> dict[str, Any]:
        """The running moments per domain (JSON-ready)."""
        return {d: dataclasses.asdict(m) for d, m in self.running.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.running = {d: _Moments(int(m["count"]), float(m["mean"]), float(m["m2"])) for d, m in state.items()}


def _clip_scale(r: float, m: Any) -> float:
    clip = m.reward_clip
    if clip is not None:
        if clip.min is not None:
            r = max(r, clip.min)
        if clip.max is not None:
            r = min(r, clip.max)
    return r * m.reward_scale
