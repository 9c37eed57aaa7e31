"""Chronos-2 (Ansari et al., 2025; chronos-forecasting) as a :class:`ForecastModule`.

The model is chronos-forecasting's own ``Chronos2Model``, an encoder-only transformer: the
context is standardised per window (mean and standard deviation of its observed values,
optionally through arcsinh), cut into ``input_patch_size``-step patches (left-padded with NaN
to a whole patch), each patch with its time index and observed-mask embedded by a residual MLP;
a [REG] token follows when the config says so, then one placeholder patch per output patch
(time index only). Every block applies time self-attention (RoPE, along the sequence), group
self-attention (across the series of one group, at each position) and a feed-forward layer;
the placeholders' final states give ``len(quantiles) x output_patch_size`` values each.

Groups: isoprobe gives every window its own group (``group_ids = arange(B)``, the model's own
default), so group attention never mixes windows at the positions they observe: a window's
forecast does not depend on which other windows share its batch. Out of training, the group
attention is then computed without its attention, bit for bit
(:mod:`isoprobe.models.chronos.chronos2_group_attention`). Training uses the model's own
forward with a target: the quantile loss. Forecasts are one direct pass for the whole horizon, as
``Chronos2Pipeline.predict`` does for a horizon within the model's ``max_output_patches``.
"""

from __future__ import annotations

import copy
import functools
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
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
    check_config_keys,
    check_weights_fit,
    load_pretrained,
    pretrained_config,
    resolve_checkpoint,
    scratch_fields,
    scratch_shape,
)
from isoprobe.models.config_schema import check_pretrained_config
from isoprobe.models.quantiles import register_level_weights
from isoprobe.models.transformers_schemas import CHRONOS_2

try:
    from chronos.chronos2 import Chronos2CoreConfig, Chronos2Model
    from chronos.chronos2.config import Chronos2ForecastingConfig

    from isoprobe.models.chronos.chronos2_group_attention import skip_own_group_attention
except ImportError as err:  # chronos-forecasting missing, or older than Chronos-2
    raise ImportError(
        f"model=chronos2 needs chronos-forecasting's Chronos2Model ({err}). "
        "Install it with pip install 'chronos-forecasting>=2.1,<3'"
    ) from err

log = logging.getLogger(__name__)

ARCHITECTURE = "Chronos2Model"
#: config fields every Chronos-2 config.json has, added to a scratch size
CHRONOS2_FIELDS = {
    "architectures": [ARCHITECTURE],
    "chronos_pipeline_class": "Chronos2Pipeline",
    "feed_forward_proj": "relu",
}


