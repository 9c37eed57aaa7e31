"""The Lag-Llama network (Rasul et al., 2023), used by :mod:`isoprobe.models.lag_llama.module`.

A LLaMA-style decoder-only transformer (RMSNorm, rotary position embeddings, causal
self-attention, SwiGLU MLP) reads one token per time step; a Student-t head gives the next value's
distribution. Also the official lag set (:func:`official_lags`) and the window scaler
(:func:`window_scale`).

Module and parameter names follow the official ``LagLlamaModel`` (``transformer.wte``,
``transformer.h.<i>.{rms_1,attn.{q_proj,kv_proj,c_proj},rms_2,mlp.{c_fc1,c_fc2,c_proj}}``,
``transformer.ln_f``, ``param_proj.proj.<j>``), so the official checkpoint's ``model.*`` keys map
one to one.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: the frequencies whose gluonts lag sets the official checkpoint was trained with
OFFICIAL_LAG_FREQUENCIES = ("Q", "M", "W", "D", "h", "min", "s")
SCALINGS = ("mean", "robust", "none")
NUM_TIME_FEATURES = 6


def _require_gluonts():
    try:
        import gluonts.torch.util as util
        from gluonts.time_feature import get_lags_for_frequency
    except ImportError as err:
        raise ImportError(
            "model=lag_llama needs gluonts for its lag features: pip install 'gluonts[torch]'"
        ) from err
    return get_lags_for_frequency, util.lagged_sequence_values


@functools.cache
def official_lags() -> tuple[int, ...]:
    """The official lag indices (0-based, so index 0 is the current step): the sorted union of
    gluonts' lags for every frequency Lag-Llama was trained on, each minus one."""
    get_lags_for_frequency, _ = _require_gluonts()
    union: set[int] = set()
    with warnings.catch_warnings():  # pandas' renamed aliases (QE, ME): the same offsets
        warnings.simplefilter("ignore", FutureWarning)
        for freq in OFFICIAL_LAG_FREQUENCIES:
            union.update(get_lags_for_frequency(freq_str=freq, num_default_lags=1))
    return tuple(sorted(lag - 1 for lag in union))


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * scale``, the mean taken in float32."""

    def __init__(self, size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        mean_square = x.float().pow(2).mean(dim=-1, keepdim=True)
        return (self.scale * (x * torch.rsqrt(mean_square + self.eps))).type_as(x)


def rotate(x: Tensor, positions: Tensor, base: float) -> Tensor:
    """Rotary position embedding of ``x`` [B, H, T, d]: the two halves of every head's vector
    form (x1, x2) pairs rotated by angle ``position * base^(-2i/d)``."""
    dim = x.shape[-1]
    inverse = base ** (-torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim)
    angles = positions.float()[:, None] * inverse[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)
    first, second = x[..., : dim // 2], x[..., dim // 2 :]
    return x * cos + torch.cat([-second, first], dim=-1) * sin


class KeyValueCache:
    """One block's keys and values [N, H, capacity, d] for sequences decoded a step at a time,
    filled up to ``length``: each step writes its key and value in place (no copy of the past)."""

    def __init__(self, keys: Tensor, values: Tensor, capacity: int, repeats: int) -> None:
        rows, heads, self.length, dim = keys.shape
        shape = (rows * repeats, heads, capacity, dim)
        self.keys, self.values = keys.new_empty(shape), values.new_empty(shape)
        self.keys[:, :, : self.length] = keys.repeat_interleave(repeats, 0)
        self.values[:, :, : self.length] = values.repeat_interleave(repeats, 0)

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new positions' keys and values; the keys and values of every position."""
        end = self.length + keys.shape[2]
        self.keys[:, :, self.length : end], self.values[:, :, self.length : end] = keys, values
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a separate query and a fused key/value projection."""

    def __init__(self, width: int, heads: int, rope_base: float) -> None:
        super().__init__()
        self.heads, self.rope_base = heads, rope_base
        self.q_proj = nn.Linear(width, width, bias=False)
        self.kv_proj = nn.Linear(width, 2 * width, bias=False)
        self.c_proj = nn.Linear(width, width, bias=False)

    def forward(
        self, x: Tensor, cache: KeyValueCache | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Attention of the tokens ``x`` [B, T, D] over themselves (causally) and, with a
        ``cache``, over the earlier positions it holds (to which their keys and values are
        added); returns the output and the new positions' keys and values [B, H, T, d]."""
        batch, steps, width = x.shape
        k, v = self.kv_proj(x).split(width, dim=-1)

        def heads(t: Tensor) -> Tensor:
            return t.view(batch, steps, self.heads, -1).transpose(1, 2)

        start = 0 if cache is None else cache.length
        positions = torch.arange(start, start + steps, device=x.device)
        q = rotate(heads(self.q_proj(x)), positions, self.rope_base)
        new = rotate(heads(k), positions, self.rope_base), heads(v)
        keys, values = new if cache is None else cache.append(*new)
        # a single new token attends to every position so far; several, causally
        y = F.scaled_dot_product_attention(q, keys, values, is_causal=cache is None and steps > 1)
        return self.c_proj(y.transpose(1, 2).reshape(batch, steps, width)), new


