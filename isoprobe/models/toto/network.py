"""Toto's network (Datadog 2025; official code: the ``toto-ts`` package 0.2,
``toto/model/backbone.py``, ``transformer.py``, ``attention.py``, ``rope.py``, ``scaler.py``,
``distribution.py``), isoprobe's own implementation, for series of shape [B, V, T] (V variates;
isoprobe's windows have one).

- **Causal patch scaler** (:func:`causal_patch_statistics`): Welford's running mean and
  (Bessel-corrected) variance of the observed values up to each step, ``s_t = sqrt(var_t +
  0.1)``, optionally clamped to ``[max(0.1, g 10^-e), g 10^e]`` around the global scale ``g`` of
  the first ``prefix`` steps; each patch takes the statistics of its last step.
- **Patch embedding**: a linear map of each patch's ``p`` scaled values.
- **Layers** (pre-norm): ``h = x + W_O attn(RMSNorm(x))``, ``y = h + mlp(RMSNorm(h))``, RMSNorm
  ``scale * x / sqrt(mean(x^2) + 1e-8)``; the feed-forward ``W_2 (silu(a) * b)`` with ``(a, b)``
  the halves of ``W_1 x`` (SwiGLU, gate first). A time-wise layer attends causally across the
  patches of each variate, with rotary positions and xPos scaling (Sun et al. 2022):
  feature pairs ``(2m, 2m+1)`` of q and k turn by ``n / 10000^(2m/d_h)`` at patch ``n``, then
  feature ``j`` of q is multiplied and of k divided by ``ζ_(j mod d_h/2)^((n - ⌊(N-1)/2⌋)/512)``,
  ``ζ_m = (2m + 0.4 d_h) / (1.4 d_h)`` (``rotary_embedding_torch``'s layout: angles interleaved,
  scales concatenated); scores ``q·k / sqrt(d_h)``. A space-wise layer attends, unmasked and
  without positions, across the variates at each patch (over one variate: the softmax of one
  score, so its output is the token's own value through ``wO``). The fused ``wQKV`` lays out
  its rows as ``(q|k|v, head_dim, head)``, heads innermost (the package's ``einops`` pattern).
- **Head**: ``unembed`` maps each patch's output to ``p`` vectors (one per step), and the
  Student-T mixture head gives per step and component ``df = 2 + softplus(.)``, ``loc``,
  ``scale = softplus(.)`` (both clamped at float eps) and the weights ``softmax(.)``.

isoprobe groups the official layers into blocks (:class:`Block`): each time-wise layer with the
space-wise layer that runs just before it (``spacewise_first``) or just after it, so that every
block attends across patches once. The state dict's names translate to the published ones
(``model.transformer.layers.<j>...``) with :func:`official_names` / :func:`isoprobe_names`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from torch import Tensor, nn
from torch.distributions import Categorical, MixtureSameFamily, StudentT
from torch.nn import functional as F

from isoprobe.models import kv_cache
from isoprobe.models.toto.config import TotoShape

#: RMSNorm's epsilon, the scaler's minimum variance term, the rotary base and the xPos base
EPSILON, MINIMUM_SCALE, ROTARY_BASE, XPOS_BASE = 1e-8, 0.1, 10000.0, 512.0


class RMSNorm(nn.Module):
    """``scale * x / sqrt(mean(x^2) + 1e-8)`` over the last axis."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(width))

    def forward(self, x: Tensor) -> Tensor:
        return x / torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True) + EPSILON) * self.scale


class SwiGLU(nn.Module):
    """``silu(a) * b`` of the halves ``(a, b)`` of the last axis (gate first)."""

    def forward(self, x: Tensor) -> Tensor:
        gate, value = x.chunk(2, dim=-1)
        return F.silu(gate) * value


