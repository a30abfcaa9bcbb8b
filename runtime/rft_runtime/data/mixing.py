"""Domain mixing (``spec.dataset.mix``): every step's prompts split across domains by weight.

ROLL's RLVR pipeline mixes domains by interleave probability; here the split is exact and the same
every step: ``k`` prompts go to the domains in proportion to their weights, by the largest-remainder
method (each domain gets ``floor(k·p)``; the prompts left over go to the largest fractional parts,
ties to the domain listed first). So with weights 0.5/0.3/0.2 a step of 16 prompts holds 8/5/3.

Each domain draws from its own :class:`~rft_runtime.data.cursor.DataCursor` (seeded from the dataset
seed and the domain name, unbounded epochs), so a domain with few tasks repeats them while a large one
is still in its first epoch, and :meth:`DomainMixCursor.state_dict` (every domain's position) is the
whole state: a resumed trainer draws exactly the batches an uninterrupted run would have drawn.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Sequence

from .cursor import DataCursor
from .task import DatasetError, Task

__all__ = ["apportion", "DomainMixCursor"]


def apportion(k: int, weights: Sequence[float]) -> list[int]:
    """``k`` split in proportion to ``weights`` (largest remainder; ties to the earlier entry)."""
    if k < 0:
        raise ValueError(f"apportion: k must be >= 0, got {k}")
    if not weights or any(not (w > 0 and math.isfinite(w)) for w in weights):
        raise ValueError(f"apportion: weights must be positive and finite, got {list(weights)}")
    total = float(sum(weights))
    exact = [k * w / total for w in weights]
    counts = [math.floor(x) for x in exact]
    left = k - sum(counts)
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_remainder[:left]:
        counts[i] += 1
    return counts


class DomainMixCursor:
    """Draws each batch from the domains' own cursors in the mix's proportions (module docstring)."""

    def __init__(self, tasks: Sequence[Task], mix: Sequence[tuple[str, float]], seed: int = 0, *,
                 shuffle: bool = True) -> None:
        if not mix:
            raise DatasetError("spec.dataset.mix: must list at least one domain")
        names = [d for d, _ in mix]
        by_domain: dict[str, list[Task]] = {d: [] for d in names}
        unlisted: set[str] = set()
        for t in tasks:
            if t.domain in by_domain:
                by_domain[t.domain].append(t)
            else:
                unlisted.add(t.domain)
        if unlisted:
            raise DatasetError(f"spec.dataset.mix: the training tasks have domain(s) {', '.join(sorted(unlisted))} "
                               f"that the mix does not list (it lists {', '.join(names)})")
        empty = [d for d in names if not by_domain[d]]
        if empty:
            raise DatasetError(f"spec.dataset.mix: no training task has domain(s) {', '.join(empty)}")
        self.domains = names
        self.weights = [float(w) for _, w in mix]
        self.cursors = {d: DataCursor(by_domain[d], seed=_domain_seed(seed, d), shuffle=shuffle) for d in names}

    def counts(self, k: int) -> dict[str, int]:
        """How many of ``k`` prompts each domain gets."""
        return dict(zip(self.domains, apportion(k, self.weights)))

    def next_batch(self, k: int) -> list[Task]:
        """The next ``k`` tasks: each domain's share, in the mix's order."""
        out: list[Task] = []
        for domain, n in self.counts(k).items():
            out += self.cursors[domain].next_batch(n)
        return out

    def state_dict(self) -> dict[str, Any]:
        """Every domain's cursor position, by domain."""
        return {"mix": {d: w for d, w in zip(self.domains, self.weights)},
                "domains": {d: c.state_dict() for d, c in self.cursors.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s positions; refuses a state saved over another mix."""
        saved = state.get("domains")
        if not isinstance(saved, dict) or "mix" not in state:
            raise DatasetError("spec.dataset.mix: the checkpoint's data position was saved without a domain mix")
        if sorted(saved) != sorted(self.domains):
            raise DatasetError(f"spec.dataset.mix: the checkpoint mixed domains {', '.join(sorted(saved))}, "
                               f"this job mixes {', '.join(sorted(self.domains))}")
        for d, c in self.cursors.items():
            c.load_state_dict(saved[d])


def _domain_seed(seed: int, domain: str) -> int:
    """A per-domain seed, stable across processes (no hash randomisation)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{domain}".encode()).digest()[:4], "big")
