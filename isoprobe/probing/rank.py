"""The rank measures: the rank structure of every layer over training (the rank-structure paper).

Per probed layer, ``n_tokens`` and ``width`` (the tokens' dimension, the most their rank can
be); and two kinds of rows, for every ε in ``epsilons`` (the ε-rank, paper eq. 1: the number
of singular values at least ε times the largest, :func:`isoprobe.metrics.epsilon_rank`):

- ``rank_uncentred_eps<ε>`` of every probed layer: the ε-rank of the matrix of its collected
  tokens ([N, D], not centred: the rank of the tokens themselves, which the paper's flow of
  ranks counts; the isotropy probe's ``eps_rank_centred`` is the rank of their spread around
  the mean, and the two can differ widely). A block's output is the next block's input, so the
  ``embed`` row is the first block's embedded input and ``encoder.<i>`` the input of block
  i + 1: the flow-of-ranks of the representations (paper §4). The tokens come from the probe's one
  collection pass (:mod:`isoprobe.probing.callback`), which the other measures read too.
- ``rank_<p>_eps<ε>`` for each attention projection p in q, k, v, o of every block (the model's
  ``attention_weights()``, fused projections split): the flow-of-ranks of the weights (paper
  figures 5 and 6); the same for each decoder block's cross-attention (the model's
  ``cross_attention_weights()``), layer ``<block>.cross``.

Pictures (output directory and W&B; ``<label>``: ``epoch<e>``, or ``step<s>`` in a schedule in
steps): ``flow_of_ranks/<label>.png`` (ε-rank against layer, one
line per ε, a panel for the inputs, one per projection and, for an encoder-decoder, one per
cross-attention projection), ``spectra/<label>.png`` (every probed layer's normalised singular
values σ_i / σ_1, paper figure 2a); W&B also gets each projection's singular values as a
histogram every probe (``rank/spectrum/<block>.<p>``, ``rank/spectrum/<block>.cross.<p>``, paper
appendix G.2) and ``rank_trajectories.png`` at the end of fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import wandb
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from isoprobe.metrics.rank import (
    DEFAULT_EPSILONS,
    TOKEN_WIDTH,
    RankOptions,
    rank_from_singular_values,
    rank_metric,
    singular_values,
)
from isoprobe.metrics.registry import MEASURES
from isoprobe.models.base import ATTENTION_PROJECTIONS, CROSS_SUFFIX
from isoprobe.probing.measure_kinds import ERROR_METRIC, not_applicable, prepared_projections
from isoprobe.probing.measure_set import MeasureSet, ProbeInputs
from isoprobe.probing.measurement import Measurement, Row
from isoprobe.probing.plots import save_flow_of_ranks, save_spectra
from isoprobe.probing.schedule import ProbeTime

FLOW_DIR = "flow_of_ranks"
SPECTRA_DIR = "spectra"


@dataclass
class _Spectra:
    """Singular values (float64, descending) of one probe: by layer, by block and projection
    (self-attention), by ``<block>.cross`` and projection (cross-attention)."""

    tokens: dict[str, Tensor]
    weights: dict[str, dict[str, Tensor]]
    epsilons: tuple[float, ...]
    cross: dict[str, dict[str, Tensor]] = field(default_factory=dict)


class RankMeasures(MeasureSet):
    """ε-ranks of every layer's representations and attention projections (module docstring).

    Args:
        epsilons: the relative thresholds ε of the ranks (the paper's 1e-3, 1e-2, 1e-1).
        weights: also measure the attention projections (the model's ``attention_weights()``
            and ``cross_attention_weights()``).
    """

    output = "rank"

    def __init__(
        self,
        epsilons: list[float] | tuple[float, ...] = DEFAULT_EPSILONS,
        weights: bool = True,
    ) -> None:
        self.options = RankOptions(tuple(epsilons))
        self.epsilons = self.options.epsilons
        self.weights = bool(weights)

    def measure(self, inputs: ProbeInputs) -> Measurement:
        when, pl_module = inputs.when, inputs.model
        rows: list[Row] = []
        token_spectra: dict[str, Tensor] = {}
        for layer, X in inputs.tokens.items():
            sigma = _spectrum_or_error_row(X, layer, f"{layer}'s tokens", when.title, rows)
            if sigma is None:
                continue
            token_spectra[layer] = sigma
            rows.append(Row(layer, "n_tokens", float(X.shape[0])))
            rows.append(Row(layer, TOKEN_WIDTH, float(X.shape[1])))
            rows += [
                Row(layer, rank_metric(eps), float(rank_from_singular_values(sigma, eps)))
                for eps in self.epsilons
            ]
        weight_spectra: dict[str, dict[str, Tensor]] = {}
        cross_spectra: dict[str, dict[str, Tensor]] = {}
        if self.weights and not getattr(pl_module, "attends", True):
            rows.append(not_applicable(MEASURES["attention_rank"], pl_module))
        elif self.weights:
            # the registered weights measure, on the singular values it prepares, which the
            # pictures draw too
            measure = MEASURES["attention_rank"]
            for block, spectra in prepared_projections(
                measure, pl_module, when.title, rows
            ).items():
                values = measure(spectra, params=self.options)
                rows += [Row(block, key, value) for key, value in values.items()]
                by_block = cross_spectra if block.endswith(CROSS_SUFFIX) else weight_spectra
                by_block[block] = spectra
        spectra = _Spectra(token_spectra, weight_spectra, self.epsilons, cross_spectra)
        return Measurement(rows, spectra)

    def save_artefacts(self, directory: Path, when: ProbeTime, artefacts: Any) -> None:
        spectra: _Spectra = artefacts
        save_flow_of_ranks(
            directory / FLOW_DIR / f"{when.label}.png",
            _flow(spectra),
            f"flow-of-ranks, {when.title}",
        )
        save_spectra(
            directory / SPECTRA_DIR / f"{when.label}.png",
            {layer: sigma.cpu().numpy() for layer, sigma in spectra.tokens.items()},
            f"normalised singular values of the probed tokens, {when.title}",
        )

    def wandb_media(
        self, prefix: str, directory: Path, when: ProbeTime, artefacts: Any
    ) -> dict[str, Any]:
        spectra: _Spectra = artefacts
        media: dict[str, Any] = {
            f"{prefix}/spectrum/{block}.{p}": wandb.Histogram(sigma.cpu().numpy())
            for block, by_projection in {**spectra.weights, **spectra.cross}.items()
            for p, sigma in by_projection.items()
        }
        for key, path in self.figure_paths(prefix, directory, when).items():
            if path.is_file():
                media[key] = wandb.Image(str(path))
        return media

    def figure_paths(self, prefix: str, directory: Path, when: ProbeTime) -> dict[str, Path]:
        return {
            f"{prefix}/{key}": directory / folder / f"{when.label}.png"
            for key, folder in (("flow_of_ranks", FLOW_DIR), ("spectra", SPECTRA_DIR))
        }


def _spectrum_or_error_row(
    M: Tensor, layer: str, what: str, when: str, rows: list[Row]
) -> Tensor | None:
    """The singular values of ``M``, or None after appending an ``error`` row for ``layer``
    that says why they cannot be computed (non-finite entries: diverged weights or tokens;
    an SVD that does not converge). A probe never stops a run."""
    non_finite = int((~torch.isfinite(M)).sum())
    if non_finite:
        reason = f"{non_finite} of {M.numel()} entries of {what} are NaN or inf"
    else:
        try:
            return singular_values(M)
        except torch.linalg.LinAlgError as err:
            reason = f"the SVD of {what} failed: {err}"
    rank_zero_warn(f"rank measures: {layer} at {when} not measured: {reason}")
    rows.append(Row(layer, ERROR_METRIC, math.nan, reason))
    return None


def _flow(spectra: _Spectra) -> dict[str, dict[float, list[tuple[str, int]]]]:
    """panel (``input``, a projection, or ``cross <p>`` for a cross-attention projection) ->
    ε -> [(layer, ε-rank)] in the model's layer order."""
    panels: dict[str, dict[float, list[tuple[str, int]]]] = {}
    if spectra.tokens:
        panels["input"] = {
            eps: [(layer, rank_from_singular_values(s, eps)) for layer, s in spectra.tokens.items()]
            for eps in spectra.epsilons
        }
    for prefix, by_block in (("", spectra.weights), ("cross ", spectra.cross)):
        for p in ATTENTION_PROJECTIONS:
            if by_block:
                panels[f"{prefix}{p}"] = {
                    eps: [
                        (block, rank_from_singular_values(by_p[p], eps))
                        for block, by_p in by_block.items()
                        if p in by_p
                    ]
                    for eps in spectra.epsilons
                }
    return panels
