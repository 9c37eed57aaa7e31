"""TimesFM (Das et al., 2024) as a :class:`ForecastModule`, on transformers'
``TimesFmModelForPrediction`` (the official PyTorch port of TimesFM 2.0).

TimesFM is a decoder-only transformer over input patches of ``patch_length`` (32) steps. A window
is left-padded (or truncated) to the checkpoint's ``context_length`` exactly as the official
``forward`` does; the model normalises it by the mean and standard deviation of its first patch
with at least three observed values, and the last patch's output head emits ``horizon_length``
steps of a mean and of the quantiles ``config.quantiles``, decoded autoregressively (the mean
appended to the context) when the horizon is longer. Missing values (NaN) are padding: zero with
padding indicator 1, as the official preprocessing pads a short series.
"""

from __future__ import annotations

import copy
import logging
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from pandas.tseries import offsets
from pandas.tseries.frequencies import to_offset
from torch import Tensor, nn

from isoprobe.models.base import (
    ATTENTION_PROJECTIONS,
    Batch,
    Forecast,
    ForecastModule,
)
from isoprobe.models.checkpoints import (
    CheckpointError,
    ResolvedCheckpoint,
    check_weights_fit,
    load_pretrained,
    pretrained_config,
    resolve_checkpoint,
    scratch_fields,
    scratch_shape,
)
from isoprobe.models.config_schema import check_pretrained_config
from isoprobe.models.quantiles import register_level_weights
from isoprobe.models.transformers_schemas import TIMESFM

try:
    from transformers import TimesFmConfig, TimesFmModelForPrediction
except ImportError as err:  # transformers without TimesFM
    raise ImportError(
        f"model=timesfm needs transformers' TimesFmModelForPrediction ({err}). Install it with "
        "pip install -U 'transformers>=5,<6'"
    ) from err

log = logging.getLogger(__name__)

#: TimesFM's frequency categories: 0 high (up to daily), 1 medium (weekly, monthly),
#: 2 low (quarterly, yearly)
HIGH, MEDIUM, LOW = 0, 1, 2
_CATEGORY_OFFSETS: tuple[tuple[int, tuple[type, ...]], ...] = (
    (
        HIGH,
        (
            offsets.Tick,
            offsets.Day,
            offsets.BusinessDay,
            offsets.CustomBusinessDay,
            offsets.BusinessHour,
            offsets.CustomBusinessHour,
        ),
    ),
    (
        MEDIUM,
        (
            offsets.Week,
            offsets.WeekOfMonth,
            offsets.LastWeekOfMonth,
            offsets.MonthEnd,
            offsets.MonthBegin,
            offsets.BusinessMonthEnd,
            offsets.BusinessMonthBegin,
            offsets.CustomBusinessMonthEnd,
            offsets.CustomBusinessMonthBegin,
            offsets.SemiMonthEnd,
            offsets.SemiMonthBegin,
        ),
    ),
    (
        LOW,
        (
            offsets.QuarterEnd,
            offsets.QuarterBegin,
            offsets.BQuarterEnd,
            offsets.BQuarterBegin,
            offsets.YearEnd,
            offsets.YearBegin,
            offsets.BYearEnd,
            offsets.BYearBegin,
            offsets.FY5253,
            offsets.FY5253Quarter,
        ),
    ),
)
_CATEGORY_HELP = (
    "TimesFM's frequency category (0 high: up to daily, 1 medium: weekly/monthly, 2 low: "
    "quarterly/yearly)"
)


