"""The readout measures (``readout`` in ``callbacks.probe.measures``): how much of the
forecast each layer already holds, and how fine-tuning moves that depth
(:func:`isoprobe.metrics.readout.ridge_readout`).

Model-agnostic through the contract: the probe's collection pass hands these measures each
probe window's mean real token per probed layer (``token_masks``, the positions the other
measures read). The
target is the window's horizon scaled by the mean absolute observed value of its context (the
mean scaling of Chronos; scale 1 where that is 0), so windows of different levels make one
regression. The first ``train_fraction`` of the probe windows (in probe-set order) fit a ridge
readout per layer and the rest score it; windows with a missing target value or without a real
token are left out. Rows per layer: ``readout_nmse`` (test NMSE, isoprobe's definition) and
``readout_skill`` (1 - NMSE / the NMSE of predicting the training windows' mean horizon: 0 is
chance, 1 exact); NaN with the reason in ``note`` where too few windows are left.
"""

from __future__ import annotations

from isoprobe.metrics.readout import ReadoutOptions
from isoprobe.metrics.registry import MEASURES
from isoprobe.probing.measure_kinds import WindowsMeasures


class ReadoutMeasures(WindowsMeasures):
    """A ridge readout of the scaled horizon from every probed layer (module docstring): the
    registered windows measure ``readout`` (:func:`isoprobe.metrics.readout.readout`).

    Args:
        train_fraction: the share of probe windows the readout is fitted on (the first ones).
    """

    def __init__(self, train_fraction: float = 0.5) -> None:
        super().__init__([(MEASURES["readout"], ReadoutOptions(float(train_fraction)))])
