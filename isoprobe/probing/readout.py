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

import math
from collections.abc import Sequence

import torch
from torch import Tensor
from torch.utils.data import Dataset

from isoprobe.metrics.readout import READOUT_NMSE, READOUT_SKILL, ridge_readout
from isoprobe.probing.measure_set import MeasureSet, ProbeInputs
from isoprobe.probing.measurement import Measurement, Row


def scaled_horizon(context: Tensor, target: Tensor) -> Tensor:
    """``target`` [H] divided by the mean absolute observed value of ``context`` [C] (1 where
    that is 0 or nothing is observed), float64."""
    observed = context[torch.isfinite(context)].abs()
    scale = float(observed.mean()) if observed.numel() else 0.0
    return target.double() / (scale if scale > 0 else 1.0)


class ReadoutMeasures(MeasureSet):
    """A ridge readout of the scaled horizon from every probed layer (module docstring).

    Args:
        train_fraction: the share of probe windows the readout is fitted on (the first ones).
    """

    def __init__(self, train_fraction: float = 0.5) -> None:
        if not 0 < train_fraction < 1:
            raise ValueError(
                f"readout.train_fraction must lie in (0, 1) (the rest of the windows score the "
                f"readout), got {train_fraction}"
            )
        self.train_fraction = float(train_fraction)
        self._targets: tuple[tuple[int, ...], Tensor] | None = None

    def targets(self, dataset: Dataset, windows: Sequence[int]) -> Tensor:
        """[windows, H] scaled horizons of the probe set (read once: the set is fixed)."""
        key = tuple(windows)
        if self._targets is None or self._targets[0] != key:
            items = [dataset[i] for i in key]
            horizons = [scaled_horizon(item["context"], item["target"]) for item in items]
            self._targets = (key, torch.stack(horizons))
        return self._targets[1]

    output = "isotropy"
    pools_windows = True

    def measure(self, inputs: ProbeInputs) -> Measurement:
        targets = self.targets(inputs.dataset, inputs.windows)
        return Measurement(self.rows(inputs.window_means, targets))

    def rows(self, window_means: dict[str, Tensor], targets: Tensor) -> list[Row]:
        """The readout rows of every layer of ``window_means`` against ``targets``."""
        n_train = math.ceil(self.train_fraction * len(targets))
        rows: list[Row] = []
        for layer, pooled in window_means.items():
            features = pooled.double().cpu()
            usable = torch.isfinite(targets).all(dim=1) & torch.isfinite(features).all(dim=1)
            train, test = usable.clone(), usable.clone()
            train[n_train:], test[:n_train] = False, False
            try:
                readout = ridge_readout(
                    features[train], targets[train], features[test], targets[test]
                )
            except ValueError as err:
                rows += [Row(layer, m, math.nan, str(err)) for m in (READOUT_NMSE, READOUT_SKILL)]
                continue
            rows += [
                Row(layer, READOUT_NMSE, readout.nmse),
                Row(layer, READOUT_SKILL, readout.skill),
            ]
        return rows
