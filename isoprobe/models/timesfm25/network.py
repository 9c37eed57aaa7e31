"""TimesFM 2.5's network (Google 2025; official code: the ``timesfm`` package 3.x,
``timesfm/timesfm_2p5/timesfm_2p5_torch.py`` and ``timesfm/torch/``), isoprobe's own
implementation.

A decoder-only transformer over input patches of ``p`` steps:

- the tokenizer, a residual block ``W_o silu(W_h z + b_h) + b_o + W_r z + b_r`` of a patch's
  ``p`` normalised values (0 where missing) and its ``p`` missing-step indicators, ``z`` [2p];
- blocks of multi-head self-attention and a SiLU feed-forward, each sub-layer between two
  RMSNorms (``x + post(f(pre(x)))``; RMSNorm ``s * x / sqrt(mean(x^2) + 1e-6)``). The attention
  has one fused q/k/v projection and no biases; rotary positions on q and k, then an RMSNorm of
  each head's q and k, then q scaled per dimension by ``1.442695041 softplus(s_d) / sqrt(d_head)``
  (and no further ``1/sqrt(d_head)``). A patch without an observed value is hidden as a key; a
  query that sees no key (a padding patch) gets the zero vector, as the official fused kernel
  gives it. Positions count the visible patches before (a patch's index minus the hidden
  patches before it, the official ``arange - num_masked`` for left padding);
- no final norm: two residual output projections of the last block's stream, the point head
  (``output_patch_len`` x channels) and the quantile head (``output_quantile_len`` x channels).

Scratch weights are PyTorch's default linear initialisation with norm scales 1 (the package
initialises them to 0, which would start every block as the identity with no gradient into it)
and per-dimension query scales 0 (``1.442695041 softplus(0) = 1``: the usual ``1/sqrt(d_head)``).

The submodules carry the official attribute names, so the state dict has the published
tensor names (``stacked_xf.3.attn.qkv_proj.weight``, ``output_projection_point.hidden_layer
.weight``), except that a block's two feed-forward layers sit in one submodule ``ff`` (the
official block holds ``ff0`` and ``ff1`` itself): :func:`official_name` and
:func:`isoprobe_name` translate.
"""

from __future__ import annotations

import math
import re

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from isoprobe.models.kv_cache import KeyValueCache
from isoprobe.models.timesfm25.config import TimesFm25Shape

#: RMSNorm's epsilon and the official ``1 / ln 2`` of the per-dimension query scale
EPSILON, LOG2_E = 1e-6, 1.442695041
#: the standard deviation below which a patch's running scale counts as 0 (official revin)
SCALE_TOLERANCE = 1e-6
#: the longest wavelength of the rotary positions
MAX_TIMESCALE = 10000.0


_OFFICIAL_FF = re.compile(r"^(stacked_xf\.\d+\.)(ff[01]\.)")
_ISOPROBE_FF = re.compile(r"^(stacked_xf\.\d+\.)ff\.(ff[01]\.)")


def official_name(name: str) -> str:
    """A state-dict name of :class:`TimesFm25Network` -> the published one."""
    return _ISOPROBE_FF.sub(r"\1\2", name)


def isoprobe_name(name: str) -> str:
    """A published state-dict name -> :class:`TimesFm25Network`'s."""
    return _OFFICIAL_FF.sub(r"\1ff.\2", name)