def rotate_with_xpos(
    q: Tensor, k: Tensor, start: int = 0, centre: float | None = None
) -> tuple[Tensor, Tensor]:
    """Rotary positions with xPos scaling (module docstring) on q, k [..., N, d_h] at patches
    ``start``, ``start + 1``, ...; the xPos powers are taken from ``centre`` (by default
    ``⌊(N-1)/2⌋`` of patches 0 ... N-1). A score ``q·k`` depends on the centre only through
    rounding: the query's factor ``ζ^((n - c)/512)`` and the key's ``ζ^(-(m - c)/512)`` meet
    as ``ζ^((n - m)/512)``."""
    length, width = q.shape[-2], q.shape[-1]
    positions = torch.arange(start, start + length, device=q.device, dtype=torch.float32)
    frequencies = 1.0 / ROTARY_BASE ** (torch.arange(0, width, 2, device=q.device).float() / width)
    angles = (positions[:, None] * frequencies).repeat_interleave(2, dim=-1)
    bases = (torch.arange(0, width, 2, device=q.device) + 0.4 * width) / (1.4 * width)
    if centre is None:
        centre = positions.max() // 2
    power = (positions - centre) / XPOS_BASE
    scale = (bases ** power[:, None]).repeat(1, 2).to(q.dtype)
    cos, sin = angles.cos(), angles.sin()

    def turn(x: Tensor, factor: Tensor) -> Tensor:
        pairs = x.unflatten(-1, (-1, 2))
        half = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
        return (x * cos * factor) + (half * sin * factor)

    return turn(q, scale), turn(k, scale.reciprocal())


class KeyValueCache(kv_cache.KeyValueCache):
    """The time-wise layers' keys and values of the patches a forecast has run so far
    (:mod:`isoprobe.models.kv_cache`), so that each later pass runs the new patches alone (the
    package's KV cache). The causal scaler leaves an earlier patch's scaled values as they were
    when patches are appended (its statistics run forward; the global clamp reads the context
    alone), and time-wise attention is causal, so an earlier patch's keys and values do not
    change. The xPos ``centre`` is the first pass's, kept for the later ones
    (:func:`rotate_with_xpos`)."""

    def __init__(self) -> None:
        super().__init__()
        self.centre: int | None = None


class Attention(nn.Module):
    """Multi-head attention across patches (``time``: causal, rotary) or variates (``space``);
    returns the output after ``wO``."""

    def __init__(self, shape: TotoShape, spacewise: bool) -> None:
        super().__init__()
        self.spacewise = spacewise
        self.heads, self.head_dim = shape.num_heads, shape.head_dim
        self.dropout = shape.dropout
        self.wQKV = nn.Linear(shape.embed_dim, 3 * shape.embed_dim)
        self.wO = nn.Linear(shape.embed_dim, shape.embed_dim)

    def forward(self, x: Tensor, cache: KeyValueCache | None = None) -> Tensor:
        """``x`` [B, V, N, d] -> [B, V, N, d]; with a ``cache`` (time-wise), ``x`` holds the
        patches after the cached ones, whose keys and values it reads and extends."""
        batch, variates, length, width = x.shape
        rows = x.transpose(1, 2) if self.spacewise else x
        rows = rows.reshape(-1, rows.shape[2], width)
        qkv = self.wQKV(rows).unflatten(-1, (3, self.head_dim, self.heads))
        q, k, v = qkv.permute(2, 0, 4, 1, 3).unbind(0)
        mask, causal = None, not self.spacewise
        if not self.spacewise and cache is not None:
            start = cache.tokens
            q, k = rotate_with_xpos(q, k, start, cache.centre)
            k, v = cache.extend(self, k, v, dim=-2)
            if start:
                mask = torch.ones(length, start + length, dtype=torch.bool, device=x.device)
                mask, causal = mask.tril(start), False
        elif not self.spacewise:
            q, k = rotate_with_xpos(q, k)
        mixed = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=causal,
        )
        mixed = mixed.transpose(1, 2).flatten(-2)
        if self.spacewise:
            mixed = mixed.view(batch, length, variates, width).transpose(1, 2)
        else:
            mixed = mixed.view(batch, variates, length, width)
        return self.wO(mixed)


class Layer(nn.Module):
    """One official transformer layer: ``h = x + attention(norm1(x))``, ``h + mlp(norm2(h))``."""

    def __init__(self, shape: TotoShape, spacewise: bool) -> None:
        super().__init__()
        width, hidden = shape.embed_dim, shape.mlp_hidden_dim
        self.norm1 = RMSNorm(width)
        self.attention = Attention(shape, spacewise)
        self.norm2 = RMSNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * hidden),
            SwiGLU(),
            nn.Linear(hidden, width),
            nn.Dropout(shape.dropout),
        )

    def forward(self, x: Tensor, cache: KeyValueCache | None = None) -> Tensor:
        x = x + self.attention(self.norm1(x), cache)
        return x + self.mlp(self.norm2(x))


