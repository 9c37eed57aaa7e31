"""Chronos-Bolt (Ansari et al., 2024; chronos-forecasting) as a :class:`ForecastModule`.

The model is chronos-forecasting's own ``ChronosBoltModelForForecasting``: the context is
standardised per window (mean and standard deviation of its observed values), cut into
``input_patch_size``-step patches (left-padded with NaN to a whole patch), each patch and its
observed-mask embedded by a residual MLP; a T5 encoder reads the patches and, where the config
says so, a trailing [REG] token; the T5 decoder runs a single step from one learned query token
(the decoder start embedding) that cross-attends to the encoder, and a residual MLP maps its
output to ``len(quantiles) x prediction_length`` values. Training uses the model's own
forward with a target: the quantile loss. There is no official trainer (chronos-forecasting issue
258): this wrapper is one.

Forecasts follow ``ChronosBoltPipeline.predict``: one direct pass for up to the model's
``prediction_length`` steps, and for a longer horizon its autoregressive heuristic (each
predicted quantile path appended to the context, the Q x Q resulting paths reduced to Q
empirical quantiles). The model's quantiles are then sorted per step (the monotone
rearrangement; it changes nothing where the heads do not cross; ``sort_quantiles=False`` keeps
them as the pipeline does) and taken to ``quantile_levels`` as the pipeline's
``predict_quantiles`` does: the model's own levels as they are, other levels linearly
interpolated, flat beyond the model's outermost levels (:mod:`isoprobe.models.quantiles`).
"""

from __future__ import annotations

import copy
import functools
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor, nn
from transformers import T5Config
from transformers.utils import SAFE_WEIGHTS_NAME, cached_file

