"""The coordinator (contract 4 in docs/architecture.md): trainer ↔ rollout workers over HTTP.

* :mod:`.core` — the pure state machine (tasks, leases, groups, staleness, counters).
* :mod:`.service` — thread-safe wrapper; the trainer blocks on it for complete groups.
* :mod:`.http` / :mod:`.server` — the aiohttp API, served from a thread of the trainer process.

The rollout side (client, scoring, the rollout loop) lives in :mod:`rft_runtime.rollout`.
"""

from .core import COUNTER_NAMES, Coordinator, CoordinatorConfig, CoordinatorError, EpisodeLimits, Group
from .service import CollectTimeout, CoordinatorService

__all__ = [
    "COUNTER_NAMES",
    "CollectTimeout",
    "Coordinator",
    "CoordinatorConfig",
    "CoordinatorError",
    "CoordinatorService",
    "EpisodeLimits",
    "Group",
]