class SwiGLU(nn.Module):
    """``c_proj(silu(c_fc1 x) * c_fc2 x)``, hidden width 2/3 of 4x, rounded up to 256."""

    def __init__(self, width: int) -> None:
        super().__init__()
        hidden = 256 * math.ceil(int(8 * width / 3) / 256)
        self.c_fc1 = nn.Linear(width, hidden, bias=False)
        self.c_fc2 = nn.Linear(width, hidden, bias=False)
        self.c_proj = nn.Linear(hidden, width, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(F.silu(self.c_fc1(x)) * self.c_fc2(x))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, rope_base: float) -> None:
        super().__init__()
        self.rms_1 = RMSNorm(width)
        self.attn = CausalSelfAttention(width, heads, rope_base)
        self.rms_2 = RMSNorm(width)
        self.mlp = SwiGLU(width)

    def forward(
        self, x: Tensor, cache: KeyValueCache | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """The block on tokens that follow the positions in ``cache``; also returns the new
        positions' keys and values (see :class:`CausalSelfAttention`)."""
        attended, new = self.attn(self.rms_1(x), cache)
        x = x + attended
        return x + self.mlp(self.rms_2(x)), new


class StudentTHead(nn.Module):
    """Student-t parameters from the last hidden state: ``df = 2 + softplus``, ``loc``,
    ``scale = softplus`` (clamped at float eps), as gluonts' ``StudentTOutput``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.ModuleList([nn.Linear(width, 1) for _ in range(3)])

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        df, loc, scale = (p(x).squeeze(-1) for p in self.proj)
        eps = torch.finfo(scale.dtype).eps
        return 2.0 + F.softplus(df), loc, F.softplus(scale).clamp_min(eps)


class LagLlamaNetwork(nn.Module):
    """The transformer and its Student-t head on already-built token features [B, T, F]."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        width = config["n_head"] * config["n_embd_per_head"]
        time = NUM_TIME_FEATURES if config["time_feat"] else 0
        features = len(config["lags_seq"]) + 2 + time
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Linear(features, width),
                "h": nn.ModuleList(
                    Block(width, config["n_head"], config["rope_base"])
                    for _ in range(config["n_layer"])
                ),
                "ln_f": RMSNorm(width),
            }
        )
        self.param_proj = StudentTHead(width)

    def forward(self, tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Student-t parameters (df, loc, scale) [B, T] of the value after each token."""
        return self.extend(tokens)[0]

    def extend(
        self, tokens: Tensor, caches: Sequence[KeyValueCache] | None = None
    ) -> tuple[tuple[Tensor, Tensor, Tensor], list[tuple[Tensor, Tensor]]]:
        """:meth:`forward` on ``tokens`` [B, T, F] that follow the positions held in ``caches``
        (one per block; None at the start), writing their keys and values there; also returns
        the new positions' keys and values per block, from which :class:`KeyValueCache` starts."""
        x = self.transformer["wte"](tokens)
        new = []
        for i, block in enumerate(self.transformer["h"]):
            x, keys_values = block(x, None if caches is None else caches[i])
            new.append(keys_values)
        return self.param_proj(self.transformer["ln_f"](x)), new


def window_scale(values: Tensor, observed: Tensor, scaling: str) -> tuple[Tensor, Tensor]:
    """The window's (loc, scale) [B, 1] over its observed values: ``mean``: loc 0, scale the
    mean |x| (gluonts' MeanScaler; the batch's mean where a window is all-missing); ``robust``:
    the median and the inter-quartile range; ``none``: 0 and 1. Scales are floored at 1e-5."""
    if scaling == "none":
        ones = values.new_ones(values.shape[0], 1)
        return torch.zeros_like(ones), ones
    weights = observed.to(values.dtype)
    count = weights.sum(-1, keepdim=True)
    if scaling == "mean":
        total = (values.abs() * weights).sum(-1, keepdim=True)
        default = total.sum() / count.sum().clamp_min(1.0)
        scale = torch.where(count > 0, total / count.clamp_min(1.0), default)
        return torch.zeros_like(scale), scale.clamp_min(1e-5)
    masked = torch.where(observed, values, torch.nan)
    quartiles = torch.nanquantile(masked, torch.tensor([0.25, 0.5, 0.75]).to(values), dim=-1)
    loc = torch.nan_to_num(quartiles[1], nan=0.0)[:, None]
    spread = torch.nan_to_num(quartiles[2] - quartiles[0], nan=1.0)[:, None]
    return loc, spread.clamp_min(1e-5)
