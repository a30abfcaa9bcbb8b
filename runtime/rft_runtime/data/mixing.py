"""Multi-domain mixing (ROLL's ``domain_interleave_probs``).

:func:`interleave` lays tasks of several domains out in one sequence: at each position a domain is
drawn with probability proportional to its weight among the domains that still have tasks, and
that domain's next task (in a seeded per-domain shuffle) is taken. Each task appears at most once,
so no two positions share a task id. With the default ``n`` every task of every domain with a
positive weight appears exactly once; the prefix of the sequence follows the weights, so feed it
to ``DataCursor(..., shuffle=False)`` to keep the mix in every batch.
"""

from __future__ import annotations

import math
import random
from typing import Mapping, Sequence

from .task import DatasetError, Task

__all__ = ["interleave"]


def interleave(
    datasets: Mapping[str, Sequence[Task]],
    probs: Mapping[str, float],
    seed: int,
    *,
    n: int | None = None,
) -> list[Task]:
    """Interleave ``datasets`` (domain name -> tasks) with mixing weights ``probs``.

    ``probs`` must name exactly the domains of ``datasets``; weights are non-negative, finite and
    not all zero (they are normalised). Domains with weight 0 are left out. Each returned task has
    ``domain`` set to its dataset's key. ``n`` (default: all tasks of the weighted domains) must not
    exceed that total. Deterministic in ``seed``.
    """
    missing, extra = set(datasets) - set(probs), set(probs) - set(datasets)
    if missing or extra:
        raise DatasetError(
            f"interleave: field 'probs' must name exactly the datasets; missing {sorted(missing)}, "
            f"unknown {sorted(extra)}"
        )
    for name, p in probs.items():
        if not isinstance(p, (int, float)) or isinstance(p, bool) or not math.isfinite(p) or p < 0:
            raise DatasetError(f"interleave: field 'probs.{name}' must be a finite number >= 0, got {p!r}")
    active = [name for name in sorted(datasets) if probs[name] > 0]
    if not active:
        raise DatasetError("interleave: field 'probs' must give at least one dataset a weight > 0")
    for name in active:
        if not datasets[name]:
            raise DatasetError(f"interleave: dataset {name!r} has a weight > 0 but no tasks")
    total = sum(len(datasets[name]) for name in active)
    if n is None:
        n = total
    if n < 0 or n > total:
        raise DatasetError(f"interleave: field 'n' must be between 0 and {total}, got {n}")

    rng = random.Random(f"interleave:{seed}")
    queues: dict[str, list[Task]] = {}
    for name in active:
        tasks = [t.with_domain(name) for t in datasets[name]]
        rng.shuffle(tasks)
        tasks.reverse()  # pop() from the end takes them in shuffled order
        queues[name] = tasks
    out: list[Task] = []
    while len(out) < n:
        live = [name for name in active if queues[name]]
        weights = [float(probs[name]) for name in live]
        name = rng.choices(live, weights=weights, k=1)[0]
        out.append(queues[name].pop())
    return out
