"""The finite-step guard: a step whose gradients are not finite changes nothing, and too many in a row
end the run with the last checkpoint intact.

One bad step (a NaN in the loss, a reward whose advantage overflows float32) would otherwise turn
every weight NaN in one optimiser step, publish it to every replica and checkpoint it, and ``keepLast``
would prune the last good checkpoint a few saves later. The learner makes no optimiser step for a pass
whose global gradient norm is not finite (:meth:`~.learner.Learner.update`, as verl skips such a step);
this module counts the steps where that happened and stops the run after
``trainer.maxNonFiniteSteps`` of them in a row, a rate at which training is not learning anything.
"""

from __future__ import annotations

import logging

__all__ = ["NonFiniteTraining", "NonFiniteWeights", "NonFiniteSteps"]

log = logging.getLogger(__name__)


class NonFiniteWeights(RuntimeError):
    """The policy's weights stopped being finite: the step is neither published nor checkpointed."""


class NonFiniteTraining(RuntimeError):
    """Too many steps in a row had no finite gradient: the run ends, its checkpoints as they were."""


class NonFiniteSteps:
    """Counts the steps in a row whose every optimiser step was skipped for a non-finite gradient norm."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"trainer.maxNonFiniteSteps must be >= 1, got {limit}")
        self.limit = limit
        self.in_a_row = 0
        self.total = 0

    def observe(self, step: int, skipped: int, passes: int, last_checkpoint: int | None) -> None:
        """Record step ``step``, of whose ``passes`` optimiser steps ``skipped`` were skipped; raises
        :class:`NonFiniteTraining` at the limit."""
        if skipped <= 0:
            self.in_a_row = 0
            return
        self.total += 1
        if skipped < passes:  # the step changed the weights: training goes on
            self.in_a_row = 0
            log.warning("step %d: %d of %d optimiser steps skipped (gradient norm not finite)", step, skipped, passes)
            return
        self.in_a_row += 1
        log.warning("step %d skipped: the gradient norm is not finite (%d in a row, the limit is "
                    "trainer.maxNonFiniteSteps=%d); the weights are those of the step before", step,
                    self.in_a_row, self.limit)
        if self.in_a_row >= self.limit:
            kept = f"the latest checkpoint (step {last_checkpoint}) is intact" if last_checkpoint is not None \
                else "no checkpoint was written"
            raise NonFiniteTraining(
                f"{self.in_a_row} steps in a row (up to step {step}) had a gradient norm that is not finite and "
                f"were skipped (trainer.maxNonFiniteSteps={self.limit}); {kept}. Look for rewards out of scale "
                "(an evaluator's rewardRange), a learning rate too high, or a loss that overflows")
