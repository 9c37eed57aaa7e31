"""SimilarityProbe: where in depth the representations change, by linear CKA
(:func:`isoprobe.metrics.linear_cka`, Kornblith et al. 2019; ``debiased``: Song et al.'s
unbiased HSIC, as Nguyen et al. 2021) on the fixed probe set.

Two-token-set measures, on the rows the hub collects (the same tokens, row for row, every
epoch, since the probe set, the masks and the subsample seed are fixed):

- ``cka_drift`` of every probed layer: 1 - CKA(tokens now, tokens at epoch 0), the layer
  against itself before fine-tuning. 0 = unchanged up to an orthogonal map, a scale and a
  shift (exactly 0 for a layer whose weights and inputs do not change: ``model.adapt=head_only``);
  1 = nothing linear in common. The epoch-0 tokens are kept (and checkpointed, so a resumed
  run measures against the same reference); a run that did not probe epoch 0 has no drift.
- ``cka_prev``: CKA of a layer with the layer probed just before it on the same tokens (the
  previous block of its stack, ``embed`` before the first), high where blocks are redundant.
- layer against layer: every pair of probed layers that read the same tokens (a stack's
  layers, with ``embed`` for the first stack), drawn as ``cka_layers/epoch<e>.png`` (W&B:
  ``similarity/cka_layers``) and written to ``cka_layers.csv`` (epoch, layer_a, layer_b, cka)
  at every probe.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from isoprobe.callbacks.hub import Collected
from isoprobe.callbacks.measurement import Measurement, Row
from isoprobe.callbacks.plots import save_similarity_heatmap
from isoprobe.callbacks.probe import Probe
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from isoprobe.metrics.similarity import CkaSide, cka_of_sides

HEATMAP_DIR = "cka_layers"
PAIRS_CSV = "cka_layers.csv"
ERROR_METRIC = "error"


@dataclass
class _Matrix:
    """Layer-against-layer CKA of one epoch (NaN where two layers read other tokens)."""

    layers: list[str]
    values: np.ndarray


class SimilarityProbe(Probe):
    """Drift from epoch 0 and layer-against-layer similarity by linear CKA (module docstring).

    Args:
        drift: measure ``cka_drift`` (keeps the epoch-0 tokens of every probed layer in memory
            and in the checkpoint: N x D float32 each).
        layer_pairs: measure ``cka_prev`` and the layer-against-layer matrix.
        debiased: the debiased CKA (for few tokens against wide layers).
        name, csv_name, trajectory_png, log_prefix: as :class:`Probe`, defaults
            ``similarity``, ``similarity_metrics.csv``, ``similarity_trajectories.png``,
            ``similarity``.
        **probe: the :class:`Probe` settings (schedule, probe set, tokens, site, output).
    """

    def __init__(
        self,
        drift: bool = True,
        layer_pairs: bool = True,
        debiased: bool = False,
        name: str = "similarity",
        csv_name: str = "similarity_metrics.csv",
        trajectory_png: str = "similarity_trajectories.png",
        log_prefix: str = "similarity",
        **probe: Any,
    ) -> None:
        super().__init__(name, csv_name, trajectory_png, log_prefix, **probe)
        if not (drift or layer_pairs):
            raise ValueError(
                "SimilarityProbe with drift=false and layer_pairs=false measures nothing; leave "
                "it out of the callbacks instead"
            )
        self.drift = bool(drift)
        self.layer_pairs = bool(layer_pairs)
        self.debiased = bool(debiased)
        self._reference: dict[str, Tensor] = {}
        self._matrices: dict[int, _Matrix] = {}

    def measure(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        tokens: dict[str, Tensor] | None,
        epoch: int,
    ) -> Measurement:
        rows: list[Row] = []
        sides: dict[str, CkaSide] = {}
        for layer, X in tokens.items():
            try:
                sides[layer] = CkaSide.of(X, name=f"{layer}'s tokens")
            except ValueError as err:
                rank_zero_warn(f"SimilarityProbe: {layer} at epoch {epoch} not measured: {err}")
                rows.append(Row(layer, ERROR_METRIC, math.nan, str(err)))
        if self.drift and epoch == 0:
            self._reference = {
                layer: X.detach().float().cpu().clone() for layer, X in tokens.items()
            }
        if self.drift:
            rows += self._drift_rows(sides)
        matrix = None
        if self.layer_pairs:
            matrix = self._matrices[epoch] = self._pairs(sides)
            rows += _previous_rows(matrix)
        return Measurement(rows, matrix)

    def _drift_rows(self, sides: dict[str, CkaSide]) -> list[Row]:
        rows = []
        for layer, side in sides.items():
            reference = self._reference.get(layer)
            if reference is None or reference.shape != side.centred.shape:
                continue
            before = CkaSide.of(reference.to(side.centred.device))
            rows.append(Row(layer, "cka_drift", 1.0 - cka_of_sides(side, before, self.debiased)))
        return rows

    def _pairs(self, sides: dict[str, CkaSide]) -> _Matrix:
        layers = list(sides)
        values = np.full((len(layers), len(layers)), math.nan)
        groups = _token_groups(layers)
        for i, a in enumerate(layers):
            for j in range(i, len(layers)):
                b = layers[j]
                if groups[a] == groups[b] and sides[a].n == sides[b].n:
                    value = 1.0 if i == j else cka_of_sides(sides[a], sides[b], self.debiased)
                    values[i, j] = values[j, i] = value
        return _Matrix(layers, values)

    def save_artefacts(self, directory: Path, epoch: int, measurement: Measurement) -> None:
        matrix: _Matrix | None = measurement.artefacts
        if matrix is not None and matrix.layers:
            save_similarity_heatmap(
                directory / HEATMAP_DIR / f"epoch{epoch}.png",
                matrix.layers,
                matrix.values,
                f"linear CKA, layer against layer, epoch {epoch}",
            )

    def take(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        collected: Collected | None,
        epoch: int,
        step: int,
        pass_seconds: float,
    ) -> None:
        super().take(trainer, pl_module, collected, epoch, step, pass_seconds)
        if trainer.is_global_zero and self.layer_pairs:
            self._write_pairs()

    def _write_pairs(self) -> None:
        """Every probed epoch's layer pairs so far (the file is rewritten whole)."""
        path = self.output_path / PAIRS_CSV
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["epoch", "layer_a", "layer_b", "cka"])
            for epoch, matrix in sorted(self._matrices.items()):
                for i, a in enumerate(matrix.layers):
                    for j, b in enumerate(matrix.layers):
                        if not math.isnan(matrix.values[i, j]):
                            writer.writerow([epoch, a, b, repr(float(matrix.values[i, j]))])

    def wandb_media(self, epoch: int, measurement: Measurement) -> dict[str, Any]:
        import wandb

        return {
            key: wandb.Image(str(path))
            for key, path in self.figure_paths(epoch).items()
            if path.is_file()
        }

    def figure_paths(self, epoch: int) -> dict[str, Path]:
        return {
            f"{self.log_prefix}/cka_layers": self.output_path / HEATMAP_DIR / f"epoch{epoch}.png"
        }

    def state_dict(self) -> dict[str, Any]:
        matrices = {e: (m.layers, m.values.tolist()) for e, m in self._matrices.items()}
        return {**super().state_dict(), "reference": dict(self._reference), "matrices": matrices}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        if self._saved_at is None:  # saved weights probed outside fit keep no trajectory
            self._reference = dict(state_dict.get("reference", {}))
            self._matrices = {
                int(e): _Matrix(list(layers), np.asarray(values, dtype=float))
                for e, (layers, values) in state_dict.get("matrices", {}).items()
            }


def _token_groups(layers: list[str]) -> dict[str, str]:
    """Layer -> the tokens it reads: its stack (``encoder``, ``decoder``), ``embed`` with the
    first stack probed after it (a stack's layers share their mask, hence their rows)."""
    stacks = [layer.split(".", 1)[0] for layer in layers]
    first = next((stack for stack in stacks if stack != "embed"), "embed")
    return {
        layer: first if stack == "embed" else stack
        for layer, stack in zip(layers, stacks, strict=True)
    }


def _previous_rows(matrix: _Matrix) -> list[Row]:
    rows = []
    for i in range(1, len(matrix.layers)):
        value = matrix.values[i, i - 1]
        if not math.isnan(value):
            rows.append(Row(matrix.layers[i], "cka_prev", float(value)))
    return rows
