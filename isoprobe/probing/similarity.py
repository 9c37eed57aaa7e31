"""The CKA measures (``cka`` in ``callbacks.probe.measures``), of two token sets on the same
rows: where in depth the representations change, by
linear CKA (:func:`isoprobe.metrics.linear_cka`, Kornblith et al. 2019; ``debiased``: Song et
al.'s unbiased HSIC, as Nguyen et al. 2021), on the rows the probe collects (the same tokens, row
for row, every epoch: the probe set, the masks and the subsample seed are fixed).

- ``cka_drift`` of every probed layer: 1 - CKA(tokens now, tokens at epoch 0), the layer
  against itself before fine-tuning (its tokens at step 0). 0 = unchanged up to an orthogonal
  map, an isotropic scale and a shift (exactly 0 for a layer whose weights and inputs do not
  change, e.g. every layer of PatchTST under ``model.adapt=head_only``); 1 = nothing linear in
  common. The epoch-0
  tokens are kept, in memory and in the checkpoint (so a resumed run measures against the same
  reference); a run that did not probe epoch 0 has no drift.
- ``cka_prev``: CKA of a layer with the layer probed just before it on the same tokens (the
  previous block of its stack, ``embed`` before the first): near 1 where blocks are redundant.
- layer against layer: every pair of probed layers that read the same tokens (a stack's
  layers, with ``embed`` for the first stack), drawn as ``cka_layers/<label>.png`` (W&B:
  ``<prefix>/cka_layers``) on the figure schedule and written to ``cka_layers.csv`` (epoch,
  layer_a, layer_b, cka, global_step) at every probe.

A layer whose tokens cannot be measured (non-finite, too few) has no rows here: the probe's
``error`` row for it says why.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import wandb

from isoprobe.metrics.registry import MEASURES
from isoprobe.metrics.similarity import CKA_DRIFT, CKA_PREV, CkaOptions, CkaSide, cka_of_sides
from isoprobe.probing.measure_kinds import PairMeasures, token_groups
from isoprobe.probing.measure_set import ProbeInputs
from isoprobe.probing.measurement import Measurement
from isoprobe.probing.plots import save_similarity_heatmap
from isoprobe.probing.schedule import ProbeTime

HEATMAP_DIR = "cka_layers"
PAIRS_CSV = "cka_layers.csv"


@dataclass
class LayerMatrix:
    """Layer-against-layer CKA of one probe (NaN where two layers read other tokens)."""

    layers: list[str]
    values: np.ndarray
    epoch: int = 0


class SimilarityMeasures(PairMeasures):
    """Drift from step 0 and layer-against-layer CKA (module docstring): the registered pair
    measures ``cka_drift`` and ``cka_prev`` (:mod:`isoprobe.metrics.similarity`), and the
    matrix.

    Args:
        drift: measure ``cka_drift`` (keeps every probed layer's step-0 tokens, N x D float32).
        layer_pairs: measure ``cka_prev`` and the layer-against-layer matrix.
        debiased: the debiased CKA (for few tokens against wide layers).
    """

    def __init__(self, drift: bool = True, layer_pairs: bool = True, debiased: bool = False):
        if not (drift or layer_pairs):
            raise ValueError(
                "cka with drift=false and layer_pairs=false measures nothing; leave cka out "
                "of callbacks.probe.measures instead"
            )
        self.options = CkaOptions(bool(debiased))
        chosen = [name for name, on in ((CKA_DRIFT, drift), (CKA_PREV, layer_pairs)) if on]
        super().__init__([(MEASURES[name], self.options) for name in chosen])
        self.layer_pairs = bool(layer_pairs)
        #: by step
        self.matrices: dict[int, LayerMatrix] = {}

    def measure(self, inputs: ProbeInputs) -> Measurement:
        """The rows of one probe, with its layer-against-layer matrix (None without pairs)."""
        prepared_now: dict = {}
        rows = self.rows(inputs, prepared_now)
        matrix = None
        if self.layer_pairs:
            sides = self.prepared(MEASURES[CKA_PREV], inputs.tokens, prepared_now)
            matrix = self.matrices[inputs.when.step] = self._pairs(sides, inputs.when.epoch)
        return Measurement(rows, matrix)

    def _pairs(self, sides: dict[str, CkaSide], epoch: int) -> LayerMatrix:
        layers = list(sides)
        values = np.full((len(layers), len(layers)), math.nan)
        groups = token_groups(layers)
        for i, a in enumerate(layers):
            for j in range(i, len(layers)):
                b = layers[j]
                if groups[a] == groups[b] and sides[a].n == sides[b].n:
                    value = (
                        1.0 if i == j else cka_of_sides(sides[a], sides[b], self.options.debiased)
                    )
                    values[i, j] = values[j, i] = value
        return LayerMatrix(layers, values, epoch)

    def save_artefacts(self, directory: Path, when: ProbeTime, artefacts: Any) -> None:
        """The heatmap of the layer-against-layer matrix, its title naming the probe."""
        matrix: LayerMatrix | None = artefacts
        if matrix is not None and matrix.layers:
            title = f"linear CKA, layer against layer, {when.title}"
            path = directory / HEATMAP_DIR / f"{when.label}.png"
            save_similarity_heatmap(path, matrix.layers, matrix.values, title)

    def figure_paths(self, prefix: str, directory: Path, when: ProbeTime) -> dict[str, Path]:
        if not self.layer_pairs:
            return {}
        return {f"{prefix}/cka_layers": directory / HEATMAP_DIR / f"{when.label}.png"}

    def wandb_media(
        self, prefix: str, directory: Path, when: ProbeTime, artefacts: Any
    ) -> dict[str, Any]:
        paths = self.figure_paths(prefix, directory, when).items()
        return {key: wandb.Image(str(path)) for key, path in paths if path.is_file()}

    def write_files(self, directory: Path) -> None:
        """Every probe's layer pairs so far in ``cka_layers.csv`` (rewritten whole)."""
        if self.layer_pairs:
            self._write_pairs(directory / PAIRS_CSV)

    def _write_pairs(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["epoch", "layer_a", "layer_b", "cka", "global_step"])
            for step, matrix in sorted(self.matrices.items()):
                for i, a in enumerate(matrix.layers):
                    for j, b in enumerate(matrix.layers):
                        if not math.isnan(matrix.values[i, j]):
                            value = repr(float(matrix.values[i, j]))
                            writer.writerow([matrix.epoch, a, b, value, step])

    def state_dict(self) -> dict[str, Any]:
        matrices = {s: (m.layers, m.values.tolist(), m.epoch) for s, m in self.matrices.items()}
        return {**super().state_dict(), "matrices": matrices}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.matrices = {
            int(step): LayerMatrix(list(saved[0]), np.asarray(saved[1], dtype=float), saved[-1])
            for step, saved in state.get("matrices", {}).items()
        }
