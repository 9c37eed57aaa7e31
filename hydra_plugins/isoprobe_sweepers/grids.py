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
from hydra.errors import CompactHydraException, OverrideParseException

#: how a grid is written, for the messages that refuse a malformed one
GRID_FORM = "a mapping of key: comma-separated values, e.g. {model: chronos, seed: '1,2'}"


class GridError(CompactHydraException, ValueError):
    """A malformed entry of ``hydra.sweeper.grids`` (Hydra prints its message alone)."""


class GridsSweeper(BasicSweeper):
    """``hydra/sweeper=grids``: the basic sweeper over the union of ``grids``."""

    def __init__(
        self,
        grids: Sequence[Mapping[str, Any]] | None = None,
        max_batch_size: int | None = None,
        params: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, params=dict(params or {}))
        self.grids = [checked_grid(i, grid) for i, grid in enumerate(grids or [{}])]

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
    for index, grid in enumerate(grids):
        try:
            grid_overrides = parser.parse_overrides([f"{k}={v}" for k, v in grid.items()])
        except OverrideParseException as err:
            raise GridError(
                f"hydra.sweeper.grids[{index}] = {dict(grid)} does not parse ({err.message}): "
                f"each grid is {GRID_FORM}"
            ) from None
        (expanded,) = BasicSweeper.split_arguments([*grid_overrides, *overrides], None)
        jobs += [job for job in expanded if job not in jobs]
    return jobs


def checked_grid(index: int, grid: Any) -> dict[str, Any]:
    """Grid ``index`` of ``hydra.sweeper.grids`` as a dict, refused in one message naming it
    when it is not a mapping of keys to one value or a comma-separated string of values."""
    if not isinstance(grid, Mapping):
        raise GridError(
            f"hydra.sweeper.grids[{index}] = {grid!r} is not a grid: each is {GRID_FORM}"
        )
    for key, value in grid.items():
        if not isinstance(value, (str, int, float, bool)) and value is not None:
            raise GridError(
                f"hydra.sweeper.grids[{index}].{key} = {value!r}: a grid's values are one "
                f"comma-separated string ({key}: '{','.join(map(str, _listed(value)))}'); "
                f"each grid is {GRID_FORM}"
            )
    return dict(grid)


def _listed(value: Any) -> list[Any]:
    return list(value) if isinstance(value, Sequence) and not isinstance(value, str) else [value]
