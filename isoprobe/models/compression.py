"""Attention compression by truncated SVD (the rank-structure paper, section 5 and table 2).

Each attention projection ``y = x W^T + b`` (``W`` [out, in]) is truncated at its ε-rank r: with
``W = U Σ V^T`` and the r singular values ``σ_i >= ε σ_1`` kept, ``W_r = U_r Σ_r V_r^T``. The
error of the layer is bounded by the first dropped singular value:
``||x (W - W_r)^T|| <= σ_{r+1} ||x||`` per row. Which matrices, and how ``W_r`` is stored:

- ``attention="all"`` truncates every self-attention and every cross-attention projection
  (``attention_weights()`` and ``cross_attention_weights()``), as the paper's code does;
  ``"self"`` the self-attention ones only.
- Where the factors are smaller (``r (in + out) < in x out``), ``W_r`` becomes two thin layers,
  ``down = Σ_r^{1/2} V_r^T`` [r, in] and ``up = U_r Σ_r^{1/2}`` [out, r] (status ``factored``):
  fewer weights and multiply-adds. Where they are not, ``only_if_smaller=False`` (the paper's
  rule) still truncates, and stores ``W_r`` as one dense layer of the original shape (status
  ``truncated``): the same function as the factors, at the dense layer's cost, which is lower
  than the factors' there; ``only_if_smaller=True`` leaves ``W`` as it is (``kept``). A
  projection at full ε-rank (nothing to drop) is always ``kept``.

The projections are found through the model contract: the weight tensor names each one, and the
``nn.Linear`` that owns that very tensor is the module replaced. A projection whose weight is a
view of a fused matrix (GPT-2's ``c_attn``, a fused QKV) has no module of its own and is left as
it is (reported as ``fused``).

How a compressed model is saved and loaded again: :mod:`isoprobe.models.compression_files`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from isoprobe.metrics.rank import rank_from_singular_values

#: which attention :func:`compress_attention` truncates: self-attention, or self and cross
ATTENTION_CHOICES = ("self", "all")


class FactoredLinear(nn.Module):
    """``up(down(x))``: a rank-``rank`` linear layer [in -> rank -> out] (bias on ``up``)."""

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool) -> None:
        super().__init__()
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        self.down = nn.Linear(in_features, rank, bias=False)
        self.up = nn.Linear(rank, out_features, bias=bias)

    @property
    def weight(self) -> Tensor:
        """The [out, in] matrix the layer applies (for readers such as the rank probe)."""
        return self.up.weight @ self.down.weight

    @property
    def bias(self) -> Tensor | None:
        return self.up.bias

    def forward(self, x: Tensor) -> Tensor:
        return self.up(self.down(x))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}"


def factorise(
    linear: nn.Linear,
    eps: float | None,
    rank: int | None = None,
    always: bool = False,
    only_if_smaller: bool = True,
) -> tuple[nn.Module, int]:
    """The truncated SVD of ``linear`` at relative threshold ``eps`` (or at a fixed ``rank``),
    and that rank: a :class:`FactoredLinear` where the factors are smaller than the matrix (or
    ``always``); elsewhere ``linear`` itself if ``only_if_smaller``, else a dense ``nn.Linear``
    holding the rank-r product. ``linear`` itself at full rank (nothing to truncate)."""
    weight = linear.weight.detach()
    U, S, Vh = torch.linalg.svd(weight.double(), full_matrices=False)
    if rank is None:
        rank = max(1, rank_from_singular_values(S, eps))
    rank = min(rank, len(S))
    out_features, in_features = weight.shape
    smaller = rank * (in_features + out_features) < in_features * out_features
    if not always and (rank == len(S) or (not smaller and only_if_smaller)):
        return linear, rank
    root = S[:rank].sqrt()
    down, up = root[:, None] * Vh[:rank], U[:, :rank] * root
    if not (always or smaller):
        return _dense(linear, up @ down), rank
    factored = FactoredLinear(in_features, out_features, rank, linear.bias is not None)
    factored.to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        factored.down.weight.copy_(down.to(weight.dtype))
        factored.up.weight.copy_(up.to(weight.dtype))
        if linear.bias is not None:
            factored.up.bias.copy_(linear.bias)
    return factored, rank


def _dense(linear: nn.Linear, weight: Tensor) -> nn.Linear:
    """An ``nn.Linear`` like ``linear`` (shape, bias, device, dtype) applying ``weight``."""
    dense = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
    dense.to(device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        dense.weight.copy_(weight.to(linear.weight.dtype))
        if linear.bias is not None:
            dense.bias.copy_(linear.bias)
    return dense


@dataclass(frozen=True)
class ProjectionReport:
    """One projection: its block, which attention (``self`` or ``cross``), module path, shape,
    kept rank and status: ``factored`` (two thin layers), ``truncated`` (the dense rank-r
    product: the factors would not be smaller), ``kept`` (as it was: at full rank, or not
    smaller with ``only_if_smaller``) or ``fused`` (no module of its own)."""

    block: str
    projection: str
    module: str
    out_features: int
    in_features: int
    rank: int
    status: str
    attention: str = "self"


def linear_owners(model: nn.Module) -> dict[int, tuple[str, nn.Linear]]:
    """``id`` of each ``nn.Linear``'s weight -> (module path, that layer): which module applies a
    projection that ``attention_weights()`` names."""
    return {
        id(module.weight): (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
    }


def set_module(model: nn.Module, path: str, module: nn.Module) -> None:
    """Put ``module`` at ``path`` (``encoder.block.0.layer.0.SelfAttention.q``) in ``model``."""
    parent_path, _, attr = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, attr, module)


def check_attention_choice(attention: str) -> None:
    if attention not in ATTENTION_CHOICES:
        raise ValueError(
            f"compress.attention must be one of {list(ATTENTION_CHOICES)} (self: self-attention "
            f"only; all: self- and cross-attention, the paper's rule), got {attention!r}"
        )


def attention_matrices(
    model: nn.Module, attention: str = "all"
) -> list[tuple[str, str, dict[str, Tensor]]]:
    """(block, ``self`` or ``cross``, {q, k, v, o} -> weight) for every attention of ``model``
    (a ForecastModule) that ``attention`` (:data:`ATTENTION_CHOICES`) selects: its
    ``attention_weights()``, then, with ``all``, its ``cross_attention_weights()``."""
    check_attention_choice(attention)
    if not getattr(model, "attends", True):
        raise ValueError(
            f"compressing attention does not apply to {type(model).__name__}: its blocks are "
            "recurrent, with no attention projections to truncate"
        )
    found = [(block, "self", parts) for block, parts in model.attention_weights().items()]
    if attention == "all":
        found += [
            (block, "cross", parts) for block, parts in model.cross_attention_weights().items()
        ]
    return found


def compress_attention(
    model: nn.Module,
    eps: float | dict[str, float],
    attention: str = "all",
    only_if_smaller: bool = False,
) -> list[ProjectionReport]:
    """Truncate the attention projections of ``model`` (a ForecastModule) at their ε-rank, in
    place. ``eps`` is one threshold, or block name -> threshold (a block left out keeps its
    projections; a decoder block's cross-attention takes the block's threshold). The defaults,
    every attention matrix truncated whether or not the factors are smaller, are the paper's
    rule (module docstring)."""

    def threshold(block: str, weight: Tensor) -> tuple[float | None, None]:
        return (eps.get(block) if isinstance(eps, dict) else eps), None

    return _replace_projections(model, threshold, attention, only_if_smaller=only_if_smaller)


def _status(linear: nn.Linear, replacement: nn.Module) -> str:
    if replacement is linear:
        return "kept"
    return "factored" if isinstance(replacement, FactoredLinear) else "truncated"


def _replace_projections(
    model: nn.Module,
    setting,
    attention: str,
    always: bool = False,
    only_if_smaller: bool = True,
) -> list[ProjectionReport]:
    """Truncate each projection of :func:`attention_matrices` at ``setting(block, weight)`` =
    (eps, rank); (None, None) keeps it."""
    owners = linear_owners(model)
    reports = []
    for block, kind, projections in attention_matrices(model, attention):
        for part, weight in projections.items():
            eps, rank = setting(block, weight)
            owner = owners.get(id(weight))
            out_features, in_features = weight.shape
            if owner is None or (eps is None and rank is None):
                status = "fused" if owner is None else "kept"
                reports.append(
                    ProjectionReport(
                        block, part, "", out_features, in_features, min(weight.shape), status, kind
                    )
                )
                continue
            path, linear = owner
            replacement, kept = factorise(linear, eps, rank, always, only_if_smaller)
            if replacement is not linear:
                set_module(model, path, replacement)
            reports.append(
                ProjectionReport(
                    block,
                    part,
                    path,
                    out_features,
                    in_features,
                    kept,
                    _status(linear, replacement),
                    kind,
                )
            )
    model.compression = reports
    return reports


def flow_of_ranks_schedule(num_layers: int, r_first: int, r_last: int, alpha: float) -> list[int]:
    """Rank-structure paper appendix K: the rank of layer l = 1..D,
    ``r_l = r_1 + (r_D - r_1) ((l - 1) / (D - 1))^alpha`` (rounded; ``r_1`` for one layer):
    small in early layers, growing with depth as the representations' rank does."""
    if num_layers < 1 or r_first < 1 or r_last < 1 or alpha < 0:
        raise ValueError(
            f"the schedule needs num_layers, r_first, r_last >= 1 and alpha >= 0; got "
            f"{num_layers}, {r_first}, {r_last}, {alpha}"
        )
    if num_layers == 1:
        return [r_first]
    return [
        round(r_first + (r_last - r_first) * (layer / (num_layers - 1)) ** alpha)
        for layer in range(num_layers)
    ]


