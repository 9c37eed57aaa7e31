"""PatchTST (Nie et al., 2023), transformers' ``PatchTSTForPrediction``, as a ForecastModule.

The model is channel-independent: the univariate context ``[B, L]`` is one channel ``[B, L, 1]``,
standardised per window by the model's own scaler over its observed values, cut into
``patch_length``-step patches every ``patch_stride`` steps, each patch embedded linearly (plus a
positional encoding), read by a Transformer encoder whose outputs are ``[B, C, P, D]`` (C = 1),
and a linear head maps the flattened encoder output to the horizon.

Objective (``model.loss``): ``mse`` (default; the model emits a point forecast, so every
quantile level is that point forecast and WQL equals a scaled MAE) or ``nll``, the model's
distribution head (``distribution_output``: ``student_t`` | ``normal``) trained by negative
log-likelihood, whose forecasts are quantiles of ``num_samples`` samples.

Missing values: NaNs are filled with the window's observed mean before the model's scaler, so
they become 0 after it, and ``past_observed_mask`` makes the scaler ignore them.

In evaluation the encoder's batch norm is the affine map of its running statistics, without
transposes, the same numbers to float rounding (:mod:`isoprobe.models.patchtst_inference`), and
where nothing watches the encoder's modules it runs as one lean function over the same weights
(:mod:`isoprobe.models.patchtst_encoder`, the same numbers to float rounding); training, probe
hooks and attentions or hidden states asked for run the official forward.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PatchTSTConfig, PatchTSTForPrediction

from isoprobe.models.base import Batch, Forecast, ForecastModule
from isoprobe.models.checkpoints import (
    CheckpointError,
    check_weights_fit,
    load_pretrained,
    pretrained_config,
    resolve_checkpoint,
    scratch_fields,
    scratch_shape,
)
from isoprobe.models.config_schema import check_pretrained_config
from isoprobe.models.patchtst_encoder import lean_encoder
from isoprobe.models.patchtst_inference import use_inference_kernels
from isoprobe.models.transformers_schemas import PATCHTST

log = logging.getLogger(__name__)

#: model.loss: the objective of the head
LOSSES = ("mse", "nll")
#: distribution heads the forecasts can sample from
DISTRIBUTIONS = ("student_t", "normal")


class PatchTSTModule(ForecastModule):
    """PatchTST training/probing wrapper.

    Args:
        checkpoint: ``scratch`` (default: the isotropy paper trains PatchTST from scratch on
            each data set) | ``bundled`` | ``auto`` | a local HF directory | a hub id.
        hub_id: the official checkpoint ``auto`` prefers when it is cached or reachable.
        bundled_name: folder of the shipped checkpoint under ``isoprobe/models/bundled``.
        loss: ``mse`` (point forecasts) | ``nll`` (the distribution head).
        distribution_output: the head of ``loss=nll``: ``student_t`` | ``normal``.
        num_samples: samples per window behind the quantiles of ``loss=nll``.
        size: which entry of ``sizes`` ``checkpoint=scratch`` builds.
        sizes: named ``PatchTSTConfig`` fields (``paper``: the isotropy paper's setting).
        **base: the :class:`ForecastModule` arguments (optimizer, lengths, quantiles, ...).
    """

    #: the default ``loss=mse``'s (a point forecast); ``__init__`` sets ``loss=nll``'s
    samples = False
    lagged = False
    stacks = ("encoder",)

    def __init__(
        self,
        checkpoint: str = "scratch",
        hub_id: str = "ibm-granite/granite-timeseries-patchtst",
        bundled_name: str = "patchtst-mini",
        loss: str = "mse",
        distribution_output: str = "student_t",
        num_samples: int = 100,
        size: str = "paper",
        sizes: Mapping[str, Mapping[str, Any]] | None = None,
        **base: Any,
    ) -> None:
        super().__init__(**base)
        if loss not in LOSSES:
            raise ValueError(f"model.loss must be one of {LOSSES}, got {loss!r}")
        if distribution_output not in DISTRIBUTIONS:
            raise ValueError(
                f"model.distribution_output must be one of {DISTRIBUTIONS}, "
                f"got {distribution_output!r}"
            )
        self.num_samples = int(num_samples)
        self.samples = loss == "nll"
        self.resolved_checkpoint = resolve_checkpoint(checkpoint, hub_id, bundled_name)
        head = {"loss": loss, "distribution_output": distribution_output}
        if self.resolved_checkpoint.kind == "scratch":
            self.model = _scratch(
                scratch_shape(scratch_fields(size, sizes)),
                head,
                self.context_length,
                self.prediction_length,
            )
        else:
            self.model = _load(
                self.resolved_checkpoint.location, head, self.context_length, self.prediction_length
            )
        use_inference_kernels(self.model)
        lean_encoder(self.model.model.encoder)
        log.info("PatchTST weights: %s", self.resolved_checkpoint.describe())

    # ----------------------------------------------------------------- inputs
    def _inputs(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """``past_values`` and ``past_observed_mask`` [B, L, 1]: NaNs filled with the window's
        observed mean (0 after the model's standard scaler) and marked unobserved."""
        observed = ~context.isnan()
        count = observed.sum(dim=1, keepdim=True).clamp_min(1)
        mean = context.nan_to_num(0.0).sum(dim=1, keepdim=True) / count
        values = torch.where(observed, context, mean)
        return values.unsqueeze(-1), observed.unsqueeze(-1).to(context.dtype)

    def _run(self, context: Tensor):
        values, observed = self._inputs(context)
        return self.model(past_values=values, past_observed_mask=observed)

    def _distribution(self, output) -> torch.distributions.Distribution:
        return self.model.distribution_output.distribution(
            output.prediction_outputs, loc=output.loc, scale=output.scale
        )

    def _patch_observed(self, context: Tensor) -> Tensor:
        """[B, P] True where a patch (the model's own patchifier) holds an observed value."""
        observed = (~context.isnan()).to(context.dtype).unsqueeze(-1)
        return self.model.model.patchifier(observed)[:, 0].sum(dim=-1) > 0

    # ----------------------------------------------------------------- the contract
    def loss(self, batch: Batch) -> Tensor:
        """``mse``: the mean squared error of the point forecast over the observed target
        values (the official forward's ``MSELoss`` where nothing is missing); ``nll``: the mean
        negative log-likelihood of the observed target values under the distribution head."""
        output = self._run(batch["context"])
        target = batch["target"]
        observed = ~target.isnan()
        filled = target.nan_to_num(0.0)
        if self.model.distribution_output is None:
            errors = (output.prediction_outputs[..., 0] - filled).square()
        else:
            errors = -self._distribution(output).log_prob(filled.unsqueeze(-1))
        return errors[observed].mean()

    @torch.no_grad()
    def forecast(self, batch: Batch) -> Forecast:
        """``mse``: the point forecast at every quantile level (and as the median); ``nll``:
        empirical quantiles of ``num_samples`` samples of the distribution head."""
        output = self._run(batch["context"])
        levels = len(self.quantile_levels)
        if self.model.distribution_output is None:
            point = output.prediction_outputs[..., 0]
            quantiles = point.unsqueeze(1).expand(-1, levels, -1).contiguous()
            return Forecast(quantiles, self.quantile_levels, point)
        samples = self._distribution(output).sample((self.num_samples,))[..., 0].transpose(0, 1)
        return Forecast.from_samples(samples, self.quantile_levels)

    def embed_module(self) -> nn.Module:
        """The patch embedding plus positional encoding [B, C, P, D]; the blocks are
        [B, C, P, D] too, their attention sub-layers (after ``out_proj``, before the residual
        add) [B C, P, D]."""
        return self.model.model.encoder.positional_encoder

    def stack_blocks(self, stack: str) -> Sequence[nn.Module]:
        return self.model.model.encoder.layers

    def self_attention_module(self, stack: str, index: int) -> nn.Module:
        return self.model.model.encoder.layers[index].self_attn

    def token_masks(self, batch: Batch, layers: Iterable[str]) -> dict[str, Tensor]:
        """Real tokens are the patches that hold an observed value (not all-NaN patches such as
        left padding): [B, C, P] for the embedding and the blocks, [B C, P] for the attention
        sub-layers (the model folds channels into the batch there)."""
        patches = self._patch_observed(batch["context"])
        identities = self.identify_layers(layers, "PatchTST")
        return {
            name: patches if layer.site == "attention" else patches.unsqueeze(1)
            for name, layer in identities.items()
        }

    def input_modules(self) -> list[nn.Module]:
        """The patch embedding and the learned position embedding."""
        encoder = self.model.model.encoder
        return [encoder.embedder, encoder.positional_encoder]

    def head_modules(self) -> list[nn.Module]:
        """The prediction head over the flattened patches (point or distribution)."""
        return [self.model.head]

    def feed_forward_modules(self) -> list[nn.Module]:
        return [layer.ff for layer in self.model.model.encoder.layers]

    def attention_weights(self) -> dict[str, dict[str, Tensor]]:
        """Every encoder layer's ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` weights
        ``[d_model, d_model]`` (their biases are not part of the matrices)."""
        parts = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}
        return {
            f"encoder.{i}": {
                part: getattr(layer.self_attn, name).weight for part, name in parts.items()
            }
            for i, layer in enumerate(self.model.model.encoder.layers)
        }

    def export(self, directory: str, dtype: str = "float32") -> None:
        """``PatchTSTForPrediction.save_pretrained``: the official format."""
        export = copy.deepcopy(self.model).to(getattr(torch, dtype))
        export.save_pretrained(directory, safe_serialization=True)

    def _patches(self) -> int:
        return self.model.model.patchifier.num_patches

    def training_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a training step: weights, gradients and two AdamW moments of what trains
        (weight_floats), and per encoder layer the attention tensors kept for backward (scores,
        softmax, dropout output: 3 x heads x P^2) and hidden values (~ P x (8 d_model + 2
        ffn_dim))."""
        config, patches = self.model.config, self._patches()
        layer = 3 * config.num_attention_heads * patches**2 + patches * (
            8 * config.d_model + 2 * config.ffn_dim
        )
        embed = patches * (config.patch_length + 2 * config.d_model) + 4 * self.context_length
        activations = batch_size * (config.num_hidden_layers * layer + embed)
        weights = self.weight_floats(training=True)
        return 4 * (activations + weights)

    def forecast_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a forecast: the weights, one layer's attention scores and
        probabilities (2 x heads x P^2) and hidden states (P x (4 d_model + ffn_dim)) per
        window, and the ``num_samples`` x horizon samples of ``loss=nll``."""
        config, patches = self.model.config, self._patches()
        layer = 2 * config.num_attention_heads * patches**2 + patches * (
            4 * config.d_model + config.ffn_dim
        )
        samples = 0 if self.model.distribution_output is None else self.num_samples
        per_window = layer + (2 * samples + 2) * self.prediction_length
        weights = self.weight_floats(training=False)
        return 4 * (batch_size * per_window + weights)


def _scratch(
    fields: Mapping[str, Any], head: Mapping[str, str], context: int, horizon: int
) -> PatchTSTForPrediction:
    config = PatchTSTConfig(
        **{**fields, **head},
        num_input_channels=1,
        context_length=context,
        prediction_length=horizon,
        architectures=["PatchTSTForPrediction"],
    )
    if context <= config.patch_length:
        raise ValueError(
            f"data.context_length={context} must be longer than PatchTST's patch_length="
            f"{config.patch_length}"
        )
    return PatchTSTForPrediction(config)


def _load(
    source: str, head: Mapping[str, str], context: int, horizon: int
) -> PatchTSTForPrediction:
    check_pretrained_config(source, PATCHTST)
    config = pretrained_config(
        source,
        "model=patchtst loads PatchTSTForPrediction checkpoints (config.json + model.safetensors).",
    )
    if config.model_type != "patchtst":
        raise CheckpointError(
            f"{source} is not a PatchTST checkpoint (model_type={config.model_type!r}); "
            "model=patchtst loads PatchTSTForPrediction checkpoints."
        )
    lengths = {"context_length": context, "prediction_length": horizon}
    for field, wanted in lengths.items():
        if getattr(config, field) != wanted:
            raise CheckpointError(
                f"{source} was built for {field}={getattr(config, field)} but the data give "
                f"data.{field}={wanted}: PatchTST's patching and linear head fix both lengths. "
                f"Set data.{field}={getattr(config, field)}, or train with "
                "model.checkpoint=scratch."
            )
    if config.loss != head["loss"]:
        raise CheckpointError(
            f"{source} has a {config.loss!r} head but model.loss={head['loss']!r}; set "
            f"model.loss={config.loss}."
        )
    if config.num_input_channels != 1:
        if not (config.share_embedding and config.share_projection) or config.channel_attention:
            raise CheckpointError(
                f"{source} has {config.num_input_channels} channels with per-channel weights "
                "or channel attention; isoprobe's univariate windows need a channel-independent "
                "PatchTST (share_embedding, share_projection, no channel_attention)."
            )
        config.num_input_channels = 1  # shared weights: one channel reads them all
    model, info = load_pretrained(PatchTSTForPrediction, source, config=config)
    check_weights_fit(info, source)
    return model
