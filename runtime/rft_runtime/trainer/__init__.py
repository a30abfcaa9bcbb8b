"""The trainer role: learner numerics, checkpoints, weight publication and the step loop.

* The runtime config (`--config FILE`) is :mod:`rft_api.runtime`, parsed once by :mod:`.main`.
* :mod:`.batch` — episodes → padded tensors; :mod:`.signals` — rewards → advantages, statistics.
* :mod:`.learner` — log-probs, micro-batched update with the global normaliser, AdamW, schedule.
* :mod:`.checkpoint` / :mod:`.state` — atomic checkpoints and what they hold.
* :mod:`.publisher` — weights to inference (`/update_weights_from_disk`), verified.
* :mod:`.trainer` — :class:`Trainer`, one step at a time, wiring its collaborators: :mod:`.feed` (tasks
  in, groups out), :mod:`.publication` (each version to inference, in the background or not),
  :mod:`.evaluation` (held-out scores), :mod:`.report` (progress, metrics, trackers) and
  :mod:`.shutdown` (signals, outcome, telling workers); :mod:`.main` — `rft trainer`.
"""

from .checkpoint import CheckpointError, CheckpointManager, ResumeError

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "ResumeError",
]