class RMSNorm(nn.Module):
    """``scale * x / sqrt(mean(x^2) + eps)`` over the last axis."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(width))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPSILON) * self.scale


class ResidualBlock(nn.Module):
    """``output(silu(hidden(x))) + residual(x)``: the tokenizer and both output projections."""

    def __init__(self, inputs: int, hidden: int, outputs: int, bias: bool) -> None:
        super().__init__()
        self.hidden_layer = nn.Linear(inputs, hidden, bias=bias)
        self.output_layer = nn.Linear(hidden, outputs, bias=bias)
        self.residual_layer = nn.Linear(inputs, outputs, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.output_layer(F.silu(self.hidden_layer(x))) + self.residual_layer(x)


def rotate(x: Tensor, positions: Tensor) -> Tensor:
    """Rotary positions on [B, N, heads, d]: the halves (a, b) of each head become
    ``(a cos - b sin, b cos + a sin)`` at angle ``position / 10000^(2i/d)``."""
    half = x.shape[-1] // 2
    exponents = 2 * torch.arange(half, device=x.device) / x.shape[-1]
    angles = positions[..., None, None].float() / MAX_TIMESCALE**exponents
    cos, sin = angles.cos(), angles.sin()
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


class QueryScale(nn.Module):
    """The learned per-dimension query scale ``1.442695041 softplus(s) / sqrt(d_head)``."""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.per_dim_scale = nn.Parameter(torch.zeros(head_dim))

    def forward(self, q: Tensor) -> Tensor:
        return q * (LOG2_E / math.sqrt(q.shape[-1]) * F.softplus(self.per_dim_scale))


class Attention(nn.Module):
    """Causal self-attention over patches (module docstring); returns the output after ``out``."""

    def __init__(self, shape: TimesFm25Shape) -> None:
        super().__init__()
        width = shape.model_dims
        self.heads, self.head_dim = shape.num_heads, shape.head_dim
        self.qkv_proj = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width, bias=False)
        self.query_ln = RMSNorm(self.head_dim)
        self.key_ln = RMSNorm(self.head_dim)
        self.per_dim_scale = QueryScale(self.head_dim)

    def forward(
        self,
        x: Tensor,
        visible: Tensor,
        positions: Tensor,
        cache: KeyValueCache | None = None,
    ) -> Tensor:
        """``x`` [B, N, d]; ``visible`` [B, N] (a patch is a key); ``positions`` [B, N]. With
        a ``cache``, ``x`` and ``positions`` are the patches after the cached ones, whose keys
        and values it reads and extends, and ``visible`` covers them all."""
        batch, length, width = x.shape
        q, k, v = self.qkv_proj(x).view(batch, length, 3, self.heads, self.head_dim).unbind(2)
        q = self.per_dim_scale(self.query_ln(rotate(q, positions)))
        k = self.key_ln(rotate(k, positions))
        start = 0
        if cache is not None:
            start = cache.tokens
            k, v = cache.extend(self, k, v, dim=1)
        causal = torch.ones(length, start + length, dtype=torch.bool, device=x.device)
        allowed = causal.tril(start) & visible[:, None, :]
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k)
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        sees = allowed.any(-1)[:, None, :, None]
        weights = torch.softmax(scores.masked_fill(~sees, 0.0), dim=-1) * sees
        mixed = torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, length, width)
        return self.out(mixed)


class FeedForward(nn.Module):
    """``ff1(silu(ff0(x)))``, no biases."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.ff0 = nn.Linear(width, hidden, bias=False)
        self.ff1 = nn.Linear(hidden, width, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.ff1(F.silu(self.ff0(x)))


class Block(nn.Module):
    """``y = x + post_attn(attn(pre_attn(x)))``, then ``y + post_ff(ff1(silu(ff0(pre_ff(y)))))``."""

    def __init__(self, shape: TimesFm25Shape) -> None:
        super().__init__()
        width = shape.model_dims
        self.pre_attn_ln = RMSNorm(width)
        self.attn = Attention(shape)
        self.post_attn_ln = RMSNorm(width)
        self.pre_ff_ln = RMSNorm(width)
        self.ff = FeedForward(width, shape.hidden_dims)
        self.post_ff_ln = RMSNorm(width)

    def forward(
        self,
        x: Tensor,
        visible: Tensor,
        positions: Tensor,
        cache: KeyValueCache | None = None,
    ) -> Tensor:
        x = x + self.post_attn_ln(self.attn(self.pre_attn_ln(x), visible, positions, cache))
        return x + self.post_ff_ln(self.ff(self.pre_ff_ln(x)))


class TimesFm25Network(nn.Module):
    """Tokenizer, blocks and the two output projections (the official module's weights)."""

    def __init__(self, shape: TimesFm25Shape) -> None:
        super().__init__()
        self.shape = shape
        width, patch = shape.model_dims, shape.input_patch_len
        self.tokenizer = ResidualBlock(2 * patch, width, width, bias=True)
        self.stacked_xf = nn.ModuleList(Block(shape) for _ in range(shape.num_layers))
        self.output_projection_point = ResidualBlock(
            width, width, shape.output_patch_len * shape.channels, bias=False
        )
        self.output_projection_quantiles = ResidualBlock(
            width, width, shape.output_quantile_len * shape.channels, bias=False
        )

    def forward(
        self,
        values: Tensor,
        missing: Tensor,
        last_only: bool = False,
        cache: KeyValueCache | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Normalised patches ``values`` [B, N, p] (0 where missing) and ``missing`` [B, N, p]
        -> the last block's stream [B, N, d], the point head [B, N, o, channels] and the
        quantile head [B, N, os, channels], in each patch's normalised units; ``last_only``:
        the heads of the last patch alone (N = 1 in theirs: all a forecast reads). With a
        ``cache`` (a forecast's roll-out), the patches it holds are not run again: the stream
        and the heads are those of the patches after them, which it then holds too. That is
        exact: a patch's normalisation (running statistics), position (visible patches before
        it) and attention (causal) read nothing after it."""
        visible = ~missing.all(dim=-1)
        positions = visible.long().cumsum(dim=-1) - 1
        start = 0 if cache is None else cache.tokens
        values, missing, positions = values[:, start:], missing[:, start:], positions[:, start:]
        x = self.tokenizer(torch.cat([values, missing.to(values.dtype)], dim=-1))
        for block in self.stacked_xf:
            x = block(x, visible, positions, cache)
        if cache is not None:
            cache.tokens += x.shape[1]
        ends = x[:, -1:] if last_only else x
        batch, length, _ = ends.shape
        point = self.output_projection_point(ends).view(batch, length, -1, self.shape.channels)
        spread = self.output_projection_quantiles(ends).view(batch, length, -1, self.shape.channels)
        return x, point, spread


def running_statistics(values: Tensor, missing: Tensor) -> tuple[Tensor, Tensor]:
    """Each patch's mean and (population) standard deviation [B, N] of the observed values of
    it and every patch before it, built one patch at a time by Chan et al.'s pairwise update
    (count n, mean m, variance v merged with a patch's n', m', v':
    ``m'' = (n m + n' m') / (n + n')``, ``v'' = (n v + n' v' + n (m - m'')^2 + n' (m' - m'')^2)
    / (n + n')``), the official running statistics; 0 and 0 before the first observed value."""
    observed = (~missing).to(values.dtype)
    count = values.new_zeros(values.shape[0])
    mean, variance = torch.zeros_like(count), torch.zeros_like(count)
    means, deviations = [], []
    for i in range(values.shape[1]):
        n = observed[:, i].sum(-1)
        n_safe = n.clamp_min(1.0)
        patch_mean = (values[:, i] * observed[:, i]).sum(-1) / n_safe
        patch_variance = ((values[:, i] - patch_mean[:, None]) ** 2 * observed[:, i]).sum(-1)
        patch_variance = patch_variance / n_safe
        total = count + n
        total_safe = total.clamp_min(1.0)
        merged = (count * mean + n * patch_mean) / total_safe
        variance = (
            count * variance
            + n * patch_variance
            + count * (mean - merged) ** 2
            + n * (patch_mean - merged) ** 2
        ) / total_safe
        count, mean = total, merged
        means.append(mean)
        deviations.append(variance.clamp_min(0.0).sqrt())
    return torch.stack(means, dim=1), torch.stack(deviations, dim=1)


def normalise(x: Tensor, mean: Tensor, deviation: Tensor) -> Tensor:
    """``(x - mean) / deviation``, dividing by 1 where the deviation is below 1e-6 (official
    ``revin``); ``mean``/``deviation`` broadcast over ``x``'s trailing axes."""
    return (x - mean) / torch.where(deviation < SCALE_TOLERANCE, 1.0, deviation)


def denormalise(x: Tensor, mean: Tensor, deviation: Tensor) -> Tensor:
    """``x * deviation + mean`` (official ``revin(reverse=True)``, which does not clamp)."""
    return x * deviation + mean