class Block(nn.Module):
    """A time-wise layer (``time``) with the space-wise layer (``space``, or None) that runs
    just before it (``space_first``) or just after it."""

    def __init__(self, shape: TotoShape, spacewise: bool) -> None:
        super().__init__()
        self.space_first = shape.spacewise_first
        self.space = Layer(shape, spacewise=True) if spacewise else None
        self.time = Layer(shape, spacewise=False)

    def forward(self, x: Tensor, cache: KeyValueCache | None = None) -> Tensor:
        if self.space is not None and self.space_first:
            x = self.space(x)
        x = self.time(x, cache)
        if self.space is not None and not self.space_first:
            x = self.space(x)
        return x


def block_layers(shape: TotoShape) -> list[tuple[int, int | None]]:
    """Per block, its time-wise layer's official index and its space-wise one's (or None)."""
    kinds = shape.layer_is_spacewise()
    times = [j for j, spacewise in enumerate(kinds) if not spacewise]
    blocks: list[tuple[int, int | None]] = [(j, None) for j in times]
    for j, spacewise in enumerate(kinds):
        if spacewise:
            near = [k for k, t in enumerate(times) if (t > j if shape.spacewise_first else t < j)]
            at = near[0] if shape.spacewise_first else near[-1]
            blocks[at] = (blocks[at][0], j)
    return blocks


class StudentTMixture(nn.Module):
    """The mixture head: per step, ``k`` components' ``df``, ``loc``, ``scale`` and weights."""

    def __init__(self, width: int, components: int) -> None:
        super().__init__()
        self.df = nn.Linear(width, components)
        self.loc_proj = nn.Linear(width, components)
        self.scale_proj = nn.Linear(width, components)
        self.mixture_weights = nn.Linear(width, components)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """[..., d] -> df, loc, scale and the weights' logits, each [..., k]."""
        eps = torch.finfo(x.dtype).eps
        df = 2.0 + F.softplus(self.df(x)).clamp_min(eps)
        scale = F.softplus(self.scale_proj(x)).clamp_min(eps)
        return df, self.loc_proj(x), scale, self.mixture_weights(x)


def mixture(parameters: tuple[Tensor, Tensor, Tensor, Tensor]) -> MixtureSameFamily:
    """The Student-T mixture of :class:`StudentTMixture`'s outputs."""
    df, loc, scale, logits = parameters
    weights = Categorical(probs=F.softmax(logits, dim=-1), validate_args=False)
    return MixtureSameFamily(weights, StudentT(df, loc, scale, validate_args=False))


class TotoNetwork(nn.Module):
    """Patch embedding, blocks, unembedding and the mixture head (the official weights)."""

    def __init__(self, shape: TotoShape) -> None:
        super().__init__()
        self.shape = shape
        width, patch = shape.embed_dim, shape.patch_size
        self.patch_embed = nn.Module()
        self.patch_embed.projection = nn.Linear(patch, width)
        self.blocks = nn.ModuleList(
            Block(shape, spacewise=space is not None) for _, space in block_layers(shape)
        )
        self.unembed = nn.Linear(width, width * patch)
        self.output_distribution = StudentTMixture(width, shape.components)

    def embed(self, scaled: Tensor) -> Tensor:
        """Scaled series [B, V, T] (T a multiple of the patch) -> tokens [B, V, N, d]."""
        return self.patch_embed.projection(scaled.unflatten(-1, (-1, self.shape.patch_size)))

    def forward(
        self, scaled: Tensor, cache: KeyValueCache | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor, Tensor]]:
        """Scaled series [B, V, T] -> the last block's output [B, V, N, d] and the mixture's
        parameters per step [B, V, T, k] (step t's distribution is of step t + p's scaled
        value). With a ``cache``, the patches it holds are not run again: N and T count the
        patches after them, which it then holds too."""
        if cache is not None:
            scaled = scaled[..., cache.tokens * self.shape.patch_size :]
        x = self.embed(scaled)
        if cache is not None and cache.centre is None:
            cache.centre = (x.shape[2] - 1) // 2
        for block in self.blocks:
            x = block(x, cache)
        if cache is not None:
            cache.tokens += x.shape[2]
        steps = self.unembed(x).unflatten(-1, (self.shape.patch_size, -1)).flatten(2, 3)
        return x, self.output_distribution(steps)


