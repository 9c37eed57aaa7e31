"""Singular values and numerical rank (rank-structure paper, eq. 1)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from isoprobe.metrics.registry import MetricInfo, describe_metric, register_measure


def singular_values(M: Tensor) -> Tensor:
    """Singular values of the matrix ``M`` in float64, descending."""
    if not isinstance(M, Tensor):
        M = torch.as_tensor(M)
    if M.dim() != 2:
        raise ValueError(f"expected a 2-D matrix, got shape {tuple(M.shape)}")
    return torch.linalg.svdvals(M.to(torch.float64))


def rank_from_singular_values(sigma: Tensor, eps: float) -> int:
    """Count of sigma_i / sigma_1 >= eps for descending ``sigma``; 0 for the zero matrix."""
    if not 0 < eps <= 1:
        raise ValueError(f"eps must lie in (0, 1], got {eps}")
    if sigma.numel() == 0 or float(sigma[0]) <= 0:
        return 0
    return int((sigma / sigma[0] >= eps).sum())


def epsilon_rank(M: Tensor, eps: float) -> int:
    """epsilon-rank (rank-structure paper eq. 1, as its authors' code): the number of singular
    values of ``M`` at least ``eps`` times the largest."""
    return rank_from_singular_values(singular_values(M), eps)


#: the rank probe's metrics of attention projection weights (:func:`rank_metric` with a
#: projection): they depend on the weights alone, not on the data the probe reads
WEIGHT_RANK_METRIC = re.compile(r"^rank_[a-z]+_eps[0-9.e+-]+$")
#: the ε-rank of the probe's tokens (:func:`rank_metric` without a projection)
TOKEN_RANK_PREFIX = "rank_uncentred_eps"
TOKEN_RANK_METRIC = re.compile(rf"{TOKEN_RANK_PREFIX}([0-9.e+-]+)")

describe_metric(TOKEN_RANK_METRIC.pattern, MetricInfo(direction=1), pattern=True)
#: the flow of ranks at the paper's middle ε in the run's summary table
describe_metric(f"{TOKEN_RANK_PREFIX}0.01", MetricInfo(direction=1, summary=True))
#: the width of a layer's tokens (their dimension), beside its ε-ranks: the most a rank can be
TOKEN_WIDTH = "width"
describe_metric(TOKEN_WIDTH, MetricInfo(bookkeeping=True))


def rank_metric(eps: float, projection: str | None = None) -> str:
    """The metric name of an ε-rank: ``rank_uncentred_eps0.01`` (tokens, not centred),
    ``rank_q_eps0.01`` (the weights of projection ``q``)."""
    if projection is None:
        return f"{TOKEN_RANK_PREFIX}{eps:g}"
    return f"rank_{projection}_eps{eps:g}"


def token_rank_epsilon(metric: str) -> float | None:
    """The ε of a token ε-rank's metric name (``rank_uncentred_eps0.01`` -> 0.01), else None."""
    found = TOKEN_RANK_METRIC.fullmatch(metric)
    return float(found.group(1)) if found else None


def is_weight_metric(metric: str) -> bool:
    """Whether ``metric`` measures weights alone (an ε-rank of a projection), so that runs
    which share their weights share its value whatever data they read."""
    return bool(WEIGHT_RANK_METRIC.match(metric)) and not metric.startswith(TOKEN_RANK_PREFIX)


#: the paper's relative thresholds ε
DEFAULT_EPSILONS = (1e-3, 1e-2, 1e-1)


@dataclass(frozen=True)
class RankOptions:
    """The ε-ranks' parameter: ``epsilons``, the relative thresholds ε (each in (0, 1]), kept
    sorted and distinct."""

    epsilons: tuple[float, ...] = DEFAULT_EPSILONS

    def __post_init__(self) -> None:
        bad = [eps for eps in self.epsilons if not 0 < float(eps) <= 1]
        if not self.epsilons or bad:
            raise ValueError(f"epsilons must be values in (0, 1], got {list(self.epsilons)}")
        object.__setattr__(self, "epsilons", tuple(sorted({float(e) for e in self.epsilons})))


@register_measure(
    "attention_rank",
    kind="weights",
    params=RankOptions,
    prepare=singular_values,
    key_pattern=r"rank_[a-z]+_eps[0-9.e+-]+",
    info=MetricInfo(direction=1),
)
def attention_rank(spectra: Mapping[str, Tensor], options: RankOptions) -> dict[str, float]:
    """``rank_<p>_eps<ε>``: the ε-rank of each projection p of one attention block, from its
    singular values (eq. 1), for every ε."""
    return {
        rank_metric(eps, p): float(rank_from_singular_values(sigma, eps))
        for p, sigma in spectra.items()
        for eps in options.epsilons
    }