class Chronos2Module(ForecastModule):
    """Chronos-2 fine-tuning/pretraining wrapper.

    Args:
        checkpoint: ``auto`` | ``bundled`` | ``scratch`` | a local HF directory | a hub id.
        hub_id: the official checkpoint ``auto`` prefers when it is cached or reachable.
        bundled_name: folder of the shipped checkpoint under ``isoprobe/models/bundled``.
        size: which entry of ``sizes`` ``checkpoint=scratch`` builds.
        sizes: named ``Chronos2CoreConfig`` fields with a ``chronos_config``
            (``Chronos2ForecastingConfig`` fields), as in the official config.json.
        sort_quantiles: sort the model's quantiles per step before they are interpolated to
            ``quantile_levels`` (crossing quantiles are no quantiles); ``False`` keeps them as
            ``Chronos2Pipeline`` does, so that forecasts are the pipeline's.
        **base: the :class:`ForecastModule` arguments (optimizer, lengths, quantiles, ...).
    """

    samples = False
    lagged = False
    stacks = ("encoder",)

    def __init__(
        self,
        checkpoint: str = "auto",
        hub_id: str = "amazon/chronos-2",
        bundled_name: str = "chronos-2-mini",
        size: str = "mini",
        sizes: Mapping[str, Mapping[str, Any]] | None = None,
        sort_quantiles: bool = True,
        **base: Any,
    ) -> None:
        super().__init__(**base)
        self.resolved_checkpoint = resolve_checkpoint(checkpoint, hub_id, bundled_name)
        self.model = _load(self.resolved_checkpoint, scratch_fields(size, sizes))
        skip_own_group_attention(self.model)  # every window its own group: see the module
        self.sort_quantiles = bool(sort_quantiles)
        config = self.model.chronos_config
        if self.context_length > config.context_length:
            log.warning(
                "data.context_length=%d is longer than this Chronos-2 checkpoint's context of %d "
                "steps: like the official model, only the last %d steps are read.",
                self.context_length,
                config.context_length,
                config.context_length,
            )
        if self._output_patches() > config.max_output_patches:
            raise ValueError(
                f"data.prediction_length={self.prediction_length} needs "
                f"{self._output_patches()} output patches of {config.output_patch_size} steps, "
                f"more than this Chronos-2 checkpoint's max_output_patches="
                f"{config.max_output_patches}: shorten the horizon, or use a size whose "
                "chronos_config.max_output_patches covers it."
            )
        grid = tuple(float(q) for q in config.quantiles)
        if 0.5 not in grid:
            raise CheckpointError(f"Chronos-2 quantiles {grid} lack the median 0.5")
        register_level_weights(self, grid, "Chronos-2", median=False)
        self.median_index = grid.index(0.5)
        self._install_taps()
        log.info("Chronos-2 weights: %s", self.resolved_checkpoint.describe())

    def _install_taps(self) -> None:
        """Identity modules of the wrapper's own (the official weights' names stay as they
        are) through which forward pre-hooks route the representations the probe reads, since
        the blocks and attention layers return ModelOutputs rather than tensors:

        - ``embed_tap``: the encoder's ``inputs_embeds`` (context patches, REG, placeholders);
        - ``block_taps[i]``: block i's hidden states, as the input of block i + 1 (of the final
          layer norm after the last block);
        - ``attention_taps[i]``: block i's time self-attention output after its ``o``
          projection, as the input of the dropout before the residual add.
        """
        encoder = self.model.encoder
        blocks = encoder.block
        self.embed_tap = nn.Identity()
        self.block_taps = nn.ModuleList(nn.Identity() for _ in blocks)
        self.attention_taps = nn.ModuleList(nn.Identity() for _ in blocks)
        encoder.register_forward_pre_hook(
            functools.partial(_embeds_through, self.embed_tap), with_kwargs=True
        )
        readers = [*blocks[1:], encoder.final_layer_norm]
        for i, block in enumerate(blocks):
            readers[i].register_forward_pre_hook(
                functools.partial(_first_argument_through, self.block_taps[i])
            )
            block.layer[0].dropout.register_forward_pre_hook(
                functools.partial(_first_argument_through, self.attention_taps[i])
            )

    # ----------------------------------------------------------------- inputs
    def _output_patches(self) -> int:
        return math.ceil(self.prediction_length / self.model.chronos_config.output_patch_size)

    def _window(self, context: Tensor) -> Tensor:
        """The last ``context_length`` steps of the model's config (what the model reads)."""
        return context[:, -self.model.chronos_config.context_length :]

    def _groups(self, context: Tensor) -> Tensor:
        """Every window its own group: group attention mixes nothing across windows."""
        return torch.arange(context.shape[0], device=context.device)

    def _patch_observed(self, context: Tensor) -> Tensor:
        """[B, P] True where a context patch holds at least one observed value (the model's
        own rule for its attention mask), patched by the model's own ``patch`` module."""
        observed = (~self._window(context).isnan()).to(context.dtype)
        return self.model.patch(observed).nan_to_num(0.0).sum(dim=-1) > 0

    # ----------------------------------------------------------------- the contract
    def loss(self, batch: Batch) -> Tensor:
        """The model's own quantile loss (its forward with ``future_target``): in the window's
        standardised scale, ``2 |(y - q_l)(1[y <= q_l] - l)|``, averaged over the horizon
        (missing steps count zero), summed over the model's levels, averaged over the batch."""
        context = self._window(batch["context"])
        return self.model(
            context=context,
            group_ids=self._groups(context),
            num_output_patches=self._output_patches(),
            future_target=batch["target"],
        ).loss

    def _heads(self, context: Tensor) -> Tensor:
        """[B, Q, prediction_length] at the model's own quantile levels."""
        context = self._window(context)
        prediction = self.model(
            context=context,
            group_ids=self._groups(context),
            num_output_patches=self._output_patches(),
        ).quantile_preds
        return prediction[..., : self.prediction_length]

    @torch.no_grad()
    def forecast(self, batch: Batch) -> Forecast:
        """Quantiles at ``self.quantile_levels``: the model's quantiles sorted per step (the
        monotone rearrangement; nothing changes where the heads do not cross; not with
        ``sort_quantiles`` off, as the pipeline), then linearly interpolated between its levels,
        as ``Chronos2Pipeline.predict_quantiles``; the median is the model's 0.5 level (the
        pipeline's point forecast)."""
        heads = self._heads(batch["context"])
        if self.sort_quantiles:
            heads = heads.sort(dim=1).values
        quantiles = torch.einsum("bgh,lg->blh", heads, self.level_weights.to(heads.dtype))
        return Forecast(quantiles, self.quantile_levels, heads[:, self.median_index])

    def embed_module(self) -> nn.Module:
        """The encoder's input embeddings [B, P + REG + N, D] (context patches, REG, future
        placeholders). This and the blocks and attention sub-layers are identity taps
        (:meth:`_install_taps`): block i's output is its hidden states after time attention,
        group attention and feed-forward; its attention sub-layer is its time self-attention
        after its ``o`` projection, before dropout and the residual add. Group attention is
        not a probe site: with one window per group it attends only to the same position of
        the same window."""
        return self.embed_tap

    def stack_blocks(self, stack: str) -> Sequence[nn.Module]:
        return self.block_taps

    def self_attention_module(self, stack: str, index: int) -> nn.Module:
        return self.attention_taps[index]

    def token_masks(self, batch: Batch, layers: Iterable[str]) -> dict[str, Tensor]:
        """Real tokens, from the context patched once: ``embed`` and every block
        [B, P + REG + N] keep the context patches that hold an observed value (not all-missing
        patches such as left padding); never REG, never the N future placeholder patches."""
        patches = self._patch_observed(batch["context"])
        special = int(self.model.chronos_config.use_reg_token) + self._output_patches()
        encoder = torch.cat([patches, patches.new_zeros(patches.shape[0], special)], dim=1)
        layers = list(layers)
        self.identify_layers(layers, "Chronos-2")
        return {name: encoder for name in layers}

    def input_modules(self) -> list[nn.Module]:
        """The patch embedding (a residual MLP) and the REG/[MASK] embedding."""
        return [self.model.shared, self.model.input_patch_embedding]

    def head_modules(self) -> list[nn.Module]:
        """``output_patch_embedding``: each placeholder's output -> its patch's quantiles."""
        return [self.model.output_patch_embedding]

    def feed_forward_modules(self) -> list[nn.Module]:
        return [block.layer[2] for block in self.model.encoder.block]

    def lora_target_modules(
        self, projections: Sequence[str] = ATTENTION_PROJECTIONS, feed_forward: bool = False
    ) -> list[nn.Module]:
        """What ``Chronos2Pipeline.fit(finetune_mode="lora")`` adapts by default: the
        ``projections`` of the time and of the group self-attention of every block and the
        head's ``output_layer``; with ``feed_forward`` also the feed-forward layers."""
        group = [
            getattr(block.layer[1].self_attention, part)
            for block in self.model.encoder.block
            for part in projections
        ]
        return [
            *super().lora_target_modules(projections, feed_forward),
            *group,
            self.model.output_patch_embedding.output_layer,
        ]

    def attention_weights(self) -> dict[str, dict[str, Tensor]]:
        """Every block's time self-attention ``q``, ``k``, ``v`` (``[H d_kv, d_model]``) and
        ``o`` (``[d_model, H d_kv]``); the projections have no bias."""
        return {
            f"encoder.{i}": {
                part: getattr(block.layer[0].self_attention, part).weight
                for part in ATTENTION_PROJECTIONS
            }
            for i, block in enumerate(self.model.encoder.block)
        }

    def export(self, directory: str, dtype: str = "float32") -> None:
        """``Chronos2Model.save_pretrained``: the official format (config.json with
        ``chronos_config``), which ``checkpoint=<directory>`` and ``Chronos2Pipeline`` load.
        ``dtype="float16"`` halves the file; loading casts back to float32."""
        export = copy.deepcopy(self.model).to(getattr(torch, dtype))
        export.save_pretrained(directory, safe_serialization=True)

    # ----------------------------------------------------------------- memory
    def _tokens(self) -> int:
        """Encoder positions of a window: its patches, REG, the output placeholders."""
        config = self.model.chronos_config
        length = min(self.context_length, config.context_length)
        patches = math.ceil(length / config.input_patch_size)
        return patches + int(config.use_reg_token) + self._output_patches()

    def _layer_floats(self, batch_size: int, kept: int) -> int:
        """Floats one encoder layer keeps for ``batch_size`` windows: ``kept`` copies of the
        time attention's scores (heads x N^2 per window) and of the group attention's
        (heads x B per position and window), and the hidden values (~ N x (8 d_model + 2 d_ff))."""
        config, tokens = self.model.config, self._tokens()
        time = config.num_heads * tokens**2
        group = config.num_heads * tokens * batch_size
        hidden = tokens * (8 * config.d_model + 2 * config.d_ff)
        return batch_size * (kept * (time + group) + hidden)

    def training_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a training step: weights, gradients and two AdamW moments of what trains
        (weight_floats), and per encoder layer the attention tensors kept for backward (scores,
        softmax, dropout output: 3 copies) and hidden values; the patch embeddings (N x (3 patch +
        d_ff + d_model)) per window."""
        config, chronos = self.model.config, self.model.chronos_config
        layers = config.num_layers * self._layer_floats(batch_size, kept=3)
        embed = batch_size * self._tokens() * (3 * chronos.input_patch_size + config.d_ff)
        weights = self.weight_floats(training=True)
        return 4 * (layers + embed + weights)

    def forecast_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a forecast: the weights and one encoder layer's attention scores
        and probabilities (2 copies) and hidden values."""
        weights = self.weight_floats(training=False)
        return 4 * (self._layer_floats(batch_size, kept=2) + weights)


