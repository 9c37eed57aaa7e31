"""isoprobe's Hydra sweeper (``hydra/sweeper=grids``). Hydra finds sweepers only under the
``hydra_plugins`` namespace package, so the class lives here."""

from hydra_plugins.isoprobe_sweepers.grids import GridsSweeper

__all__ = ["GridsSweeper"]
