"""TimesFM 2.5 (Google, 2025; google/timesfm-2.5-200m-pytorch) as a :class:`ForecastModule`,
on isoprobe's own network (:mod:`isoprobe.models.timesfm25.network`); the published weights load
as published, through :mod:`isoprobe.models.timesfm25.loading`.

A window is left-padded (NaN) to whole patches. Each patch is normalised by the running mean
and standard deviation of the observed values up to its end (the official running statistics),
missing steps set to 0 and flagged to the tokenizer. Forecasting follows the official
``decode`` and ``forecast``: the last patch's point head gives the first ``output_patch_len``
steps (mapped back by its own statistics); longer horizons are decoded autoregressively, each
output patch's median channel appended to the series and the new last patch's point head read.
Then, as the package's ``ForecastConfig`` defaults do: ``force_flip_invariance`` averages the
forecast of ``x`` with the negated, level-reversed forecast of ``-x``; ``infer_is_positive``
clips at 0 the forecast of a window whose observed values are all >= 0. With
``use_continuous_quantile_head`` the quantiles are the quantile head's, shifted to the point
head's median (the official rule, for horizons up to ``output_quantile_len``). The package's
``normalize_inputs`` is an affine map the running statistics undo, so it is left out.

Missing values: the official ``forecast`` strips leading NaN and fills inner ones by linear
interpolation before its model sees them; isoprobe hands the model every missing step as what
it is (0, flagged), so that a token carries observed values exactly when it has one. A patch
without an observed value is hidden from attention (for left padding this is the official
mask, which hides leading padded patches).

The package defines no training objective. The loss here is the TimesFM paper's decoder-only
training (Das et al. 2024: every patch predicts the output patch that follows it, squared error)
with the pinball loss of the quantile channels added, as transformers' TimesFM 2.0 port does, and
applied to both heads: every real context patch predicts the steps that follow it (context then
target) with the point head (``output_patch_len`` steps) and the quantile head
(``output_quantile_len`` steps), in that patch's normalised units; each head's term is the mean,
over the observed future steps, of the squared error of its mean channel plus the pinball loss
``max(q e, (q - 1) e)``, ``e = y - y_q``, averaged over its quantile channels. One pass over the
context serves every patch, so the loss reads the tokens the probe reads.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from isoprobe.models.base import Batch, Forecast, ForecastModule
from isoprobe.models.checkpoints import export_published_network, resolve_checkpoint, scratch_fields
from isoprobe.models.kv_cache import KeyValueCache
from isoprobe.models.padding import whole_patches
from isoprobe.models.quantiles import register_level_weights
from isoprobe.models.timesfm25.config import TimesFm25Shape, official_config
from isoprobe.models.timesfm25.loading import load_network
from isoprobe.models.timesfm25.network import (
    TimesFm25Network,
    denormalise,
    normalise,
    official_name,
    running_statistics,
)

log = logging.getLogger(__name__)

#: the official model's limit on context + horizon (``TimesFM_2p5_200M_Definition``)
CONTEXT_LIMIT = 16384
#: the ``model.sizes`` entry a checkpoint whose config.json describes no architecture builds
PUBLISHED_SIZE = "official_200m"


def flip_levels(x: Tensor) -> Tensor:
    """The channels [..., 1 + Q] of ``-x``'s forecast in ``x``'s order: the mean stays, the
    quantile channels reverse (the level q of ``-x`` is the level 1 - q of ``x``)."""
    return torch.cat([x[..., :1], x[..., 1:].flip(-1)], dim=-1)


def pinball_and_squared(prediction: Tensor, target: Tensor, levels: Tensor) -> Tensor:
    """Per step: ``(y - mean)^2`` plus ``mean_q max(q e, (q - 1) e)`` with ``e = y - y_q``;
    ``prediction`` [..., 1 + Q] (mean, then the quantiles at ``levels``), ``target`` [...]."""
    squared = (prediction[..., 0] - target) ** 2
    errors = target.unsqueeze(-1) - prediction[..., 1:]
    pinball = torch.maximum(levels * errors, (levels - 1) * errors).mean(dim=-1)
    return squared + pinball


class TimesFm25Module(ForecastModule):
    """TimesFM 2.5 fine-tuning/pretraining wrapper.

    Args:
        checkpoint: ``auto`` | ``bundled`` | ``scratch`` | a local directory | a hub id.
        hub_id: the official checkpoint ``auto`` prefers when it is cached or reachable.
        bundled_name: folder of the shipped checkpoint under ``isoprobe/models/bundled``.
        size: which entry of ``sizes`` ``checkpoint=scratch`` builds.
        sizes: named shapes (:class:`TimesFm25Shape` fields): ``mini`` (the bundled one) and
            ``official_200m`` (the published one, also what a checkpoint whose config.json
            describes no architecture builds).
        force_flip_invariance, infer_is_positive, use_continuous_quantile_head: the package's
            ``ForecastConfig`` flags of the same names (module docstring).
        **base: the :class:`ForecastModule` arguments (optimizer, lengths, quantiles, freq, ...).
    """

    samples = False
    lagged = False
    stacks = ("decoder",)

    def __init__(
        self,
        checkpoint: str = "bundled",
        hub_id: str = "google/timesfm-2.5-200m-pytorch",
        bundled_name: str = "timesfm25-mini",
        size: str = "mini",
        sizes: Mapping[str, Mapping[str, Any]] | None = None,
        force_flip_invariance: bool = True,
        infer_is_positive: bool = True,
        use_continuous_quantile_head: bool = False,
        **base: Any,
    ) -> None:
        super().__init__(**base)
        self.force_flip_invariance = bool(force_flip_invariance)
        self.infer_is_positive = bool(infer_is_positive)
        self.use_continuous_quantile_head = bool(use_continuous_quantile_head)
        self.resolved_checkpoint = resolve_checkpoint(checkpoint, hub_id, bundled_name)
        published = (sizes or {}).get(PUBLISHED_SIZE, {})
        self.network: TimesFm25Network = load_network(
            self.resolved_checkpoint, scratch_fields(size, sizes), published
        )
        self._check_lengths()
        register_level_weights(self, self.shape.quantiles, "TimesFM 2.5")
        log.info("TimesFM 2.5 weights: %s", self.resolved_checkpoint.describe())

    @property
    def shape(self) -> TimesFm25Shape:
        return self.network.shape

    def _check_lengths(self) -> None:
        total = self.context_length + self.prediction_length
        if total > CONTEXT_LIMIT:
            raise ValueError(
                f"data.context_length + data.prediction_length = {total} exceeds TimesFM 2.5's "
                f"limit of {CONTEXT_LIMIT} steps: shorten the context."
            )
        reach = self.shape.output_quantile_len
        if self.use_continuous_quantile_head and self.prediction_length > reach:
            raise ValueError(
                f"model.use_continuous_quantile_head=true reaches {reach} steps, fewer than "
                f"data.prediction_length={self.prediction_length}: set it to false or shorten "
                "the horizon."
            )

    # ----------------------------------------------------------------- running the network
    def _patches(self, series: Tensor) -> tuple[Tensor, Tensor]:
        """``series`` [B, T] left-padded to whole patches: values [B, N, p] (0 where missing)
        and the missing steps [B, N, p]."""
        patch = self.shape.input_patch_len
        series = whole_patches(series, patch)
        missing = series.isnan().view(len(series), -1, patch)
        return series.nan_to_num(0.0).view(len(series), -1, patch), missing

    def _run(
        self, series: Tensor, last_only: bool = False, cache: KeyValueCache | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One pass over ``series``: the point and quantile heads [B, N, steps, 1 + Q] in each
        patch's normalised units (``last_only``: the last patch's, N = 1), and each patch's
        running mean and deviation [B, N]; with a ``cache``, the heads of the patches past the
        cached ones (:meth:`TimesFm25Network.forward`)."""
        values, missing = self._patches(series)
        mean, deviation = running_statistics(values, missing)
        normed = normalise(values, mean[..., None], deviation[..., None]).masked_fill(missing, 0)
        _, point, spread = self.network(normed, missing, last_only, cache)
        return point, spread, mean, deviation

    def _decode(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """The official ``decode``: [B, prediction_length, 1 + Q] of the point head (decoded
        autoregressively past ``output_patch_len``) and [B, output_quantile_len, 1 + Q] of the
        quantile head at the last context patch, in the batch's scale."""
        # a decoded output patch is whole input patches (the shape requires it), so appending it
        # leaves the left padding and every earlier patch as they were: the passes after the
        # first run the appended patches alone, through a KV cache
        cache = KeyValueCache()
        point, spread, mean, deviation = self._run(context, last_only=True, cache=cache)
        mean, deviation = mean[:, -1, None, None], deviation[:, -1, None, None]
        outputs = [denormalise(point[:, -1], mean, deviation)]
        spread = denormalise(spread[:, -1], mean, deviation)
        series = context
        for _ in range(math.ceil(self.prediction_length / self.shape.output_patch_len) - 1):
            series = torch.cat([series, outputs[-1][..., self.shape.decode_index]], dim=1)
            point, _, mean, deviation = self._run(series, last_only=True, cache=cache)
            step = denormalise(point[:, -1], mean[:, -1, None, None], deviation[:, -1, None, None])
            outputs.append(step)
        return torch.cat(outputs, dim=1)[:, : self.prediction_length], spread

    def _predict(self, context: Tensor) -> Tensor:
        """[B, prediction_length, 1 + Q]: the package's ``forecast`` (module docstring)."""
        if self.force_flip_invariance:  # the window and its negation decoded as one batch
            forecast, spread = self._decode(torch.cat([context, -context]))
            (forecast, flipped), (spread, flipped_spread) = forecast.chunk(2), spread.chunk(2)
            forecast = (forecast - flip_levels(flipped)) / 2
            spread = (spread - flip_levels(flipped_spread)) / 2
        else:
            forecast, spread = self._decode(context)
        if self.use_continuous_quantile_head:
            median = self.shape.decode_index
            spread = spread[:, : self.prediction_length]
            shifted = spread - spread[..., median : median + 1] + forecast[..., median : median + 1]
            keep = torch.zeros(self.shape.channels, dtype=torch.bool, device=forecast.device)
            keep[[0, median]] = True
            forecast = torch.where(keep, forecast, shifted)
        if self.infer_is_positive:
            positive = (context.nan_to_num(0.0) >= 0).all(dim=1)[:, None, None]
            forecast = torch.where(positive, forecast.clamp_min(0.0), forecast)
        return forecast

    # ----------------------------------------------------------------- the contract
    def loss(self, batch: Batch) -> Tensor:
        """The decoder-only objective of the module docstring on ``context`` then ``target``."""
        context, target = batch["context"], batch["target"]
        point, spread, mean, deviation = self._run(context)
        shape = self.shape
        patch, patches = shape.input_patch_len, point.shape[1]
        reach = max(shape.output_patch_len, shape.output_quantile_len)
        padded = F.pad(context, (patches * patch - context.shape[1], 0), value=float("nan"))
        series = F.pad(torch.cat([padded, target], dim=1), (0, reach), value=float("nan"))
        visible = self._patches(context)[1].logical_not().any(dim=-1)
        levels = torch.tensor(shape.quantiles, dtype=point.dtype, device=point.device)
        total = point.new_zeros(())
        for head in (point, spread):
            future = series[:, patch:].unfold(1, head.shape[2], patch)[:, :patches]
            observed = future.isfinite() & visible[..., None]
            scaled = normalise(future.nan_to_num(0.0), mean[..., None], deviation[..., None])
            terms = pinball_and_squared(head, scaled, levels) * observed
            total = total + terms.sum() / observed.sum().clamp_min(1)
        return total

    @torch.no_grad()
    def forecast(self, batch: Batch) -> Forecast:
        """Quantiles at ``self.quantile_levels``: the quantile channels sorted per step (so that
        crossing ones still give ordered quantiles), then linearly interpolated between the
        model's levels; the median is the 0.5 level of the same curve."""
        heads = self._predict(batch["context"])[..., 1:].sort(dim=-1).values
        quantiles = torch.einsum("bhg,lg->blh", heads, self.level_weights.to(heads.dtype))
        median = heads @ self.median_weights.to(heads.dtype)
        return Forecast(quantiles, self.quantile_levels, median)

    def probe_forward(self, batch: Batch) -> None:
        """One pass over the context (the decoding's first pass, the loss's only one)."""
        self._run(batch["context"])

    def embed_module(self) -> nn.Module:
        """The tokenizer, whose output the first block reads (positions are rotary)."""
        return self.network.tokenizer

    def stack_blocks(self, stack: str) -> Sequence[nn.Module]:
        return self.network.stacked_xf

    def self_attention_module(self, stack: str, index: int) -> nn.Module:
        """The block's attention output after ``out``, before ``post_attn_ln`` and the
        residual add."""
        return self.network.stacked_xf[index].attn

    def token_masks(self, batch: Batch, layers: Iterable[str]) -> dict[str, Tensor]:
        """One token per context patch in every layer; it is real exactly when the patch holds
        an observed value."""
        layers = list(layers)
        self.identify_layers(layers, "TimesFM 2.5")
        real = self._patches(batch["context"])[1].logical_not().any(dim=-1)
        return {name: real for name in layers}

    def input_modules(self) -> list[nn.Module]:
        """The tokenizer (TimesFM 2.5 has no other input layer)."""
        return [self.network.tokenizer]

    def head_modules(self) -> list[nn.Module]:
        """Both output projections: the point head and the quantile head."""
        return [self.network.output_projection_point, self.network.output_projection_quantiles]

    def feed_forward_modules(self) -> list[nn.Module]:
        """Every block's feed-forward (``ff0`` and ``ff1``)."""
        return [block.ff for block in self.network.stacked_xf]

    def attention_weights(self) -> dict[str, dict[str, Tensor]]:
        """Every block's fused ``qkv_proj`` split into q, k, v ([d, d] views of it) and ``out``;
        q and k are rotated, normalised per head (and q scaled per dimension) after projection."""
        weights = {}
        for i, block in enumerate(self.network.stacked_xf):
            q, k, v = block.attn.qkv_proj.weight.chunk(3, dim=0)
            weights[f"decoder.{i}"] = {"q": q, "k": k, "v": v, "o": block.attn.out.weight}
        return weights

    def export(self, directory: str, dtype: str = "float32") -> None:
        """model.safetensors with the published tensor names, and config.json with the shape."""
        export_published_network(
            self.network, directory, dtype, official_config(self.shape), official_name
        )

    # ----------------------------------------------------------------- memory
    def _tokens(self, length: int) -> int:
        return math.ceil(length / self.shape.input_patch_len)

    def _block_floats(self, tokens: int) -> int:
        """Floats one block holds for ``tokens`` tokens: the stream, norms, q/k/v and attention
        output (10 d), the feed-forward (2 hidden_dims) and the attention scores and
        probabilities (2 x heads x N^2)."""
        shape = self.shape
        per_token = 10 * shape.model_dims + 2 * shape.hidden_dims
        return tokens * per_token + 2 * shape.num_heads * tokens**2

    def _head_floats(self, tokens: int) -> int:
        """Both heads' hidden layers and outputs, with the loss's targets and errors (x 4)."""
        shape = self.shape
        outputs = (shape.output_patch_len + shape.output_quantile_len) * shape.channels
        return tokens * (2 * shape.model_dims + 4 * outputs)

    def training_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a training step: weights, gradients and AdamW's moments of what
        trains, and the activations kept for backward over the context's patches (every block,
        the tokenizer and both heads)."""
        tokens = self._tokens(self.context_length)
        shape = self.shape
        tokenizer = tokens * (4 * shape.input_patch_len + 3 * shape.model_dims)
        activations = shape.num_layers * self._block_floats(tokens) + tokenizer
        activations += self._head_floats(tokens)
        return 4 * (batch_size * activations + self.weight_floats(training=True))

    def forecast_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a forecast: the weights and, at the roll-out's longest series
        (context + horizon), one block's activations and both heads' outputs."""
        tokens = self._tokens(self.context_length + self.prediction_length)
        activations = self._block_floats(tokens) + self._head_floats(tokens)
        return 4 * (batch_size * activations + self.weight_floats(training=False))
