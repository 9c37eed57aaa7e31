"""A sweep over the union of several grids, in one multirun.

Hydra's basic sweeper runs one Cartesian product. A study whose arms sweep different settings
(the isotropy paper's context-length figures: Chronos-T5 on the synthetic sets at 500 and 100
steps, Lag-Llama on the real sets at 144 and 96) is a union of products, which one product
cannot express without running the arms' cross terms too. ``hydra/sweeper=grids`` takes a list
of grids, each a ``key: comma-separated values`` mapping like ``hydra.sweeper.params``:

.. code-block:: yaml

    defaults:
      - override /hydra/sweeper: grids
    hydra:
      sweeper:
        grids:
          - {model: chronos, data.context_length: "500,100"}
          - {model: lag_llama, data.context_length: "144,96"}

Every grid is expanded as the basic sweeper expands ``params``; ``hydra.sweeper.params`` and
then the command line's overrides apply to every grid and win over a grid's own value of the
same key. A job that two grids both produce runs once. The jobs are numbered in grid order, so
the sweep directory reads grid by grid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override


class GridsSweeper(BasicSweeper):
    """``hydra/sweeper=grids``: the basic sweeper over the union of ``grids``."""

    def __init__(
        self,
        grids: Sequence[Mapping[str, Any]] | None = None,
        max_batch_size: int | None = None,
        params: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, params=dict(params or {}))
        self.grids = [dict(grid) for grid in grids or [{}]]

    def split_arguments(  # type: ignore[override]
        self, overrides: list[Override], max_batch_size: int | None
    ) -> list[list[list[str]]]:
        """The jobs of every grid, ``overrides`` (params and command line) applied to each,
        without repeats, in batches of ``max_batch_size``."""
        assert self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        jobs = grid_jobs(parser, self.grids, overrides)
        return list(BasicSweeper.split_overrides_to_chunks(jobs, max_batch_size))


def grid_jobs(
    parser: OverridesParser, grids: Sequence[Mapping[str, Any]], overrides: list[Override]
) -> list[list[str]]:
    """Every job of the union of ``grids`` (each job its list of ``key=value``), in the order
    they are numbered, with ``overrides`` applied to every grid and repeats run once; with
    ``grids=[{}]`` the jobs of Hydra's basic sweeper over ``overrides``."""
    jobs: list[list[str]] = []
    for grid in grids:
        grid_overrides = parser.parse_overrides([f"{k}={v}" for k, v in grid.items()])
        (expanded,) = BasicSweeper.split_arguments([*grid_overrides, *overrides], None)
        jobs += [job for job in expanded if job not in jobs]
    return jobs