def causal_patch_statistics(
    values: Tensor, observed: Tensor, shape: TotoShape, prefix: int | None = None
) -> tuple[Tensor, Tensor]:
    """The official ``CausalPatchStdMeanScaler``'s loc and scale [B, V, T] (module docstring)
    of ``values`` [B, V, T] (finite) at the ``observed`` steps, in float64 as the package
    computes them; ``prefix``: the steps the global scale reads (all when None)."""
    with torch.no_grad():
        x, w = values.double(), observed.double()
        count = w.cumsum(-1).clamp_min(1.0)
        mean = (w * x).cumsum(-1) / count
        before = F.pad(mean[..., :-1], (1, 0))
        m2 = ((x - before) * (x - mean) * w).cumsum(-1)
        scale = torch.sqrt(m2 / (count - 1.0).clamp_min(1.0) + MINIMUM_SCALE)
        if shape.stabilize_with_global:
            kept = w.clone()
            if prefix is not None:
                kept[..., prefix:] = 0.0
            total = kept.sum(-1, keepdim=True).clamp_min(1.0)
            global_mean = torch.nan_to_num((kept * x).sum(-1, keepdim=True) / total)
            spread = (((x - global_mean) * kept) ** 2).sum(-1, keepdim=True) / total
            global_scale = torch.sqrt(spread + MINIMUM_SCALE)
            factor = 10.0**shape.scale_factor_exponent
            low = torch.clamp_min(global_scale / factor, MINIMUM_SCALE)
            scale = torch.minimum(torch.maximum(scale, low), global_scale * factor)
        patch = shape.patch_size
        last = slice(patch - 1, None, patch)
        loc = mean[..., last].repeat_interleave(patch, -1)
        scale = scale[..., last].repeat_interleave(patch, -1)
        return loc.to(values.dtype), scale.to(values.dtype)


_LAYER = re.compile(r"^model\.transformer\.layers\.(\d+)\.(.*)$")
_BLOCK = re.compile(r"^blocks\.(\d+)\.(time|space)\.(.*)$")
#: the fused SwiGLU kernel's tensor names (xFormers) -> the unfused ones
_FUSED = {"mlp.0.w12.": "mlp.0.", "mlp.0.w3.": "mlp.2."}
#: a buffer the package recomputes, which some of its checkpoints hold
ROTARY_BUFFER = "model.transformer.rotary_emb.freqs"


def official_names(shape: TotoShape) -> dict[str, str]:
    """Each layer prefix of :class:`TotoNetwork` (``blocks.<i>.time.``) -> the published one
    (``model.transformer.layers.<j>.``)."""
    names = {}
    for i, (time, space) in enumerate(block_layers(shape)):
        names[f"blocks.{i}.time."] = f"model.transformer.layers.{time}."
        if space is not None:
            names[f"blocks.{i}.space."] = f"model.transformer.layers.{space}."
    return names


def official_name(name: str, shape: TotoShape) -> str:
    """A state-dict name of :class:`TotoNetwork` -> the published one."""
    found = _BLOCK.match(name)
    if found is None:
        return f"model.{name}"
    prefix = f"blocks.{found[1]}.{found[2]}."
    return official_names(shape)[prefix] + found[3]


def isoprobe_names(weights: Mapping[str, Tensor], shape: TotoShape) -> dict[str, Tensor]:
    """Published tensors -> :class:`TotoNetwork`'s names: the layers to their blocks, the fused
    SwiGLU names unfused, the ``model.`` prefix dropped, the recomputed rotary buffer left out.
    A name that fits nothing keeps its own, so that the fit check names it."""
    layers = {official: ours for ours, official in official_names(shape).items()}
    renamed = {}
    for name, tensor in weights.items():
        if name == ROTARY_BUFFER:
            continue
        for fused, plain in _FUSED.items():
            name = name.replace(fused, plain)
        found = _LAYER.match(name)
        prefix = found and f"model.transformer.layers.{found[1]}."
        if found and prefix in layers:
            name = layers[prefix] + found[2]
        elif name.startswith("model.") and not found:
            name = name[len("model.") :]
        renamed[name] = tensor
    return renamed
