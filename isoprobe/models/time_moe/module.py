"""Time-MoE (Shi et al., 2024) as a :class:`ForecastModule`, on isoprobe's own network
(:mod:`isoprobe.models.time_moe.network`); published checkpoints (Maple728/TimeMoE-50M, -200M)
load as published, through :mod:`isoprobe.models.time_moe.loading`.

Forecasting follows the official README and ``generate``: each window is normalised by the mean
and (unbiased) standard deviation of its context, then rolled out autoregressively: at every
step the head with the largest horizon that still fits the steps left (the first head when none
fits; a longer head's output cut to the steps left) predicts from the last position, and its
prediction is appended to the sequence. Time-MoE is a point forecaster: every quantile is the
point forecast.

Missing values (NaN, left padding or gaps) are what the official code's ``attention_mask``
makes of padding: the value is 0 (embedding to the zero vector), no position attends to it, and
positions count only the observed steps before (``cumsum(mask) - 1``, the official
``prepare_inputs_for_generation``). A window whose context is constant (standard deviation 0)
or has a single observed value is scaled by ``|mean|`` (1 if that is 0 too).

Training is the official loss on the window ``context + target`` (normalised by the context):
every position predicts the next ``h`` steps with every head ``h`` (Huber, delta 2), averaged
over the heads, plus ``router_aux_loss_factor`` times the router's balance loss. A term counts
only where both the input step and the predicted step are observed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from isoprobe.models.base import Batch, Forecast, ForecastModule
from isoprobe.models.checkpoints import export_published_network, resolve_checkpoint, scratch_fields
from isoprobe.models.time_moe.config import official_config
from isoprobe.models.time_moe.loading import load_network
from isoprobe.models.time_moe.network import TimeMoeNetwork, balance_loss

log = logging.getLogger(__name__)

#: the official training loss's Huber threshold (``HuberLoss(delta=2.0)``)
HUBER_DELTA = 2.0


def normalisation(context: Tensor) -> tuple[Tensor, Tensor]:
    """Per-window mean and unbiased standard deviation [B, 1] of the observed context values
    (the official README's ``seqs.mean``, ``seqs.std``); a scale that is 0 or undefined falls
    back to ``|mean|``, then to 1."""
    observed = context.isfinite()
    count = observed.sum(dim=1, keepdim=True)
    filled = context.nan_to_num(0.0)
    mean = filled.sum(dim=1, keepdim=True) / count.clamp_min(1)
    squares = ((filled - mean) ** 2 * observed).sum(dim=1, keepdim=True)
    std = (squares / (count - 1).clamp_min(1)).sqrt()
    fallback = torch.where(mean.abs() > 0, mean.abs(), torch.ones_like(mean))
    scale = torch.where((count > 1) & (std > 0), std, fallback)
    return mean, scale


def positions_of(observed: Tensor) -> Tensor:
    """Each step's position: the observed steps before it (``cumsum - 1``), 1 where missing
    (the official ``prepare_inputs_for_generation``)."""
    positions = observed.long().cumsum(dim=-1) - 1
    return positions.masked_fill(~observed, 1)


def head_for(horizons: list[int], left: int) -> int:
    """The index of the head ``generate`` uses with ``left`` steps to go: the largest horizon
    not above ``left``, or the first."""
    chosen = 0
    for index, horizon in enumerate(horizons[1:], start=1):
        if horizon > left:
            break
        chosen = index
    return chosen


def shifted_windows(series: Tensor, horizon: int) -> Tensor:
    """[B, T] -> [B, T, horizon]: at t, the next ``horizon`` entries ``series[t : t + horizon]``,
    zero-padded past the end (the official ``calc_ar_loss``'s unfold)."""
    padded = F.pad(series, (0, horizon - 1))
    return padded.unfold(dimension=-1, size=horizon, step=1)


class TimeMoeModule(ForecastModule):
    """Time-MoE fine-tuning/pretraining wrapper.

    Args:
        checkpoint: ``auto`` | ``bundled`` | ``scratch`` | a local directory | a hub id.
        hub_id: the official checkpoint ``auto`` prefers when it is cached or reachable.
        bundled_name: folder of the shipped checkpoint under ``isoprobe/models/bundled``.
        size: which entry of ``sizes`` ``checkpoint=scratch`` builds.
        sizes: named config.json fields (``mini``: the bundled shape; ``official_50m``,
            ``official_200m``: the published ones).
        **base: the :class:`ForecastModule` arguments (optimizer, lengths, quantiles, freq, ...).
    """

    samples = False
    lagged = False
    stacks = ("decoder",)

    def __init__(
        self,
        checkpoint: str = "bundled",
        hub_id: str = "Maple728/TimeMoE-50M",
        bundled_name: str = "time-moe-mini",
        size: str = "mini",
        sizes: Mapping[str, Mapping[str, Any]] | None = None,
        **base: Any,
    ) -> None:
        super().__init__(**base)
        self.resolved_checkpoint = resolve_checkpoint(checkpoint, hub_id, bundled_name)
        self.network: TimeMoeNetwork = load_network(
            self.resolved_checkpoint, scratch_fields(size, sizes)
        )
        log.info("Time-MoE weights: %s", self.resolved_checkpoint.describe())

    @property
    def shape(self):
        return self.network.shape

    # ----------------------------------------------------------------- running the network
    def _inputs(self, series: Tensor, context: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``series`` normalised by ``context``'s statistics: values (0 where missing),
        observed mask, and the window's mean and scale [B, 1]."""
        mean, scale = normalisation(context)
        observed = series.isfinite()
        values = ((series - mean) / scale).nan_to_num(0.0)
        return values, observed, mean, scale

    def _hidden(self, values: Tensor, observed: Tensor) -> tuple[Tensor, list[Tensor]]:
        return self.network.model(values, observed, positions_of(observed))

    def _roll_out(self, context: Tensor) -> Tensor:
        """The point forecast [B, prediction_length] in the batch's scale."""
        values, observed, mean, scale = self._inputs(context, context)
        horizons, heads = self.shape.horizon_lengths, self.network.lm_heads
        predicted: list[Tensor] = []
        left = self.prediction_length
        while left > 0:
            hidden, _ = self._hidden(values, observed)
            step = heads[head_for(horizons, left)](hidden[:, -1])[:, :left]
            predicted.append(step)
            values = torch.cat([values, step], dim=1)
            observed = torch.cat([observed, torch.ones_like(step, dtype=torch.bool)], dim=1)
            left -= step.shape[1]
        return torch.cat(predicted, dim=1) * scale + mean

    # ----------------------------------------------------------------- the contract
    def loss(self, batch: Batch) -> Tensor:
        """The official training loss (see the module docstring) on ``context + target``."""
        context = batch["context"]
        series = torch.cat([context, batch["target"]], dim=1)
        values, observed, _, _ = self._inputs(series, context)
        inputs, read = values[:, :-1], observed[:, :-1]
        hidden, router_logits = self._hidden(inputs, read)
        labels, labelled = values[:, 1:], observed[:, 1:].float()
        terms = []
        for head, horizon in zip(self.network.lm_heads, self.shape.horizon_lengths, strict=True):
            mask = shifted_windows(labelled, horizon) * read.unsqueeze(-1)
            error = F.huber_loss(
                head(hidden), shifted_windows(labels, horizon), reduction="none", delta=HUBER_DELTA
            )
            terms.append((error * mask).sum() / mask.sum().clamp_min(1.0))
        forecast_loss = torch.stack(terms).mean()
        aux = balance_loss(router_logits, self.shape.num_experts_per_tok, read)
        return forecast_loss + self.shape.router_aux_loss_factor * aux

    @torch.no_grad()
    def forecast(self, batch: Batch) -> Forecast:
        """The point forecast of the roll-out, at every quantile level and as the median."""
        point = self._roll_out(batch["context"])
        quantiles = point.unsqueeze(1).expand(-1, len(self.quantile_levels), -1).contiguous()
        return Forecast(quantiles, self.quantile_levels, point)

    def probe_forward(self, batch: Batch) -> None:
        """One pass over the normalised context (the roll-out's first step)."""
        context = batch["context"]
        values, observed, _, _ = self._inputs(context, context)
        self._hidden(values, observed)

    def embed_module(self) -> nn.Module:
        """The gated value embedding [B, C, d] (positions are rotary, in no layer's tokens)."""
        return self.network.model.embed_layer

    def stack_blocks(self, stack: str) -> Sequence[nn.Module]:
        return self.network.model.layers

    def self_attention_module(self, stack: str, index: int) -> nn.Module:
        """The block's attention output after ``o_proj``, before the residual add."""
        return self.network.model.layers[index].self_attn

    def token_masks(self, batch: Batch, layers: Iterable[str]) -> dict[str, Tensor]:
        """One token per context step in every layer; it is real exactly when its step is
        observed."""
        layers = list(layers)
        self.identify_layers(layers, "Time-MoE")
        real = batch["context"].isfinite()
        return {name: real for name in layers}

    def training_token_masks(self, batch: Batch, layers: Iterable[str]) -> dict[str, Tensor]:
        """The loss reads ``context + target[:-1]``: the context's tokens as in
        :meth:`token_masks`, the target's none."""
        masks = self.token_masks(batch, layers)
        tail = batch["target"].shape[1] - 1
        return {name: F.pad(mask, (0, tail), value=False) for name, mask in masks.items()}

    def input_modules(self) -> list[nn.Module]:
        """The gated value embedding (Time-MoE has no other input layer)."""
        return [self.network.model.embed_layer]

    def head_modules(self) -> list[nn.Module]:
        """Every horizon's output head."""
        return list(self.network.lm_heads)

    def feed_forward_modules(self) -> list[nn.Module]:
        """Every block's mixture of experts: router, routed experts and the gated shared one."""
        return [block.ffn_layer for block in self.network.model.layers]

    def attention_weights(self) -> dict[str, dict[str, Tensor]]:
        """Every block's ``q_proj``, ``k_proj``, ``v_proj`` ([heads d_head, d_model]) and
        ``o_proj`` ([d_model, heads d_head]) weights; q and k are rotated after projection."""
        return {
            f"decoder.{i}": {
                "q": block.self_attn.q_proj.weight,
                "k": block.self_attn.k_proj.weight,
                "v": block.self_attn.v_proj.weight,
                "o": block.self_attn.o_proj.weight,
            }
            for i, block in enumerate(self.network.model.layers)
        }

    def export(self, directory: str, dtype: str = "float32") -> None:
        """The published layout: config.json (with the official ``auto_map``, so the official
        code loads the directory once its Python files are copied in) and model.safetensors."""
        export_published_network(self.network, directory, dtype, official_config(self.shape, dtype))

    # ----------------------------------------------------------------- memory
    def _per_token_floats(self, training: bool) -> int:
        """Floats one token holds in one block: residual, norms, q/k/v/o, the shared expert
        (3 x intermediate), the top-k routed experts (3 x expert width each) and the router."""
        shape = self.shape
        width = shape.hidden_size
        experts = shape.num_experts_per_tok * (3 * shape.expert_size + width)
        floats = 8 * width + 3 * shape.intermediate_size + experts + 2 * shape.num_experts
        return floats if training else floats // 2

    def training_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a training step: weights, gradients and AdamW's moments of what
        trains, and per block the activations kept for backward over the C + H - 1 tokens:
        :meth:`_per_token_floats` and the attention scores and probabilities (2 x heads x T^2),
        plus every head's predictions, targets and errors (4 x T x horizon)."""
        shape = self.shape
        tokens = self.context_length + self.prediction_length - 1
        block = tokens * self._per_token_floats(True)
        block += 2 * shape.num_attention_heads * tokens**2
        heads = 4 * tokens * sum(shape.horizon_lengths)
        activations = batch_size * (shape.num_hidden_layers * block + heads)
        return 4 * (activations + self.weight_floats(training=True))

    def forecast_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a forecast: the weights and, at the roll-out's longest sequence
        (C + H tokens), one block's hidden values and attention scores and probabilities."""
        shape = self.shape
        tokens = self.context_length + self.prediction_length
        block = tokens * self._per_token_floats(False) + 2 * shape.num_attention_heads * tokens**2
        return 4 * (batch_size * block + self.weight_floats(training=False))
