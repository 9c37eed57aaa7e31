"""Moirai 2.0 (Salesforce 2025; Salesforce/moirai-2.0-R-small) as a :class:`ForecastModule`, on
isoprobe's own network (:mod:`isoprobe.models.moirai2.network`); the published weights load as
published, through :mod:`isoprobe.models.moirai2.loading`.

A window becomes one sequence of patches as uni2ts 2.0's ``Moirai2Forecast`` packs one
variate: the context is left-padded (NaN) to whole patches; a leading run of NaN is left
padding (a patch made only of padding is a sample of its own, ``sample_id`` 0, which the real
patches do not attend to); any other NaN is a missing value (value 0, observed flag 0). A
patch's time index counts the patches since the first one holding an observed value
(``cummax(has_observed).cumsum() - 1``, at least 0). With ``scaling`` the window is
standardised by its observed context values (uni2ts' ``PackedStdScaler``, in float64):
``loc`` their mean, ``scale = sqrt(sum (x - loc)^2 / (n - 1) + 1e-5)`` (``n - 1 = 0`` divides
by 1); padding patches keep ``loc = 0``, ``scale = 1``.

Forecasting follows ``Moirai2Forecast.forward``: the last context patch's head gives the
quantiles of the next ``num_predict_token`` patches (mapped back by ``x scale + loc``). Longer
horizons are decoded autoregressively as uni2ts does: each of the Q quantile forecasts is
appended to its own copy of the window (a path per level, standardised again with the values
appended) and the last patch of each path forecasts the next patches; the Q x Q values of
each step are pooled and their empirical quantiles (``torch.quantile``, linear) at the model's
levels are the forecast, and the value each path appends next. Forecasts at other levels
interpolate linearly between the model's (sorted per step).

The training objective is uni2ts 2.0's ``PackedQuantileMAELoss``: per step, the mean over the
levels q of ``q |e|`` where the value lies above the quantile and ``(1 - q) |e|`` elsewhere
(``e = y - y_q``), averaged over each window's observed predicted steps and then over the
windows (its packed reduction, one sample per window). uni2ts 2.0 ships the loss and the
module's training output (standardised quantiles and targets) but no pretraining task; here,
as Moirai 2.0's decoder-only multi-token training, every patch that is not padding predicts
the ``num_predict_token`` patches after it (context, then target) in one pass over the context,
in the window's standardised units, so the loss reads the tokens the probe reads.

uni2ts' ``predict`` runs its ``CausalMeanImputation`` on the caller's own arrays, which (as
released, on a [T, 1] view) sets every missing value to 0 in place: its module sees 0,
unobserved, as here, but the caller's NaN are gone, and a leading run of NaN is a run of
unobserved zeros rather than padding. isoprobe hands the module the same 0, unobserved, never
writes into the batch, and packs a leading run of NaN as the padding ``forward``'s
``past_is_pad`` marks.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from isoprobe.models.base import Batch, Forecast, ForecastModule
from isoprobe.models.checkpoints import export_published_network, resolve_checkpoint, scratch_fields
from isoprobe.models.moirai2.config import Moirai2Shape, official_config
from isoprobe.models.moirai2.loading import load_network
from isoprobe.models.moirai2.network import Moirai2Network
from isoprobe.models.padding import whole_patches
from isoprobe.models.quantiles import register_level_weights

log = logging.getLogger(__name__)

#: the scaler's floor under the variance (uni2ts' ``PackedStdScaler.minimum_scale``)
MINIMUM_VARIANCE = 1e-5


@dataclass(frozen=True)
class Packed:
    """A batch of series as patches: ``values`` [B, N, p] (0 where missing), ``observed``
    [B, N, p], ``sample_id`` [B, N] (0: a patch of left padding only, 1: the series) and
    ``time_id`` [B, N]."""

    values: Tensor
    observed: Tensor
    sample_id: Tensor
    time_id: Tensor


def pack(series: Tensor, patch: int) -> Packed:
    """``series`` [B, T] (NaN = missing; a leading run of NaN is left padding) as patches
    (module docstring)."""
    series = whole_patches(series, patch)
    rows = len(series)
    missing = series.isnan()
    padding = missing.long().cumprod(dim=1).bool()
    observed = (~missing).view(rows, -1, patch)
    sample_id = (~padding).view(rows, -1, patch).any(dim=-1).long()
    holds = observed.any(dim=-1).long()
    time_id = (holds.cummax(dim=-1).values.cumsum(dim=-1) - 1).clamp_min(0)
    return Packed(series.nan_to_num(0.0).view(rows, -1, patch), observed, sample_id, time_id)


def standardisation(packed: Packed) -> tuple[Tensor, Tensor]:
    """Each patch's ``loc`` and ``scale`` [B, N] (module docstring; uni2ts' ``PackedStdScaler``
    over one sample per window, in float64, returned in float32)."""
    x, weight = packed.values.double(), packed.observed.double()
    count = weight.sum(dim=(1, 2))
    loc = (x * weight).sum(dim=(1, 2)) / torch.where(count == 0, 1.0, count)
    squares = ((x - loc[:, None, None]) ** 2 * weight).sum(dim=(1, 2))
    variance = squares / torch.where(count - 1 == 0, 1.0, count - 1)
    scale = torch.sqrt(variance + MINIMUM_VARIANCE)
    padding = packed.sample_id == 0
    loc = torch.where(padding, 0.0, loc[:, None]).float()
    scale = torch.where(padding, 1.0, scale[:, None]).float()
    return loc, scale


def quantile_loss(prediction: Tensor, target: Tensor, levels: Tensor) -> Tensor:
    """uni2ts 2.0's ``PackedQuantileMAELoss`` per step: ``mean_q (q |e| if y > y_q else
    (1 - q) |e|)``, ``e = y - y_q``; ``prediction`` [..., Q, p], ``target`` [..., p],
    ``levels`` [Q, 1] -> [..., p]."""
    errors = target.unsqueeze(-2) - prediction
    above = target.unsqueeze(-2) > prediction
    return torch.where(above, levels * errors.abs(), (1 - levels) * errors.abs()).mean(dim=-2)


class Moirai2Module(ForecastModule):
    """Moirai 2.0 fine-tuning/pretraining wrapper.

    Args:
        checkpoint: ``auto`` | ``bundled`` | ``scratch`` | a local directory | a hub id.
        hub_id: the official checkpoint ``auto`` prefers when it is cached or reachable.
        bundled_name: folder of the shipped checkpoint under ``isoprobe/models/bundled``.
        size: which entry of ``sizes`` ``checkpoint=scratch`` builds.
        sizes: named shapes (:class:`Moirai2Shape` fields): ``mini`` (the bundled one) and
            ``small`` (the published one).
        **base: the :class:`ForecastModule` arguments (optimizer, lengths, quantiles, freq, ...).
    """

    samples = False
    lagged = False
    stacks = ("decoder",)

    def __init__(
        self,
        checkpoint: str = "bundled",
        hub_id: str = "Salesforce/moirai-2.0-R-small",
        bundled_name: str = "moirai2-mini",
        size: str = "mini",
        sizes: Mapping[str, Mapping[str, Any]] | None = None,
        **base: Any,
    ) -> None:
        super().__init__(**base)
        self.resolved_checkpoint = resolve_checkpoint(checkpoint, hub_id, bundled_name)
        self.network: Moirai2Network = load_network(
            self.resolved_checkpoint, scratch_fields(size, sizes)
        )
        register_level_weights(self, self.shape.quantile_levels, "Moirai 2.0")
        log.info("Moirai 2.0 weights: %s", self.resolved_checkpoint.describe())

    @property
    def shape(self) -> Moirai2Shape:
        return self.network.shape

    # ----------------------------------------------------------------- running the network
    def _run(
        self, series: Tensor, last_only: bool = False
    ) -> tuple[Tensor, Tensor, Tensor, Packed]:
        """One pass over ``series`` [B, T]: the head's standardised quantiles
        [B, N, num_predict_token, Q, p] (``last_only``: the last patch's, N = 1), each patch's
        ``loc`` and ``scale`` [B, N] and the packed patches."""
        packed = pack(series, self.shape.patch_size)
        if self.shape.scaling:
            loc, scale = standardisation(packed)
        else:
            loc = torch.zeros(packed.sample_id.shape, device=series.device)
            scale = torch.ones_like(loc)
        scaled = (packed.values - loc[..., None]) / scale[..., None]
        _, out = self.network(scaled, packed.observed, packed.sample_id, packed.time_id, last_only)
        return out, loc, scale, packed

    def _next_patches(self, series: Tensor, count: int) -> Tensor:
        """The last patch's forecast of the ``count`` patches after ``series``, in its scale:
        [B, count, Q, p]."""
        out, loc, scale, _ = self._run(series, last_only=True)
        return out[:, -1, :count] * scale[:, -1, None, None, None] + loc[:, -1, None, None, None]

    def _decode(self, context: Tensor) -> Tensor:
        """``Moirai2Forecast.forward``: [B, Q, prediction_length] quantiles at the model's
        levels, decoded autoregressively past ``num_predict_token`` patches (module
        docstring)."""
        shape = self.shape
        levels, patch = len(shape.quantile_levels), shape.patch_size
        per_call = shape.num_predict_token
        needed = math.ceil(self.prediction_length / patch)
        first = self._next_patches(context, min(per_call, needed))
        pieces = [first.transpose(1, 2).flatten(2)]
        done = first.shape[1]
        if done < needed:
            paths = torch.cat([context.repeat_interleave(levels, 0), pieces[0].flatten(0, 1)], 1)
            at = torch.tensor(shape.quantile_levels, dtype=first.dtype, device=first.device)
        while done < needed:
            count = min(per_call, needed - done)
            step = self._next_patches(paths, count)
            pooled = step.view(len(context), levels, count, levels, patch).transpose(1, 2)
            quantiles = torch.quantile(pooled.flatten(2, 3), at, dim=2).permute(1, 0, 2, 3)
            pieces.append(quantiles.flatten(2))
            paths = torch.cat([paths, quantiles.flatten(2).flatten(0, 1)], dim=1)
            done += count
        return torch.cat(pieces, dim=-1)[..., : self.prediction_length]

    # ----------------------------------------------------------------- the contract
    def loss(self, batch: Batch) -> Tensor:
        """uni2ts 2.0's quantile loss of every non-padding patch's forecast of the patches
        after it (module docstring), on ``context`` then ``target``."""
        context, target = batch["context"], batch["target"]
        out, loc, scale, packed = self._run(context)
        rows, patches, ahead, _, patch = out.shape
        padded = F.pad(context, (patches * patch - context.shape[1], 0), value=float("nan"))
        series = F.pad(torch.cat([padded, target], dim=1), (0, ahead * patch), value=float("nan"))
        future = series[:, patch:].unfold(1, ahead * patch, patch)[:, :patches]
        future = future.reshape(rows, patches, ahead, patch)
        predicting = packed.sample_id == 1
        observed = future.isfinite() & predicting[..., None, None]
        standardised = (future.nan_to_num(0.0) - loc[..., None, None]) / scale[..., None, None]
        levels = torch.tensor(self.shape.quantile_levels, dtype=out.dtype, device=out.device)
        terms = quantile_loss(out, standardised, levels[:, None]) * observed
        per_window = terms.sum(dim=(1, 2, 3)) / observed.sum(dim=(1, 2, 3)).clamp_min(1)
        return per_window.sum() / predicting.any(dim=1).sum().clamp_min(1)

    @torch.no_grad()
    def forecast(self, batch: Batch) -> Forecast:
        """Quantiles at ``self.quantile_levels``: the model's quantiles sorted per step (so
        that crossing ones still give ordered quantiles), then linearly interpolated between
        its levels; the median is the 0.5 level of the same curve."""
        heads = self._decode(batch["context"]).sort(dim=1).values
        quantiles = torch.einsum("bgh,lg->blh", heads, self.level_weights.to(heads.dtype))
        median = torch.einsum("bgh,g->bh", heads, self.median_weights.to(heads.dtype))
        return Forecast(quantiles, self.quantile_levels, median)

    def probe_forward(self, batch: Batch) -> None:
        """One pass over the context (the decoding's first pass, the loss's only one)."""
        self._run(batch["context"])

    def embed_module(self) -> nn.Module:
        """``in_proj``, whose output the first block reads (positions are rotary)."""
        return self.network.in_proj

    def stack_blocks(self, stack: str) -> Sequence[nn.Module]:
        return self.network.encoder.layers

    def self_attention_module(self, stack: str, index: int) -> nn.Module:
        """The block's attention output after ``out_proj``, before the residual add."""
        return self.network.encoder.layers[index].self_attn

    def token_masks(self, batch: Batch, layers: Iterable[str]) -> dict[str, Tensor]:
        """One token per context patch in every layer; it is real exactly when the patch holds
        an observed value."""
        layers = list(layers)
        self.identify_layers(layers, "Moirai 2.0")
        real = pack(batch["context"], self.shape.patch_size).observed.any(dim=-1)
        return {name: real for name in layers}

    def input_modules(self) -> list[nn.Module]:
        """``in_proj`` (Moirai 2.0 has no other input layer)."""
        return [self.network.in_proj]

    def head_modules(self) -> list[nn.Module]:
        """``out_proj``, from the final norm's output to the quantiles."""
        return [self.network.out_proj]

    def feed_forward_modules(self) -> list[nn.Module]:
        """Every block's gated feed-forward (``fc_gate``, ``fc1``, ``fc2``)."""
        return [layer.ffn for layer in self.network.encoder.layers]

    def attention_weights(self) -> dict[str, dict[str, Tensor]]:
        """Every block's ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj``; q and k are
        normalised per head and (half of each head) rotated after projection."""
        weights = {}
        for i, layer in enumerate(self.network.encoder.layers):
            attn = layer.self_attn
            weights[f"decoder.{i}"] = {
                "q": attn.q_proj.weight,
                "k": attn.k_proj.weight,
                "v": attn.v_proj.weight,
                "o": attn.out_proj.weight,
            }
        return weights

    def export(self, directory: str, dtype: str = "float32") -> None:
        """model.safetensors with the published tensor names and config.json with
        ``Moirai2Module``'s arguments, the published layout."""
        export_published_network(self.network, directory, dtype, official_config(self.shape))

    # ----------------------------------------------------------------- memory
    def _tokens(self, length: int) -> int:
        return math.ceil(length / self.shape.patch_size)

    def _block_floats(self, tokens: int) -> int:
        """Floats one block holds for ``tokens`` tokens: the stream, norms, q/k/v (normed and
        rotated) and attention output (14 d), the gated feed-forward (3 d_ff) and the attention
        mask, scores and probabilities (3 x heads x N^2)."""
        shape = self.shape
        per_token = 14 * shape.d_model + 3 * shape.d_ff
        return tokens * per_token + 3 * max(shape.num_heads, 1) * tokens**2

    def _head_floats(self, tokens: int) -> int:
        """``out_proj``'s hidden layer and outputs, with the loss's targets and errors (x 6)."""
        return tokens * (2 * self.shape.d_model + 6 * self.shape.outputs)

    def training_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a training step: weights, gradients and AdamW's moments of what
        trains, and the activations kept for backward over the context's patches (every block,
        ``in_proj`` and ``out_proj``)."""
        tokens = self._tokens(self.context_length)
        shape = self.shape
        inputs = tokens * (6 * shape.patch_size + 3 * shape.d_model)
        activations = shape.num_layers * self._block_floats(tokens) + inputs
        activations += self._head_floats(tokens)
        return 4 * (batch_size * activations + self.weight_floats(training=True))

    def forecast_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a forecast: the weights and, at the roll-out's longest paths
        (context + horizon, one per level), one block's activations and the head's outputs."""
        tokens = self._tokens(self.context_length + self.prediction_length)
        paths = batch_size * len(self.shape.quantile_levels)
        activations = self._block_floats(tokens) + self._head_floats(tokens)
        return 4 * (paths * activations + self.weight_floats(training=False))