def _stacks(model: nn.Module) -> dict[str, list[str]]:
    """Stack name (``encoder``, ``decoder``: the block name before its index) -> its blocks in
    order, from ``attention_weights()``."""
    stacks: dict[str, list[str]] = {}
    for block in model.attention_weights():
        stacks.setdefault(block.rpartition(".")[0], []).append(block)
    return stacks


def depth_scaled_eps(model: nn.Module, eps: float, early_factor: float) -> dict[str, float]:
    """Block -> threshold: ``eps * early_factor`` at the first block of each stack, falling
    geometrically to ``eps`` at the last, so early layers, whose inputs have the lowest rank
    (flow-of-ranks), are compressed harder (capped below 1)."""
    thresholds = {}
    for blocks in _stacks(model).values():
        last = max(1, len(blocks) - 1)
        for i, block in enumerate(blocks):
            thresholds[block] = min(0.999, eps * early_factor ** ((last - i) / last))
    return thresholds


def low_rank_attention(
    model: nn.Module, r_first: int = 16, r_last: int | None = None, alpha: float = 0.5
) -> list[ProjectionReport]:
    """Parameterise every self-attention projection of ``model`` as rank-r_l factors (the
    truncated SVD of its current weights, e.g. a random init), in place, with
    :func:`flow_of_ranks_schedule` over the blocks of each stack (``encoder``, ``decoder``: the
    name before the block index); ``r_last`` None = half the projection's smaller side (the
    paper's d / 2). Every projection is factored, even where the factors are no smaller than
    the matrix (r (in + out) >= in x out). Cross-attention keeps its dense projections."""
    ranks: dict[str, int] = {}
    for blocks in _stacks(model).values():
        first = next(iter(model.attention_weights()[blocks[0]].values()))
        last = r_last if r_last is not None else max(1, min(first.shape) // 2)
        schedule = flow_of_ranks_schedule(len(blocks), r_first, last, alpha)
        ranks.update(zip(blocks, schedule, strict=True))
    return _replace_projections(model, lambda block, _: (None, ranks[block]), "self", always=True)


def factor_at_rank_fraction(
    model: nn.Module, fraction: float, attention: str = "all"
) -> list[ProjectionReport]:
    """Every attention projection (of :func:`attention_matrices`) factored at ``fraction`` of
    its full rank, whatever its spectrum (to time a shape, e.g. an official size with random
    weights)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"the rank fraction must lie in (0, 1], got {fraction}")

    def rank(block: str, weight: Tensor) -> tuple[None, int]:
        return None, max(1, int(fraction * min(weight.shape)))

    return _replace_projections(model, rank, attention, always=True)


def attention_sizes(reports: list[ProjectionReport]) -> tuple[int, int]:
    """(weights of the projections before, after): ``out x in`` each, ``rank (in + out)`` for a
    factored one (a ``truncated`` one keeps its dense shape)."""
    before = sum(r.out_features * r.in_features for r in reports)
    after = sum(
        r.rank * (r.in_features + r.out_features)
        if r.status == "factored"
        else r.out_features * r.in_features
        for r in reports
    )
    return before, after