def _embeds_through(tap: nn.Module, _encoder: nn.Module, args: tuple, kwargs: dict):
    """Forward pre-hook of ``Chronos2Encoder``: its ``inputs_embeds`` through ``tap``."""
    return args, {**kwargs, "inputs_embeds": tap(kwargs["inputs_embeds"])}


def _first_argument_through(tap: nn.Module, _module: nn.Module, args: tuple) -> tuple:
    """Forward pre-hook: the module's first positional input through ``tap``."""
    return (tap(args[0]), *args[1:])


def _load(resolved: ResolvedCheckpoint, scratch: Mapping[str, Any] | None) -> Chronos2Model:
    if resolved.kind == "scratch":
        fields = {**CHRONOS2_FIELDS, **copy.deepcopy(dict(scratch_shape(scratch)))}
        fields["chronos_config"] = dict(fields["chronos_config"])
        return Chronos2Model(Chronos2CoreConfig(**fields))
    source = resolved.location
    check_pretrained_config(source, CHRONOS_2)
    config = pretrained_config(
        source, "model=chronos2 loads Chronos-2 checkpoints such as amazon/chronos-2."
    )
    _check_config(config, source)
    model, info = load_pretrained(Chronos2Model, source)
    check_weights_fit(info, source)
    return model


def _check_config(config: Any, source: str) -> None:
    """Refuse a config that is not Chronos-2's, naming what it is instead."""
    architectures = getattr(config, "architectures", None) or []
    if ARCHITECTURE not in architectures or getattr(config, "chronos_config", None) is None:
        found = architectures[0] if architectures else f"model_type={config.model_type!r}"
        raise CheckpointError(
            f"{source} is not a Chronos-2 checkpoint ({found}); model=chronos2 loads "
            f"{ARCHITECTURE} checkpoints such as amazon/chronos-2 (Chronos-T5: model=chronos, "
            "Chronos-Bolt: model=chronos_bolt)."
        )
    check_config_keys(config.chronos_config, Chronos2ForecastingConfig, source, "Chronos-2")
