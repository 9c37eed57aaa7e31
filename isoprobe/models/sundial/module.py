"""Sundial (THUML 2025, ``thuml/sundial-base-128m``) as a :class:`ForecastModule`, on isoprobe's
own network (:mod:`isoprobe.models.sundial.network`); the published weights load as published,
through :mod:`isoprobe.models.sundial.loading`.

Each window is normalised by the mean and (population) standard deviation of its observed
context (1 where that is 0), the forecast mapped back: scale-equivariant. The official
``generate`` divides by the standard deviation plus 1e-5, which breaks that equivariance for
small series and changes nothing else (a relative 1e-5 / σ of the inputs). The series is
left-padded to whole tokens of ``input_token_len`` steps; a padded or missing step reads 0 with
its mask bit 0 (the official code's left padding; it has no missing values inside a series).

Forecasts follow the official ``generate``: per call, the last token's final state conditions
the flow head, which draws ``num_samples`` outputs of ``output_token_lens[-1]`` steps (one
normal draw of [S · B, P], sample-major, and ``num_sampling_steps`` Euler steps, as the official
``FlowLoss.sample``); a horizon past one call is rolled out by appending the draws' per-step
median (the lower middle value, ``torch.median``) to the series and calling again, and the
calls' draws are joined. The official code caches keys and values between calls; isoprobe runs
the whole series again, which gives the same states where the context is whole tokens (the
official cache slices a left-padded context's appended steps off by the padding). The quantiles
are the draws' empirical quantiles (:meth:`Forecast.from_samples`).

The loss is the official pretraining objective (``SundialForPrediction.forward`` with labels,
``FlowLoss``) on the series context then target, normalised by the context's statistics and
right-padded (missing) to whole tokens: every token but the last is an input, and the flow
head learns the ``P`` steps after each input token, ``diffusion_batch_mul`` draws of noise and
time per token (drawn as the official code draws them: noise [M · B · N, P], then times
[M · B · N], copies outermost), each step ``j`` weighted ``1/j``, missing or padded steps left
out, averaged over the tokens whose next steps hold an observed value.
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
from isoprobe.models.padding import whole_patches
from isoprobe.models.sundial.config import SundialShape, official_config
from isoprobe.models.sundial.loading import load_network
from isoprobe.models.sundial.network import SundialNetwork, flow_matching_loss, official_name

log = logging.getLogger(__name__)


def context_statistics(context: Tensor) -> tuple[Tensor, Tensor]:
    """Per window [B]: the observed context's mean and population standard deviation (1
    where that is 0; mean 0 and deviation 1 for a window without an observed value)."""
    observed = context.isfinite()
    count = observed.sum(-1).clamp_min(1)
    values = context.nan_to_num(0.0)
    mean = values.sum(-1) / count
    deviation = (((values - mean[:, None]) * observed) ** 2).sum(-1).div(count).sqrt()
    return mean, torch.where(deviation > 0, deviation, torch.ones_like(deviation))


class SundialModule(ForecastModule):
    """Sundial fine-tuning/pretraining wrapper.

    Args:
        checkpoint: ``auto`` | ``bundled`` | ``scratch`` | a local directory | a hub id.
        hub_id: the official checkpoint ``auto`` prefers when it is cached or reachable.
        bundled_name: folder of the shipped checkpoint under ``isoprobe/models/bundled``.
        size: which entry of ``sizes`` ``checkpoint=scratch`` builds.
        sizes: named shapes (:class:`SundialShape` fields).
        num_samples: sample paths per forecast.
        **base: the :class:`ForecastModule` arguments (optimizer, lengths, quantiles, freq, ...).
    """

    samples = True
    lagged = False
    stacks = ("decoder",)

    def __init__(
        self,
        checkpoint: str = "bundled",
        hub_id: str = "thuml/sundial-base-128m",
        bundled_name: str = "sundial-mini",
        size: str = "mini",
        sizes: Mapping[str, Mapping[str, Any]] | None = None,
        num_samples: int = 100,
        **base: Any,
    ) -> None:
        super().__init__(**base)
        if int(num_samples) < 1:
            raise ValueError(f"model.num_samples={num_samples} must be at least 1")
        self.num_samples = int(num_samples)
        self.resolved_checkpoint = resolve_checkpoint(checkpoint, hub_id, bundled_name)
        self.network: SundialNetwork = load_network(
            self.resolved_checkpoint, scratch_fields(size, sizes)
        )
        log.info("Sundial weights: %s", self.resolved_checkpoint.describe())

    @property
    def shape(self) -> SundialShape:
        return self.network.shape

    # ----------------------------------------------------------------- running the network
    def _series(self, context: Tensor, target: Tensor | None = None) -> Tensor:
        """[B, T]: ``context`` left-padded (NaN) to whole tokens, then ``target`` (if any)
        right-padded to whole tokens."""
        return whole_patches(context, self.shape.input_token_len, target)

    def _states(self, series: Tensor) -> Tensor:
        """The last layer's output [B, N, d] at each token of ``series`` [B, T] (NaN =
        missing)."""
        return self.network(series.nan_to_num(0.0), series.isfinite())

    def _inputs(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """The loss's series (normalised context, then target) and its input part: every
        token but the last."""
        mean, deviation = context_statistics(batch["context"])
        series = self._series(batch["context"], batch["target"])
        series = (series - mean[:, None]) / deviation[:, None]
        return series, series[:, : -self.shape.input_token_len]

    # ----------------------------------------------------------------- the contract
    def loss(self, batch: Batch) -> Tensor:
        """The official flow-matching objective (module docstring) on ``context`` then
        ``target``."""
        series, inputs = self._inputs(batch)
        states = self._states(inputs)
        token, length = self.shape.input_token_len, self.shape.output_length
        future = F.pad(series[:, token:], (0, max(length - token, 0)), value=math.nan)
        targets = future.unfold(-1, length, token)[:, : states.shape[1]]
        copies = self.shape.diffusion_batch_mul
        targets = targets.flatten(0, 1).repeat(copies, 1)
        states = states.flatten(0, 1).repeat(copies, 1)
        noise = torch.randn_like(targets)
        t = torch.rand(len(targets), device=targets.device)
        observed = targets.isfinite()
        return flow_matching_loss(
            self.network.head, states, targets.nan_to_num(0.0), observed, noise, t
        )

    def probe_forward(self, batch: Batch) -> None:
        """The loss's pass through the backbone (its input tokens), without the flow head,
        whose noise and time draws would move the random state."""
        self._states(self._inputs(batch)[1])

    @torch.no_grad()
    def forecast(self, batch: Batch) -> Forecast:
        """``num_samples`` sample paths (module docstring) and their empirical quantiles."""
        context = batch["context"]
        mean, deviation = context_statistics(context)
        series = (context - mean[:, None]) / deviation[:, None]
        pieces, made = [], 0
        while made < self.prediction_length:
            last = self._states(self._series(series))[:, -1]
            drawn = self.network.head.sample(last, self.num_samples)
            drawn = drawn[..., : self.prediction_length - made]
            pieces.append(drawn)
            made += drawn.shape[-1]
            series = torch.cat([series, drawn.median(dim=1).values], dim=-1)
        samples = torch.cat(pieces, dim=-1) * deviation[:, None, None] + mean[:, None, None]
        return Forecast.from_samples(samples, self.quantile_levels)

    def embed_module(self) -> nn.Module:
        """The patch embedding, whose output the first layer reads (positions are rotary)."""
        return self.network.embed_layer

    def stack_blocks(self, stack: str) -> Sequence[nn.Module]:
        return self.network.layers

    def self_attention_module(self, stack: str, index: int) -> nn.Module:
        """The layer's self-attention after ``o_proj``, before the residual add."""
        return self.network.layers[index].self_attn

    def token_masks(self, batch: Batch, layers: Iterable[str]) -> dict[str, Tensor]:
        """One token [B, N] per input token of the loss (every token of the context then the
        target but the last); it is real exactly when it holds an observed value."""
        layers = list(layers)
        self.identify_layers(layers, "Sundial")
        token = self.shape.input_token_len
        inputs = self._series(batch["context"], batch["target"])[:, :-token]
        real = inputs.isfinite().unflatten(-1, (-1, token)).any(dim=-1)
        return {name: real for name in layers}

    def input_modules(self) -> list[nn.Module]:
        """The patch embedding."""
        return [self.network.embed_layer]

    def head_modules(self) -> list[nn.Module]:
        """The head: the final norm and the flow network."""
        return [self.network.head]

    def feed_forward_modules(self) -> list[nn.Module]:
        return [layer.ffn_layer for layer in self.network.layers]

    def attention_weights(self) -> dict[str, dict[str, Tensor]]:
        """Every layer's ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj`` weights."""
        weights = {}
        for i, layer in enumerate(self.network.layers):
            attention = layer.self_attn
            weights[f"decoder.{i}"] = {
                "q": attention.q_proj.weight,
                "k": attention.k_proj.weight,
                "v": attention.v_proj.weight,
                "o": attention.o_proj.weight,
            }
        return weights

    def export(self, directory: str, dtype: str = "float32") -> None:
        """model.safetensors with the published tensor names, config.json as published."""
        export_published_network(
            self.network,
            directory,
            dtype,
            {**official_config(self.shape), "torch_dtype": dtype},
            official_name,
        )

    # ----------------------------------------------------------------- memory
    def _tokens(self, length: int) -> int:
        return math.ceil(length / self.shape.input_token_len)

    def _layer_floats(self, tokens: int) -> int:
        """Floats one layer holds for ``tokens`` tokens: the stream, norms, q/k/v, attention
        output (8 d), the feed-forward (3 hidden) and the attention scores and probabilities
        (2 x heads x N^2)."""
        shape = self.shape
        per_token = 8 * shape.hidden_size + 3 * shape.intermediate_size
        return tokens * per_token + 2 * shape.num_attention_heads * tokens**2

    def _head_floats(self, rows: int) -> int:
        """The flow head's activations for ``rows`` rows: its blocks' streams, modulations and
        hidden layers (about 10 d per block and 8 d more), the time features and the output."""
        shape = self.shape
        width = (10 * shape.flow_loss_depth + 8) * shape.hidden_size
        return rows * (width + 256 + 4 * shape.output_length)

    def training_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a training step: weights, gradients and AdamW's moments of what
        trains, and the activations kept for backward over the input tokens and the head's
        ``diffusion_batch_mul`` rows per token."""
        tokens = self._tokens(self.context_length) + self._tokens(self.prediction_length)
        layers = self.shape.num_hidden_layers * self._layer_floats(tokens)
        head = self._head_floats(tokens * self.shape.diffusion_batch_mul)
        return 4 * (batch_size * (layers + head) + self.weight_floats(training=True))

    def forecast_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a forecast: the weights, one layer's activations over the
        roll-out's longest series and the head's for ``num_samples`` rows per window."""
        tokens = self._tokens(self.context_length) + self._tokens(self.prediction_length)
        activations = self._layer_floats(tokens) + self._head_floats(self.num_samples)
        return 4 * (batch_size * activations + self.weight_floats(training=False))
