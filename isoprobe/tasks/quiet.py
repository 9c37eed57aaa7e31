"""Keep three lines out of every run's output that say nothing about the run.

- Lightning's tip advertising its cloud logger (logged at INFO when a trainer has no LitLogger);
- ``torch.utils._pytree``'s ``FutureWarning`` that ``isinstance(treespec, LeafSpec)`` is
  deprecated, raised by Lightning's own ``_pytree`` helper at every loop (not by isoprobe);
- the model summary's ``Total FLOPs: 0``: Lightning counts FLOPs only for a model with an
  ``example_input_array``, which a forecaster's batch dict is not. The summary is off in
  ``configs/trainer/default.yaml`` (``enable_model_summary``); the run logs its trainable and
  total parameter counts instead.
"""

from __future__ import annotations

import logging
import warnings

#: the logger through which Lightning's ``rank_zero_info`` prints its tip
LIGHTNING_INFO_LOGGER = "lightning.pytorch.utilities.rank_zero"
TIP_PREFIX = "💡 Tip:"


class _NoTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(TIP_PREFIX)


def quiet_lightning() -> None:
    """Drop Lightning's tip and its ``_pytree`` deprecation warning (idempotent)."""
    logger = logging.getLogger(LIGHTNING_INFO_LOGGER)
    if not any(isinstance(f, _NoTips) for f in logger.filters):
        logger.addFilter(_NoTips())
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
    )
