"""Quantile forecasts at the levels a model predicts, mapped to the levels a run asks for."""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn


def interpolation_matrix(levels: Sequence[float], grid: Sequence[float]) -> Tensor:
    """[len(levels), len(grid)] weights of piecewise-linear interpolation between the quantile
    levels ``grid`` (ascending): a level between ``grid[i]`` and ``grid[i+1]`` weighs them
    ``1 - w`` and ``w`` with ``w = (level - grid[i]) / (grid[i+1] - grid[i])``; a level on the
    grid takes that quantile exactly; a level outside takes the nearest end."""
    weights = torch.zeros(len(levels), len(grid))
    for row, level in enumerate(levels):
        if level <= grid[0]:
            weights[row, 0] = 1.0
        elif level >= grid[-1]:
            weights[row, -1] = 1.0
        else:
            i = bisect.bisect_right(grid, level) - 1
            w = (level - grid[i]) / (grid[i + 1] - grid[i])
            weights[row, i], weights[row, i + 1] = 1.0 - w, w
    return weights


def is_evenly_spaced(grid: Sequence[float], tolerance: float = 1e-6) -> bool:
    """True when ``grid`` is ``1/(Q+1), 2/(Q+1), ..., Q/(Q+1)`` for its Q levels (the official
    Chronos-Bolt 0.1 .. 0.9): the levels that, with 0 and 1 added, are equally spaced."""
    step = 1.0 / (len(grid) + 1)
    return all(abs(level - (i + 1) * step) <= tolerance for i, level in enumerate(grid))


def quantiles_of_padded_heads(heads: Tensor, levels: Sequence[float]) -> Tensor:
    """[B, L, H]: ``ChronosBoltPipeline.predict_quantiles``' rule for levels off the model's grid.

    The Q quantile heads ``heads`` [B, Q, H], the first and the last repeated, are read as a
    sample of Q + 2 values per step, whose linear empirical quantiles (``torch.quantile``) are
    taken at ``levels``: the values are sorted, and the i-th smallest stands at level
    i / (Q + 1). Where the grid is evenly spaced (:func:`is_evenly_spaced`) and the heads do not
    cross, this is :func:`interpolation_matrix`'s interpolation, flat beyond the ends, to float
    rounding; where heads cross, it sorts them, the repeated ends included."""
    padded = torch.cat([heads[:, :1], heads, heads[:, -1:]], dim=1)
    at = torch.tensor(levels, dtype=heads.dtype, device=heads.device)
    return torch.quantile(padded, at, dim=1).transpose(0, 1)


def register_level_weights(
    module: nn.Module, native: Iterable[float], model_name: str, median: bool = True
) -> tuple[float, ...]:
    """Map a model's native quantile levels ``native`` (ascending) to the levels
    ``module.quantile_levels`` a run asks for: registers the non-persistent buffer
    ``level_weights`` (:func:`interpolation_matrix` of those levels on the grid) and, with
    ``median``, ``median_weights`` (the 0.5 level's row), and warns, on the logger of the
    module's own file, of levels outside the grid (they take the nearest end). Returns the grid
    as a tuple of floats."""
    grid = tuple(float(q) for q in native)
    outside = [q for q in module.quantile_levels if not grid[0] <= q <= grid[-1]]
    if outside:
        logging.getLogger(type(module).__module__).warning(
            "quantile levels %s lie outside %s's %s: they take the nearest end.",
            outside,
            model_name,
            grid,
        )
    module.register_buffer(
        "level_weights", interpolation_matrix(module.quantile_levels, grid), persistent=False
    )
    if median:
        module.register_buffer(
            "median_weights", interpolation_matrix((0.5,), grid)[0], persistent=False
        )
    return grid
