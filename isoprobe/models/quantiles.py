"""Quantile forecasts at the levels a model predicts, mapped to the levels a run asks for."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import torch
from torch import Tensor


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