from isoprobe.models.base import (
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
from isoprobe.models.quantiles import (
    is_evenly_spaced,
    quantiles_of_padded_heads,
    register_level_weights,
)
from isoprobe.models.t5_attention import (
    skip_one_position_self_attention,
    t5_cross_attention_weights,
    t5_self_attention_weights,
)
from isoprobe.models.t5_stack import lean_t5_stacks
from isoprobe.models.transformers_schemas import CHRONOS_BOLT

try:
    from chronos.chronos_bolt import ChronosBoltConfig, ChronosBoltModelForForecasting
except ImportError as err:  # chronos-forecasting missing, or older than Chronos-Bolt
    raise ImportError(
        f"model=chronos_bolt needs chronos-forecasting's ChronosBoltModelForForecasting ({err}). "
        "Install it with pip install 'chronos-forecasting>=2.0,<3'"
    ) from err

log = logging.getLogger(__name__)

ARCHITECTURE = "ChronosBoltModelForForecasting"
#: T5 settings every Chronos-Bolt has (the official config.json files), added to a scratch size
BOLT_T5_FIELDS = {
    "feed_forward_proj": "relu",
    "decoder_start_token_id": 0,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "architectures": [ARCHITECTURE],
    "chronos_pipeline_class": "ChronosBoltPipeline",
}
#: stored once (as shared.weight) and tied on load
TIED_WEIGHTS = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
#: in official files written by older transformers; the model has no language-model head
IGNORED_WEIGHTS = ("lm_head.weight",)


class ChronosBoltModule(ForecastModule):
    """Chronos-Bolt fine-tuning/pretraining wrapper.

    Args:
        checkpoint: ``auto`` | ``bundled`` | ``scratch`` | a local HF directory | a hub id.
        hub_id: the official checkpoint ``auto`` prefers when it is cached or reachable.
        bundled_name: folder of the shipped checkpoint under ``isoprobe/models/bundled``.
        size: which entry of ``sizes`` ``checkpoint=scratch`` builds.
        sizes: named ``T5Config`` fields with a ``chronos_config`` (``ChronosBoltConfig``
            fields), as in the official config.json files (``mini``: the bundled shape;
            ``official_tiny`` .. ``official_base``: the released ones).
        sort_quantiles: sort the model's quantiles per step before they are taken to
            ``quantile_levels`` (crossing quantiles are no quantiles); ``False`` keeps them as
            ``ChronosBoltPipeline`` does, so that forecasts are the pipeline's exactly.
        **base: the :class:`ForecastModule` arguments (optimizer, lengths, quantiles, ...).
    """

    samples = False
    lagged = False
    stacks = ("encoder", "decoder")

    def __init__(
        self,
        checkpoint: str = "auto",
        hub_id: str = "amazon/chronos-bolt-tiny",
        bundled_name: str = "chronos-bolt-mini",
        size: str = "mini",
        sizes: Mapping[str, Mapping[str, Any]] | None = None,
        sort_quantiles: bool = True,
        **base: Any,
    ) -> None:
        super().__init__(**base)
        self.resolved_checkpoint = resolve_checkpoint(checkpoint, hub_id, bundled_name)
        self.model = _load(self.resolved_checkpoint, scratch_fields(size, sizes))
        self.sort_quantiles = bool(sort_quantiles)
        # ``embed``: the encoder's input (patch embeddings and REG), routed through an identity
        # of the wrapper's own so that the official weights' names stay as they are
        self.embed_tap = nn.Identity()
        # The decoder reads one position per call: the key/value cache its config turns on
        # would be filled and thrown away every forward (off, in the decoder's own copy of the
        # config, not the one exported), and its self-attention is the position's own value.
        # Together a forecast takes about 15% less time, bit for bit alike.
        self.model.decoder.config.use_cache = False
        skip_one_position_self_attention(self.model.decoder.block)
        lean_t5_stacks(self.model.encoder, self.model.decoder)
        self.model.encoder.register_forward_pre_hook(
            functools.partial(_embeds_through, self.embed_tap), with_kwargs=True
        )
        bolt = self.model.chronos_config
        if self.context_length > bolt.context_length:
            log.warning(
                "data.context_length=%d is longer than this Chronos-Bolt checkpoint's context of "
                "%d steps: like the official model, only the last %d steps are read.",
                self.context_length,
                bolt.context_length,
                bolt.context_length,
            )
        if self.prediction_length > bolt.prediction_length:
            log.warning(
                "data.prediction_length=%d is longer than this Chronos-Bolt checkpoint's %d "
                "steps: the loss trains the first %d steps, and forecasts go on "
                "autoregressively as ChronosBoltPipeline.predict does.",
                self.prediction_length,
                bolt.prediction_length,
                bolt.prediction_length,
            )
        grid = register_level_weights(self, bolt.quantiles, "Chronos-Bolt")
        self.pads_heads = self._pads_heads(grid)
        log.info("Chronos-Bolt weights: %s", self.resolved_checkpoint.describe())

    def _pads_heads(self, grid: tuple[float, ...]) -> bool:
        """Whether :meth:`forecast` takes levels off the model's grid by the pipeline's rule
        (:func:`quantiles_of_padded_heads`) rather than by :func:`interpolation_matrix`: for
        unsorted heads always (it is the pipeline's), for sorted ones where the grid is evenly
        spaced (the same interpolation, with the pipeline's float rounding)."""
        if all(level in grid for level in self.quantile_levels):
            return False  # the model's own levels, picked as they are
        if self.sort_quantiles:
            return is_evenly_spaced(grid)
        if not is_evenly_spaced(grid):
            log.warning(
                "model.sort_quantiles=false on Chronos-Bolt quantiles %s, which are not evenly "
                "spaced: ChronosBoltPipeline's rule for levels off them, reproduced here, puts "
                "its heads at levels i / %d. Keep model.sort_quantiles=true to interpolate "
                "between the model's own levels.",
                grid,
                len(grid) + 1,
            )
        return True

    # ----------------------------------------------------------------- inputs and decoding
    def _window(self, context: Tensor) -> Tensor:
        """The last ``context_length`` steps of the model's config (what the model reads)."""
        return context[:, -self.model.chronos_config.context_length :]

    def _predict(self, context: Tensor) -> Tensor:
        """[B, Q, prediction_length] at the model's quantiles, as ``ChronosBoltPipeline.predict``:
        one pass for up to the model's horizon; beyond it, each of the Q quantile paths is
        appended to its context and forecast again, and the Q x Q paths of every later block are
        reduced to Q empirical quantiles (``torch.quantile``, linear)."""
        bolt = self.model.chronos_config
        levels = self.model.quantiles
        context = self._window(context)
        prediction = self.model(context=context).quantile_preds
        blocks = [prediction]
        if self.prediction_length > prediction.shape[-1]:
            context = context.unsqueeze(1).expand(-1, len(levels), -1)
        while sum(block.shape[-1] for block in blocks) < self.prediction_length:
            context = torch.cat([context, prediction], dim=-1)[..., -bolt.context_length :]
            batch, paths, length = context.shape
            prediction = self.model(context=context.reshape(batch * paths, length)).quantile_preds
            prediction = prediction.reshape(batch, paths * paths, -1)
            prediction = torch.quantile(prediction, levels.to(prediction), dim=1).transpose(0, 1)
            blocks.append(prediction)
        return torch.cat(blocks, dim=-1)[..., : self.prediction_length]

    def _patch_observed(self, context: Tensor) -> Tensor:
        """[B, P] True where a context patch holds at least one observed value (the model's
        own rule for its attention mask), patched by the model's own ``patch`` module."""
        observed = (~self._window(context).isnan()).to(context.dtype)
        return self.model.patch(observed).nan_to_num(0.0).sum(dim=-1) > 0

    # ----------------------------------------------------------------- the contract
    def loss(self, batch: Batch) -> Tensor:
        """The model's own quantile loss (its forward with a target): in the window's
        standardised scale, ``2 |(y - q_l)(1[y <= q_l] - l)|`` averaged over the model's
        levels, summed over its ``prediction_length`` steps (missing and unforecast steps count
        zero), averaged over the batch. A target longer than the model's horizon is cut to it."""
        target = batch["target"][:, : self.model.chronos_config.prediction_length]
        return self.model(context=self._window(batch["context"]), target=target).loss

    @torch.no_grad()
    def forecast(self, batch: Batch) -> Forecast:
        """Quantiles at ``self.quantile_levels``: the model's quantiles (:meth:`_predict`),
        sorted per step unless ``sort_quantiles`` is off, then taken to the levels (its own as
        they are, others linearly interpolated; :meth:`_pads_heads`); the median is the 0.5
        level of the same curve (the 0.5 head where the model has one, as the pipeline's)."""
        heads = self._predict(batch["context"])
        if self.sort_quantiles:
            heads = heads.sort(dim=1).values
        if self.pads_heads:
            quantiles = quantiles_of_padded_heads(heads, self.quantile_levels)
        else:
            quantiles = torch.einsum("bgh,lg->blh", heads, self.level_weights.to(heads.dtype))
        median = torch.einsum("bgh,g->bh", heads, self.median_weights.to(heads.dtype))
        return Forecast(quantiles, self.quantile_levels, median)

    def embed_module(self) -> nn.Module:
        """The encoder's input embeddings (an identity tap)."""
        return self.embed_tap

    def stack_blocks(self, stack: str) -> Sequence[nn.Module]:
        return getattr(self.model, stack).block

    def self_attention_module(self, stack: str, index: int) -> nn.Module:
        """``T5Attention``, which returns (its output after the ``o`` projection, ...)."""
        return self.stack_blocks(stack)[index].layer[0].SelfAttention

    def token_masks(self, batch: Batch, layers: Iterable[str]) -> dict[str, Tensor]:
        """Real tokens, from the context patched once: ``embed`` and the encoder [B, P (+ 1
        for REG)] keep the patches that hold an observed value (not all-missing patches, such
        as left padding; never REG). The decoder's one position [B, 1] is the
        learned query whose output the quantile head reads, the forecast's summary of the
        window: real when the window holds any observed value."""
        patches = self._patch_observed(batch["context"])
        encoder = patches
        if self.model.chronos_config.use_reg_token:
            encoder = torch.cat([patches, torch.zeros_like(patches[:, :1])], dim=1)
        decoder = patches.any(dim=1, keepdim=True)
        identities = self.identify_layers(layers, "Chronos-Bolt")
        return {
            name: decoder if layer.stack == "decoder" else encoder
            for name, layer in identities.items()
        }

    def input_modules(self) -> list[nn.Module]:
        """The patch embedding (a residual MLP) and the REG/decoder-start embedding."""
        return [self.model.shared, self.model.input_patch_embedding]

    def head_modules(self) -> list[nn.Module]:
        """``output_patch_embedding``: the decoder's output -> every quantile of every step."""
        return [self.model.output_patch_embedding]

    def feed_forward_modules(self) -> list[nn.Module]:
        blocks = (*self.model.encoder.block, *self.model.decoder.block)
        return [block.layer[-1] for block in blocks]

    def attention_weights(self) -> dict[str, dict[str, Tensor]]:
        """Every block's self-attention (:func:`t5_self_attention_weights`)."""
        return t5_self_attention_weights(self.model)

    def cross_attention_weights(self) -> dict[str, dict[str, Tensor]]:
        """Every decoder block's cross-attention (:func:`t5_cross_attention_weights`)."""
        return t5_cross_attention_weights(self.model.decoder.block)

    def export(self, directory: str, dtype: str = "float32") -> None:
        """``ChronosBoltModelForForecasting.save_pretrained``: the official format (config.json
        with ``chronos_config``), which ``checkpoint=<directory>`` and ``ChronosBoltPipeline``
        both load. ``dtype="float16"`` halves the file (the bundled checkpoint); loading casts
        back to float32."""
        export = copy.deepcopy(self.model).to(getattr(torch, dtype))
        export.save_pretrained(directory, safe_serialization=True)

    def _tokens(self) -> int:
        """Encoder positions of a window: its patches, plus REG."""
        bolt = self.model.chronos_config
        length = min(self.context_length, bolt.context_length)
        patches = math.ceil(length / bolt.input_patch_size)
        return patches + int(bolt.use_reg_token)

    def training_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a training step: weights, gradients and two AdamW moments of what trains
        (weight_floats), and the activations kept for backward: per encoder layer the attention
        tensors (scores, softmax, dropout output: 3 x heads x N^2) and hidden values (~ N x (8
        d_model + 2 d_ff)) for N positions; per decoder layer one position's (~ 10 d_model + 2 d_ff)
        and its cross-attention (3 x heads x N); the patch embedding (N x (4 patch + d_ff +
        d_model)) and the output head (d_ff + 2 Q H)."""
        config, bolt = self.model.config, self.model.chronos_config
        tokens, heads = self._tokens(), config.num_heads
        width, ff = config.d_model, config.d_ff
        outputs = len(bolt.quantiles) * bolt.prediction_length
        encoder = config.num_layers * (3 * heads * tokens**2 + tokens * (8 * width + 2 * ff))
        decoder = config.num_decoder_layers * (3 * heads * tokens + 10 * width + 2 * ff)
        embed = tokens * (4 * bolt.input_patch_size + ff + width) + ff + 2 * outputs
        weights = self.weight_floats(training=True)
        return 4 * (batch_size * (encoder + decoder + embed) + weights)

    def forecast_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a forecast: the weights and, per window, the largest encoder
        layer's attention scores and probabilities (2 x heads x N^2) and hidden states (N x (4
        d_model + d_ff)); a horizon beyond the model's runs Q windows per window."""
        config, bolt = self.model.config, self.model.chronos_config
        tokens = self._tokens()
        layer = 2 * config.num_heads * tokens**2 + tokens * (4 * config.d_model + config.d_ff)
        paths = len(bolt.quantiles) if self.prediction_length > bolt.prediction_length else 1
        weights = self.weight_floats(training=False)
        return 4 * (batch_size * paths * layer + weights)


def _embeds_through(tap: nn.Module, _encoder: nn.Module, args: tuple, kwargs: dict):
    """Forward pre-hook of the T5 encoder: its ``inputs_embeds`` through ``tap``."""
    return args, {**kwargs, "inputs_embeds": tap(kwargs["inputs_embeds"])}


def _load(
    resolved: ResolvedCheckpoint, scratch: Mapping[str, Any] | None
) -> ChronosBoltModelForForecasting:
    if resolved.kind == "scratch":
        config = T5Config(**{**BOLT_T5_FIELDS, **scratch_shape(scratch)})
        _check_bolt_config(config, "model.sizes")
        return ChronosBoltModelForForecasting(config)
    source = resolved.location
    check_pretrained_config(source, CHRONOS_BOLT)
    config = pretrained_config(
        source,
        "model=chronos_bolt loads Chronos-Bolt checkpoints such as amazon/chronos-bolt-small.",
    )
    _check_bolt_config(config, source)
    model, info = load_pretrained(ChronosBoltModelForForecasting, source)
    _check_weights_fit(model, info, source)
    return model


def _check_bolt_config(config: T5Config, source: str) -> None:
    """Refuse a config that is not Chronos-Bolt's, naming what it is instead."""
    fields = getattr(config, "chronos_config", None)
    architectures = getattr(config, "architectures", None) or []
    if fields is None or config.model_type != "t5":
        raise CheckpointError(
            f"{source} is not a Chronos-Bolt checkpoint (model_type={config.model_type!r}, "
            f"chronos_config {'present' if fields else 'missing'}). model=chronos_bolt loads "
            "ChronosBoltModelForForecasting checkpoints such as amazon/chronos-bolt-tiny."
        )
    if "T5ForConditionalGeneration" in architectures:
        raise CheckpointError(
            f"{source} is a Chronos-T5 checkpoint, not a Chronos-Bolt one: load it with "
            "model=chronos."
        )
    if architectures and ARCHITECTURE not in architectures:
        raise CheckpointError(
            f"{source} is a {architectures[0]} checkpoint, not a Chronos-Bolt one "
            f"({ARCHITECTURE}); Chronos-2 checkpoints load with model=chronos2."
        )
    check_config_keys(fields, ChronosBoltConfig, source, "Chronos-Bolt")
    bolt = ChronosBoltConfig(**fields)
    if list(bolt.quantiles) != sorted(bolt.quantiles):
        raise CheckpointError(f"{source}: chronos_config.quantiles {bolt.quantiles} not ascending")


def _check_weights_fit(
    model: ChronosBoltModelForForecasting, info: Mapping[str, Any], source: str
) -> None:
    """Every tensor of the architecture is in the file, with its shape, and nothing else is.

    ``ChronosBoltModelForForecasting`` tells transformers to say nothing of missing patch
    embeddings, so the names are checked against the weights file itself."""
    weights_file = cached_file(
        source, SAFE_WEIGHTS_NAME, _raise_exceptions_for_missing_entries=False
    )
    stored = set(info["unexpected_keys"])
    if weights_file is not None:
        with safe_open(weights_file, framework="pt") as file:
            stored |= set(file.keys())
    else:
        stored |= set(model.state_dict()) - set(info["missing_keys"])
    expected = set(model.state_dict()) - set(TIED_WEIGHTS)
    missing = expected - stored
    unexpected = stored - expected - set(TIED_WEIGHTS) - set(IGNORED_WEIGHTS)
    check_weights_fit(info, source, missing=list(missing), unexpected=list(unexpected))
