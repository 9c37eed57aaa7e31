"""Toto (Datadog 2025; Datadog/Toto-Open-Base-1.0) as a :class:`ForecastModule`, on isoprobe's
own network (:mod:`isoprobe.models.toto.network`); the published weights load as published,
through :mod:`isoprobe.models.toto.loading`.

A window is one variate ([B, 1, T]), left-padded (missing) to whole patches. With
``standardise`` (the default) it is first divided by its observed context's standard deviation
(its mean absolute value where that is 0; 1 for an all-zero window), and the forecast multiplied
back: the official causal scaler adds 0.1 to every variance and floors the scale at 0.1, so on
raw values the official model is not scale-equivariant, which the contract asks; ``standardise
=false`` runs the official pipeline on the raw values. The causal patch scaler then gives every
patch the mean and scale of the observed values up to its end (global clamp over the context),
and a missing step reads 0 in those scaled units, the value the official model reads at a
series' left padding; a patch without an observed value is still attended, as the official
time-wise attention masks nothing but the future.

Forecasts follow the official ``TotoForecaster.generate_samples`` with its KV cache
(:class:`~isoprobe.models.toto.network.KeyValueCache`): one pass over the window, shared by
``num_samples`` copies of it (sample-major), then per output patch one pass over the patch
appended last alone, reading the cached keys and values; one draw per copy from the mixture of
the last patch's steps mapped back by that patch's loc and scale (a draw that is not finite, or
beyond half float's range, reads 0, as the package's ``replace_extreme_values``), appended as
observed values; the global scale stays the context's. The quantiles are the draws' empirical
quantiles (:meth:`Forecast.from_samples`). The package draws every position's mixture and keeps
the last patch; isoprobe draws only the last patch's, so seeded draws differ from the package's
while following the same distribution.

The loss is the official fine-tuning objective (``TotoForFinetuning``, ``CombinedLoss``): at
every step ``t`` of the series, the mixture predicts step ``t + p`` scaled by step ``t``'s loc
and scale, ``z = (y - loc_t) / (scale_t + eps)``; per observed ``y``,
``0.575 (-log f(z)) + 0.425 log(1 + (μ - z)^2 / (2 · 0.1^2))`` (the negative log-likelihood of
the mixture ``f = Σ_k π_k t_(ν_k)(μ_k, σ_k)``, plus Barron's robust loss with α = 0, δ = 0.1 of
the mixture's mean ``μ = Σ_k π_k μ_k``), averaged over the observed targets. The series is the
context followed by the target (right-padded, missing, to whole patches), so every target step
is predicted from the step ``p`` before it, and one pass serves both the loss and the probe.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from isoprobe.models.base import Batch, Forecast, ForecastModule
from isoprobe.models.checkpoints import export_published_network, resolve_checkpoint, scratch_fields
from isoprobe.models.padding import whole_patches
from isoprobe.models.toto.config import TotoShape, official_config
from isoprobe.models.toto.loading import load_network
from isoprobe.models.toto.network import (
    KeyValueCache,
    TotoNetwork,
    causal_patch_statistics,
    mixture,
    official_name,
)

log = logging.getLogger(__name__)

#: the official loss's weight of the negative log-likelihood, and its robust loss's δ
NLL_WEIGHT, ROBUST_DELTA = 0.575, 0.1


def window_scale(context: Tensor) -> Tensor:
    """Per window [B]: the observed context's (population) standard deviation, else its mean
    absolute value, else 1; ``c`` times the window gives ``c`` times its scale."""
    observed = context.isfinite()
    count = observed.sum(-1).clamp_min(1)
    values = context.nan_to_num(0.0)
    mean = values.sum(-1) / count
    deviation = (((values - mean[:, None]) * observed) ** 2).sum(-1).div(count).sqrt()
    magnitude = values.abs().sum(-1) / count
    scale = torch.where(deviation > 0, deviation, magnitude)
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def combined_loss(
    parameters: tuple[Tensor, Tensor, Tensor, Tensor], scaled: Tensor, observed: Tensor
) -> Tensor:
    """The official ``CombinedLoss`` of the mixture ``parameters`` [..., k] at ``scaled``
    targets [...], averaged over the ``observed`` ones (module docstring)."""
    distribution = mixture(parameters)
    nll = -distribution.log_prob(scaled)
    robust = torch.log1p(0.5 * ((distribution.mean - scaled) / ROBUST_DELTA) ** 2)
    terms = (NLL_WEIGHT * nll + (1 - NLL_WEIGHT) * robust) * observed
    eps = torch.finfo(scaled.dtype).eps
    return terms.sum() / (observed.sum() + eps)


class TotoModule(ForecastModule):
    """Toto fine-tuning/pretraining wrapper.

    Args:
        checkpoint: ``auto`` | ``bundled`` | ``scratch`` | a local directory | a hub id.
        hub_id: the official checkpoint ``auto`` prefers when it is cached or reachable.
        bundled_name: folder of the shipped checkpoint under ``isoprobe/models/bundled``.
        size: which entry of ``sizes`` ``checkpoint=scratch`` builds.
        sizes: named shapes (:class:`TotoShape` fields).
        num_samples: sample paths per forecast.
        standardise: divide each window by its context's scale first (module docstring).
        **base: the :class:`ForecastModule` arguments (optimizer, lengths, quantiles, freq, ...).
    """

    samples = True
    lagged = False
    stacks = ("decoder",)

    def __init__(
        self,
        checkpoint: str = "bundled",
        hub_id: str = "Datadog/Toto-Open-Base-1.0",
        bundled_name: str = "toto-mini",
        size: str = "mini",
        sizes: Mapping[str, Mapping[str, Any]] | None = None,
        num_samples: int = 100,
        standardise: bool = True,
        **base: Any,
    ) -> None:
        super().__init__(**base)
        if int(num_samples) < 1:
            raise ValueError(f"model.num_samples={num_samples} must be at least 1")
        self.num_samples = int(num_samples)
        self.standardise = bool(standardise)
        self.resolved_checkpoint = resolve_checkpoint(checkpoint, hub_id, bundled_name)
        self.network: TotoNetwork = load_network(
            self.resolved_checkpoint, scratch_fields(size, sizes)
        )
        log.info("Toto weights: %s", self.resolved_checkpoint.describe())

    @property
    def shape(self) -> TotoShape:
        return self.network.shape

    # ----------------------------------------------------------------- running the network
    def _scale(self, context: Tensor) -> Tensor:
        """Each window's divisor [B] (1 without ``standardise``)."""
        if self.standardise:
            return window_scale(context)
        return torch.ones(len(context), dtype=context.dtype, device=context.device)

    def _series(self, context: Tensor, target: Tensor | None = None) -> Tensor:
        """[B, 1, T]: ``context`` left-padded (NaN) to whole patches, then ``target`` (if any)
        right-padded to whole patches."""
        return whole_patches(context, self.shape.patch_size, target)[:, None]

    def _run(
        self, series: Tensor, prefix: int, cache: KeyValueCache | None = None
    ) -> tuple[Tensor, tuple, Tensor, Tensor]:
        """One pass over ``series`` [B, 1, T] (NaN = missing): the last block's output, the
        mixture's parameters per step, and each step's loc and scale; ``prefix``: the steps
        the scaler's global clamp reads. With a ``cache``, the output and the parameters are
        those of the patches past the cached ones."""
        observed = series.isfinite()
        values = series.nan_to_num(0.0)
        loc, scale = causal_patch_statistics(values, observed, self.shape, prefix)
        scaled = ((values - loc) / scale).masked_fill(~observed, 0.0)
        hidden, parameters = self.network(scaled, cache)
        return hidden, parameters, loc, scale

    # ----------------------------------------------------------------- the contract
    def loss(self, batch: Batch) -> Tensor:
        """The official objective (module docstring) on ``context`` then ``target``."""
        context, target = batch["context"], batch["target"]
        divisor = self._scale(context)[:, None]
        series = self._series(context / divisor, target / divisor)
        patch = self.shape.patch_size
        prefix = context.shape[1] + -context.shape[1] % patch
        _, parameters, loc, scale = self._run(series, prefix)
        future = series[..., patch:]
        observed = future.isfinite()
        eps = torch.finfo(series.dtype).eps
        scaled = (future.nan_to_num(0.0) - loc[..., :-patch]) / (scale[..., :-patch] + eps)
        before = tuple(p[..., :-patch, :] for p in parameters)
        return combined_loss(before, scaled, observed)

    @torch.no_grad()
    def forecast(self, batch: Batch) -> Forecast:
        """``num_samples`` sample paths (module docstring) and their empirical quantiles."""
        context = batch["context"]
        divisor = self._scale(context)
        series = self._series(context / divisor[:, None])
        start, paths = series.shape[-1], self.num_samples
        patch, cache = self.shape.patch_size, KeyValueCache()
        _, parameters, loc, scale = self._run(series, start, cache)  # shared by the paths
        cache.repeat(paths)
        parameters = tuple(p[..., -patch:, :].repeat(paths, 1, 1, 1) for p in parameters)
        loc, scale = loc.repeat(paths, 1, 1), scale.repeat(paths, 1, 1)
        series = series.repeat(paths, 1, 1)
        for step in range(math.ceil(self.prediction_length / patch)):
            if step:
                _, parameters, loc, scale = self._run(series, start, cache)
            last = mixture(tuple(p[..., -patch:, :] for p in parameters))
            draw = last.sample() * scale[..., -patch:] + loc[..., -patch:]
            extreme = ~draw.isfinite() | (draw.abs() >= torch.finfo(draw.dtype).max / 2)
            series = torch.cat([series, draw.masked_fill(extreme, 0.0)], dim=-1)
        drawn = series[:, 0, start : start + self.prediction_length]
        samples = drawn.view(paths, len(context), -1).transpose(0, 1) * divisor[:, None, None]
        return Forecast.from_samples(samples, self.quantile_levels)

    def embed_module(self) -> nn.Module:
        """The patch embedding, whose output the first block reads (positions are rotary)."""
        return self.network.patch_embed.projection

    def stack_blocks(self, stack: str) -> Sequence[nn.Module]:
        return self.network.blocks

    def self_attention_module(self, stack: str, index: int) -> nn.Module:
        """The block's time-wise attention output after ``wO``, before the residual add."""
        return self.network.blocks[index].time.attention

    def token_masks(self, batch: Batch, layers: Iterable[str]) -> dict[str, Tensor]:
        """One token [B, 1, N] per patch of the loss's series (context, then target) in every
        layer; it is real exactly when the patch holds an observed value."""
        layers = list(layers)
        self.identify_layers(layers, "Toto")
        series = self._series(batch["context"], batch["target"])
        real = series.isfinite().unflatten(-1, (-1, self.shape.patch_size)).any(dim=-1)
        return {name: real for name in layers}

    def input_modules(self) -> list[nn.Module]:
        """The patch embedding (the scaler has no parameters)."""
        return [self.network.patch_embed.projection]

    def head_modules(self) -> list[nn.Module]:
        """The unembedding and the Student-T mixture head."""
        return [self.network.unembed, self.network.output_distribution]

    def feed_forward_modules(self) -> list[nn.Module]:
        """Every block's time-wise layer's SwiGLU feed-forward (a space-wise layer's is not
        listed: one per block)."""
        return [block.time.mlp for block in self.network.blocks]

    def attention_weights(self) -> dict[str, dict[str, Tensor]]:
        """Every block's time-wise ``wQKV`` split into q, k, v ([d, d] views of it; rows laid
        out (head_dim, head), heads innermost, as the package does) and ``wO``. A space-wise
        layer's projections are not listed: over isoprobe's one variate its attention is the
        softmax of a single score, each token's own value through ``wO``, so its q and k act on
        nothing and none of its projections mixes tokens."""
        weights = {}
        for i, block in enumerate(self.network.blocks):
            attention = block.time.attention
            q, k, v = attention.wQKV.weight.chunk(3, dim=0)
            weights[f"decoder.{i}"] = {"q": q, "k": k, "v": v, "o": attention.wO.weight}
        return weights

    def export(self, directory: str, dtype: str = "float32") -> None:
        """model.safetensors with the published tensor names, config.json as published."""
        export_published_network(
            self.network,
            directory,
            dtype,
            official_config(self.shape),
            lambda name: official_name(name, self.shape),
        )

    # ----------------------------------------------------------------- memory
    def _layer_floats(self, tokens: int) -> int:
        """Floats one layer holds for ``tokens`` tokens: the stream, norms, q/k/v, attention
        output (8 d), the feed-forward (5 hidden) and the attention scores and probabilities
        (2 x heads x N^2)."""
        shape = self.shape
        per_token = 8 * shape.embed_dim + 5 * shape.mlp_hidden_dim
        return tokens * per_token + 2 * shape.num_heads * tokens**2

    def _head_floats(self, steps: int) -> int:
        """The unembedding and, per step, the mixture's parameters and the loss's terms."""
        return steps * (self.shape.embed_dim + 16 * self.shape.components)

    def _patches(self, length: int) -> int:
        return math.ceil(length / self.shape.patch_size)

    def training_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a training step: weights, gradients and AdamW's moments of what
        trains, and the activations kept for backward over the context and target's patches."""
        tokens = self._patches(self.context_length) + self._patches(self.prediction_length)
        steps = tokens * self.shape.patch_size
        activations = self.shape.num_layers * self._layer_floats(tokens) + self._head_floats(steps)
        return 4 * (batch_size * activations + self.weight_floats(training=True))

    def forecast_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a forecast: the weights and, for ``num_samples`` paths at the
        roll-out's longest series, one layer's activations and the head's outputs."""
        tokens = self._patches(self.context_length) + self._patches(self.prediction_length)
        steps = tokens * self.shape.patch_size
        activations = self._layer_floats(tokens) + self._head_floats(steps)
        paths = batch_size * self.num_samples
        return 4 * (paths * activations + self.weight_floats(training=False))