def frequency_category(freq: str | None) -> int:
    """TimesFM's frequency category of a pandas offset alias (``30min``, ``h``, ``D``, ``B`` ->
    0; ``W``, ``M``/``ME``, ``MS`` -> 1; ``Q``, ``Y``/``YE`` -> 2), by the offset's base unit
    (a multiple such as ``2W`` keeps its unit's category). ``None`` (unknown) -> 0, the official
    default, with a warning; a string pandas cannot parse raises ``ValueError``."""
    if freq is None:
        log.warning(
            "the data set's frequency is unknown: TimesFM uses frequency category 0 (high), its "
            "default. Set model.freq_category=0|1|2 if the data is weekly/monthly or coarser."
        )
        return HIGH
    try:
        with warnings.catch_warnings():  # 'H', 'M', 'Y', ... are deprecated aliases, still valid
            warnings.simplefilter("ignore", FutureWarning)
            offset = to_offset(freq)
    except ValueError:
        raise ValueError(
            f"the data frequency {freq!r} is not a pandas offset alias, so {_CATEGORY_HELP} is "
            "unknown. Set model.freq_category=0|1|2."
        ) from None
    for category, kinds in _CATEGORY_OFFSETS:
        if isinstance(offset, kinds):
            return category
    raise ValueError(
        f"the data frequency {freq!r} ({type(offset).__name__}) has no {_CATEGORY_HELP}. Set "
        "model.freq_category=0|1|2."
    )


