"""When the probe runs: a schedule in epochs or in optimizer steps, and the time of one probe.

- **In epochs** (the default): before the first training step (epoch 0, step 0), then after
  every ``every_n_epochs``-th training epoch, after that epoch's validation.
- **In steps**: before the first training step, then after every ``every_n_steps``-th optimizer
  step, or at ``log_spaced_steps`` points between step 0 and the last step of the fit (spaced
  evenly in log(step), as studies of training dynamics space their checkpoints; the last step
  is ``trainer.estimated_stepping_batches``). Rounding to whole steps can merge early points, so
  a short run gets fewer than asked. A schedule in steps does not probe at epoch ends.

Every probe is labelled with both its epoch (epochs completed when it ran) and its step
(``global_step``): :class:`ProbeTime`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ProbeTime:
    """One probe: ``epoch`` (training epochs completed) and ``step`` (optimizer steps taken);
    ``by_steps``: the schedule counts steps, so several probes may share an epoch."""

    epoch: int
    step: int
    by_steps: bool = False

    @property
    def label(self) -> str:
        """What names this probe's files: ``epoch<e>``, or ``step<s>`` in a schedule in steps."""
        return f"step{self.step}" if self.by_steps else f"epoch{self.epoch}"

    @property
    def title(self) -> str:
        """How a picture's title names this probe: ``epoch <e>``, or ``step <s>``."""
        return f"step {self.step}" if self.by_steps else f"epoch {self.epoch}"


@functools.lru_cache(maxsize=32)
def log_spaced_steps(points: int, last_step: int) -> frozenset[int]:
    """Step 0 and ``points - 1`` steps from 1 to ``last_step`` spaced evenly in log(step),
    rounded (merged where rounding makes two equal)."""
    if points < 2:
        raise ValueError(
            f"log_spaced_steps needs at least 2 points (step 0 and the last), got {points}"
        )
    if last_step < 1:
        return frozenset({0})
    spaced = np.rint(np.geomspace(1, last_step, points - 1)).astype(int)
    return frozenset({0, *spaced.tolist()})


@dataclass(frozen=True)
class Schedule:
    """When to probe (module docstring): ``every_n_epochs``, or ``every_n_steps``, or
    ``log_spaced_steps`` points; at most one of the two in steps."""

    every_n_epochs: int = 1
    every_n_steps: int | None = None
    log_spaced_steps: int | None = None

    def __post_init__(self) -> None:
        if self.every_n_epochs < 1:
            raise ValueError(f"every_n_epochs must be >= 1, got {self.every_n_epochs}")
        if self.every_n_steps is not None and self.every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1 or null, got {self.every_n_steps}")
        if self.log_spaced_steps is not None and self.log_spaced_steps < 2:
            raise ValueError(
                f"log_spaced_steps must be >= 2 (step 0 and the last) or null, got "
                f"{self.log_spaced_steps}"
            )
        if self.every_n_steps is not None and self.log_spaced_steps is not None:
            raise ValueError(
                "every_n_steps and log_spaced_steps are two schedules in steps: set one, the "
                "other null"
            )

    @property
    def by_steps(self) -> bool:
        return self.every_n_steps is not None or self.log_spaced_steps is not None

    def after_epoch(self, epoch: int) -> bool:
        """Whether to probe after training epoch ``epoch`` (counted from 1)."""
        return not self.by_steps and epoch % self.every_n_epochs == 0

    def after_step(self, step: int, last_step: float) -> bool:
        """Whether to probe after optimizer step ``step`` of a fit of ``last_step`` steps."""
        if self.every_n_steps is not None:
            return step % self.every_n_steps == 0
        if self.log_spaced_steps is not None:
            if not math.isfinite(last_step):
                raise ValueError(
                    "log_spaced_steps needs the fit's last step: set trainer.max_steps or "
                    "trainer.max_epochs"
                )
            return step in log_spaced_steps(self.log_spaced_steps, int(last_step))
        return False