class TimesFmModule(ForecastModule):
    """TimesFM fine-tuning/pretraining wrapper.

    Args:
        checkpoint: ``auto`` | ``bundled`` | ``scratch`` | a local HF directory | a hub id.
        hub_id: the official checkpoint ``auto`` prefers when it is cached or reachable.
        bundled_name: folder of the shipped checkpoint under ``isoprobe/models/bundled``.
        size: which entry of ``sizes`` ``checkpoint=scratch`` builds.
        sizes: named ``TimesFmConfig`` fields (``mini``: the bundled shape; ``official``: the
            2.0-500m shape).
        freq_category: TimesFM's frequency category (0, 1, 2); None derives it from ``freq``
            (:func:`frequency_category`).
        **base: the :class:`ForecastModule` arguments (optimizer, lengths, quantiles, freq, ...).
    """

    samples = False
    lagged = False
    stacks = ("decoder",)

    def __init__(
        self,
        checkpoint: str = "auto",
        hub_id: str = "google/timesfm-2.0-500m-pytorch",
        bundled_name: str = "timesfm-mini",
        size: str = "mini",
        sizes: Mapping[str, Mapping[str, Any]] | None = None,
        freq_category: int | None = None,
        **base: Any,
    ) -> None:
        super().__init__(**base)
        self.resolved_checkpoint = resolve_checkpoint(checkpoint, hub_id, bundled_name)
        self.model = _load(self.resolved_checkpoint, scratch_fields(size, sizes))
        config = self.model.config
        if freq_category is None:
            freq_category = frequency_category(self.freq)
        if freq_category not in range(config.freq_size):
            raise ValueError(
                f"model.freq_category={freq_category} is not one of TimesFM's categories "
                f"0..{config.freq_size - 1}"
            )
        self.freq_category = int(freq_category)
        if self.context_length > config.context_length:
            log.warning(
                "data.context_length=%d is longer than this TimesFM checkpoint's context of %d "
                "steps: like the official forward, only the last %d steps are read.",
                self.context_length,
                config.context_length,
                config.context_length,
            )
        register_level_weights(self, config.quantiles, "TimesFM")
        log.info("TimesFM weights: %s", self.resolved_checkpoint.describe())

    # ----------------------------------------------------------------- inputs and decoding
    def _inputs(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """The window as the official preprocessing makes it: the last ``context_length`` steps,
        left-padded to ``context_length``; values [B, L] (0 where missing), padding [B, L]
        (1.0 = padding or missing)."""
        length = self.model.config.context_length
        context = context[:, -length:]
        missing = length - context.shape[1]
        if missing:
            context = nn.functional.pad(context, (missing, 0), value=float("nan"))
        padding = context.isnan()
        return context.nan_to_num(0.0), padding.to(context.dtype)

    def _frequencies(self, batch_size: int) -> Tensor:
        return torch.full((batch_size, 1), self.freq_category, dtype=torch.long, device=self.device)

    def _decode_once(self, values: Tensor, padding: Tensor) -> Tensor:
        """One decoder pass: the last patch's outputs [B, horizon_length, 1 + Q] (mean, then
        ``config.quantiles``) in the window's scale."""
        model = self.model
        out = model.decoder(
            past_values=values, past_values_padding=padding, freq=self._frequencies(len(values))
        )
        head = model.horizon_ff_layer(out.last_hidden_state[:, -1])
        head = head.view(len(values), model.config.horizon_length, -1)
        return head * out.scale.view(-1, 1, 1) + out.loc.view(-1, 1, 1)

    def _predict(self, context: Tensor) -> Tensor:
        """[B, prediction_length, 1 + Q]: mean and quantiles, decoded in steps of
        ``horizon_length`` with each step's mean appended to the context (the official loop)."""
        values, padding = self._inputs(context)
        length, step = values.shape[1], self.model.config.horizon_length
        outputs = []
        for _ in range(math.ceil(self.prediction_length / step)):
            outputs.append(self._decode_once(values[:, -length:], padding[:, -length:]))
            values = torch.cat([values, outputs[-1][..., 0]], dim=1)
            padding = torch.cat([padding, padding.new_zeros(len(padding), step)], dim=1)
        return torch.cat(outputs, dim=1)[:, : self.prediction_length]

    # ----------------------------------------------------------------- the contract
    def loss(self, batch: Batch) -> Tensor:
        """The official ``forward``'s loss on ``future_values``: the mean squared error of the
        mean forecast plus the pinball loss averaged over ``config.quantiles``,
        ``mean_q mean_t max((q - 1) e, q e)`` with ``e = target - quantile``; missing targets
        are left out of both means."""
        predictions = self._predict(batch["context"])
        target = batch["target"]
        observed = ~target.isnan()
        target = target.nan_to_num(0.0)
        count = observed.sum().clamp_min(1)
        squared = ((predictions[..., 0] - target) ** 2 * observed).sum() / count
        levels = torch.tensor(self.model.config.quantiles, dtype=target.dtype, device=target.device)
        errors = target.unsqueeze(-1) - predictions[..., 1:]
        pinball = torch.maximum((levels - 1) * errors, levels * errors)
        quantile = (pinball * observed.unsqueeze(-1)).sum() / (count * len(levels))
        return squared + quantile

    @torch.no_grad()
    def forecast(self, batch: Batch) -> Forecast:
        """Quantiles at ``self.quantile_levels``: TimesFM's quantile heads sorted per step (the
        monotone rearrangement, so crossing heads still give ordered quantiles), then linearly
        interpolated between its levels (:func:`isoprobe.models.quantiles.interpolation_matrix`);
        the median is the 0.5 level of the same curve (TimesFM's mean head is not used)."""
        heads = self._predict(batch["context"])[..., 1:].sort(dim=-1).values
        quantiles = torch.einsum("bhg,lg->blh", heads, self.level_weights.to(heads.dtype))
        median = heads @ self.median_weights.to(heads.dtype)
        return Forecast(quantiles, self.quantile_levels, median)

    def probe_forward(self, batch: Batch) -> None:
        """One decoder pass over the context (the first decoding step), so every probed module
        runs exactly once even when the horizon takes several steps."""
        self._decode_once(*self._inputs(batch["context"]))

    def embed_module(self) -> nn.Module:
        """The patch embedding ``input_ff_layer``, whose output the model adds the frequency
        embedding to in place before the first block."""
        return self.model.decoder.input_ff_layer

    def stack_blocks(self, stack: str) -> Sequence[nn.Module]:
        return self.model.decoder.layers

    def self_attention_module(self, stack: str, index: int) -> nn.Module:
        """``TimesFmAttention``, which returns (its output after ``o_proj``, weights)."""
        return self.model.decoder.layers[index].self_attn

    def token_masks(self, batch: Batch, layers: Iterable[str]) -> dict[str, Tensor]:
        """Every layer's tokens are the input patches [B, context_length / patch_length]; a
        patch is real when it holds at least one observed value (the model's own rule: a patch
        is padding only when all of its steps are). There are no special tokens."""
        _, padding = self._inputs(batch["context"])
        patches = padding.view(len(padding), -1, self.model.config.patch_length)
        real = ~patches.bool().all(dim=-1)
        layers = list(layers)
        self.identify_layers(layers, "TimesFM")
        return {name: real for name in layers}

    def input_modules(self) -> list[nn.Module]:
        """The patch embedding (a residual MLP) and the frequency embedding."""
        return [self.model.decoder.input_ff_layer, self.model.decoder.freq_emb]

    def head_modules(self) -> list[nn.Module]:
        """``horizon_ff_layer``: each patch's output -> the mean and quantiles of what follows."""
        return [self.model.horizon_ff_layer]

    def feed_forward_modules(self) -> list[nn.Module]:
        return [layer.mlp for layer in self.model.decoder.layers]

    def attention_weights(self) -> dict[str, dict[str, Tensor]]:
        """Every layer's ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj`` weights ([H d_head,
        d_model] and [d_model, H d_head]). TimesFM also scales each query dimension by
        ``softplus(scaling) / sqrt(d_head)`` (a learned per-dimension factor) after ``q_proj``;
        that diagonal factor is not folded into ``q``."""
        return {
            f"decoder.{i}": {
                part: getattr(layer.self_attn, f"{part}_proj").weight
                for part in ATTENTION_PROJECTIONS
            }
            for i, layer in enumerate(self.model.decoder.layers)
        }

    def export(self, directory: str, dtype: str = "float32") -> None:
        """``TimesFmModelForPrediction.save_pretrained``: the official format, which
        ``checkpoint=<directory>`` and transformers both load. ``dtype="float16"`` halves the
        file (the bundled checkpoint); loading casts back to float32."""
        export = copy.deepcopy(self.model).to(getattr(torch, dtype))
        export.save_pretrained(directory, safe_serialization=True)

    def training_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a training step: weights, gradients and two AdamW moments of what trains
        (weight_floats), and per decoding step (``ceil(horizon / horizon_length)``) the activations
        kept for backward: per layer ~ N x (8 d_model + 2 d_ff) hidden values and the attention
        scores and probabilities (2 x heads x N^2) for N patches, plus the input block (N x (2 patch
        + d_ff + d_model))."""
        config = self.model.config
        tokens = config.context_length // config.patch_length
        width, ff = config.hidden_size, config.intermediate_size
        heads, depth = config.num_attention_heads, config.num_hidden_layers
        steps = math.ceil(self.prediction_length / config.horizon_length)
        layer = tokens * (8 * width + 2 * ff) + 2 * heads * tokens**2
        embed = tokens * (2 * config.patch_length + ff + width)
        activations = batch_size * steps * (depth * layer + embed)
        weights = self.weight_floats(training=True)
        return 4 * (activations + weights)

    def forecast_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a forecast: the weights and, of the largest layer, its hidden
        states and feed-forward (N x (4 d_model + d_ff)) and attention scores and
        probabilities (2 x heads x N^2), per window."""
        config = self.model.config
        tokens = config.context_length // config.patch_length
        width, ff, heads = config.hidden_size, config.intermediate_size, config.num_attention_heads
        layer = tokens * (4 * width + ff) + 2 * heads * tokens**2
        weights = self.weight_floats(training=False)
        return 4 * (batch_size * layer + weights)


def _load(resolved: ResolvedCheckpoint, scratch: Mapping[str, Any] | None) -> nn.Module:
    if resolved.kind == "scratch":
        config = TimesFmConfig(**scratch_shape(scratch))
        _check_patches(config, "model.sizes")
        return TimesFmModelForPrediction(config)
    source = resolved.location
    check_pretrained_config(source, TIMESFM)
    config = pretrained_config(
        source,
        "model=timesfm loads TimesFM 2.0 checkpoints such as google/timesfm-2.0-500m-pytorch.",
    )
    if config.model_type != "timesfm":
        raise CheckpointError(
            f"{source} is not a TimesFM 2.0 checkpoint (model_type={config.model_type!r}). "
            "model=timesfm loads TimesFmModelForPrediction checkpoints such as "
            "google/timesfm-2.0-500m-pytorch."
        )
    _check_patches(config, source)
    model, info = load_pretrained(TimesFmModelForPrediction, source)
    check_weights_fit(info, source)
    return model


def _check_patches(config: TimesFmConfig, source: str) -> None:
    if config.context_length % config.patch_length:
        raise CheckpointError(
            f"{source}: TimesFM's context_length {config.context_length} is not a multiple of "
            f"its patch_length {config.patch_length}"
        )
