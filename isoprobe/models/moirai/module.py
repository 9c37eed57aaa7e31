"""Moirai 1.x (Woo et al., 2024) as a :class:`ForecastModule`, on uni2ts' ``MoiraiModule``.

Moirai is a masked encoder over patches of one variate (univariate here). A window becomes one
packed sequence as uni2ts' ``MoiraiForecast`` builds it at a FIXED patch size ``p``
(``model.patch_size``): the context, left-padded to a multiple of ``p``, gives
``ceil(context / p)`` patches; the horizon gives ``ceil(horizon / p)`` prediction patches whose
inputs the model replaces by its learned [MASK] embedding. The module standardises the window
by the mean and standard deviation of the observed context, runs the transformer and returns a
mixture (Student-t, near-point normal, negative binomial, log-normal) per step. The training
objective is uni2ts' packed NLL of that mixture on the observed horizon values; forecasts are
quantiles of ``num_samples`` samples.

Sampling (``model.sampler``): ``MoiraiForecast`` builds the mixture over every patch of the
sequence and samples all of them, context patches included, before it keeps the prediction
patches; the mixture draws every component of every value, so most of that work is thrown away
(5 of 7 patches for a 144-step context and 48-step horizon at patch 32). ``horizon`` (the
default) projects only the prediction patches' representations to mixture parameters and
samples those: the same distribution for every forecast value (the module's own, sliced), other
random numbers. ``official`` samples as ``MoiraiForecast`` does, and so draws its samples for a
seed.

Missing values: a leading run of NaN in the context is left padding (gluonts' ``is_pad``: a
patch made only of padding is packed as a sample of its own, which the real patches do not
attend to); any other NaN is a missing value (``observed_mask`` 0, value 0).

uni2ts pins old torch/numpy releases, so it is an extra installed without its dependencies
(:data:`isoprobe.models.moirai.loading.INSTALL`) and imported only when a Moirai model is built.
"""

from __future__ import annotations

import copy
import functools
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from isoprobe.models.base import Batch, Forecast, ForecastModule
from isoprobe.models.checkpoints import resolve_checkpoint, scratch_fields
from isoprobe.models.moirai.loading import import_uni2ts, load_moirai

log = logging.getLogger(__name__)

#: model.sampler: horizon (sample the prediction patches only) | official (every patch)
SAMPLERS = ("horizon", "official")


@dataclass(frozen=True)
class Packed:
    """A batch of windows as one packed sequence each: ``T = context_tokens + horizon_tokens``
    patches, values padded to the module's largest patch size ``P``.

    target / observed [B, T, P]; sample_id, time_id, variate_id, prediction [B, T];
    patch_size [B, T] (``p`` everywhere)."""

    target: Tensor
    observed: Tensor
    sample_id: Tensor
    time_id: Tensor
    variate_id: Tensor
    prediction: Tensor
    patch_size: Tensor

    def module_inputs(self) -> tuple[Tensor, ...]:
        """The positional arguments of ``MoiraiModule.forward``."""
        return (
            self.target,
            self.observed,
            self.sample_id,
            self.time_id,
            self.variate_id,
            self.prediction,
            self.patch_size,
        )


class MoiraiForecastModule(ForecastModule):
    """Moirai fine-tuning/pretraining wrapper.

    Args:
        checkpoint: ``auto`` | ``bundled`` | ``scratch`` | a local directory | a hub id, in
            uni2ts' format (``MoiraiModule.save_pretrained``: config.json + model.safetensors).
        hub_id: the official checkpoint ``auto`` prefers (``Salesforce/moirai-1.1-R-small``;
            the 1.0-R ones load the same way).
        bundled_name: folder of the shipped checkpoint under ``isoprobe/models/bundled``.
        size: which entry of ``sizes`` ``checkpoint=scratch`` builds.
        sizes: named ``MoiraiModule`` shapes (``mini``: the bundled one; ``small``: 1.1-R-small);
            the distribution is always the official mixture.
        patch_size: the one patch size of every window of the run; must be one of the
            checkpoint's ``patch_sizes``.
        num_samples: samples per window that forecasts summarise by quantiles.
        **base: the :class:`ForecastModule` arguments (optimizer, lengths, quantiles, freq, ...).
    """

    samples = True
    lagged = False
    stacks = ("encoder",)

    def __init__(
        self,
        checkpoint: str = "auto",
        hub_id: str = "Salesforce/moirai-1.1-R-small",
        bundled_name: str = "moirai-mini",
        size: str = "mini",
        sizes: Mapping[str, Mapping[str, Any]] | None = None,
        patch_size: int = 32,
        num_samples: int = 100,
        sampler: str = "horizon",
        **base: Any,
    ) -> None:
        super().__init__(**base)
        if sampler not in SAMPLERS:
            raise ValueError(f"model.sampler must be one of {SAMPLERS}, got {sampler!r}")
        self.sampler = sampler
        _, loss_class = import_uni2ts()
        self.resolved_checkpoint = resolve_checkpoint(checkpoint, hub_id, bundled_name)
        self.module = load_moirai(self.resolved_checkpoint, scratch_fields(size, sizes))
        allowed = tuple(int(p) for p in self.module.patch_sizes)
        if int(patch_size) not in allowed:
            raise ValueError(
                f"model.patch_size={patch_size} is not one of this checkpoint's patch sizes "
                f"{allowed}: Moirai has input and output layers only for those."
            )
        self.patch_size = int(patch_size)
        self.num_samples = int(num_samples)
        # ``embed``: the first layer's input (patch projections, [MASK] on prediction patches),
        # routed through an identity of the wrapper's own (the weights' names stay as they are)
        self.embed_tap = nn.Identity()
        self.module.encoder.layers[0].register_forward_pre_hook(
            functools.partial(_first_argument_through, self.embed_tap)
        )
        self.nll = loss_class()
        tokens = self.context_tokens + self.horizon_tokens
        if tokens > self.module.max_seq_len:
            log.warning(
                "%d patches per window exceed this Moirai checkpoint's max_seq_len %d: its "
                "rotary positions extrapolate.",
                tokens,
                self.module.max_seq_len,
            )
        log.info(
            "Moirai weights: %s, patch size %d", self.resolved_checkpoint.describe(), patch_size
        )

    @property
    def context_tokens(self) -> int:
        return math.ceil(self.context_length / self.patch_size)

    @property
    def horizon_tokens(self) -> int:
        return math.ceil(self.prediction_length / self.patch_size)

    # ----------------------------------------------------------------- packing
    def pack(self, context: Tensor, target: Tensor | None = None) -> Packed:
        """The packed sequence of each window (see the module docstring). Without ``target``
        (forecasting) the horizon is zeros, all observed, as in ``MoiraiForecast``."""
        p, width = self.patch_size, max(self.module.patch_sizes)
        batch = context.shape[0]
        left = self.context_tokens * p - context.shape[1]
        nan = context.isnan()
        leading = nan.long().cumprod(dim=1).bool()  # the left padding: a leading run of NaN
        missing = nn.functional.pad(nan, (left, 0), value=True)
        padding = nn.functional.pad(leading, (left, 0), value=True)
        values = nn.functional.pad(context.nan_to_num(0.0), (left, 0), value=0.0)

        horizon = self.horizon_tokens * p
        right = horizon - self.prediction_length
        if target is None:
            future = torch.zeros(batch, self.prediction_length, device=context.device)
            future_observed = torch.ones_like(future, dtype=torch.bool)
        else:
            future, future_observed = target.nan_to_num(0.0), ~target.isnan()
        future = nn.functional.pad(future.to(values.dtype), (0, right), value=0.0)
        future_observed = nn.functional.pad(future_observed, (0, right), value=False)

        def patches(x: Tensor) -> Tensor:
            return nn.functional.pad(x.view(batch, -1, p), (0, width - p))

        observed = torch.cat([patches(~missing), patches(future_observed)], dim=1)
        seen = (~missing).view(batch, -1, p).any(dim=-1)
        # a patch's position counts from the first patch with an observed value
        time_id = (seen.long().cummax(dim=1).values.cumsum(dim=1) - 1).clamp_min(0)
        future_ids = torch.arange(self.horizon_tokens, device=context.device)
        time_id = torch.cat([time_id, time_id.max(dim=1, keepdim=True).values + 1 + future_ids], 1)
        real_sample = ~padding.view(batch, -1, p).all(dim=-1)
        sample_id = torch.cat(
            [real_sample.long(), real_sample.new_ones(batch, self.horizon_tokens).long()], dim=1
        )
        prediction = torch.zeros_like(sample_id, dtype=torch.bool)
        prediction[:, self.context_tokens :] = True
        return Packed(
            target=torch.cat([patches(values), patches(future)], dim=1),
            observed=observed,
            sample_id=sample_id,
            time_id=time_id,
            variate_id=torch.zeros_like(time_id),
            prediction=prediction,
            patch_size=torch.full_like(time_id, p),
        )

    # ----------------------------------------------------------------- the contract
    def loss(self, batch: Batch) -> Tensor:
        """uni2ts' ``PackedNLLLoss`` of the predicted mixture: per window, the mean negative
        log-likelihood of its observed horizon values, averaged over the windows."""
        packed = self.pack(batch["context"], batch["target"])
        distribution = self.module(*packed.module_inputs())
        return self.nll(
            distribution,
            packed.target,
            packed.prediction,
            packed.observed,
            packed.sample_id,
            packed.variate_id,
        )

    @torch.no_grad()
    def forecast(self, batch: Batch) -> Forecast:
        """``num_samples`` draws of the mixture over the prediction patches (one
        ``sample`` call, as ``MoiraiForecast.forward``), cut to the horizon, summarised by
        their empirical quantiles."""
        packed = self.pack(batch["context"])
        if self.sampler == "horizon":
            distribution = self.horizon_distribution(packed)
        else:
            distribution = self.module(*packed.module_inputs())
        draws = distribution.sample(torch.Size((self.num_samples,)))
        batch_size, p = draws.shape[1], self.patch_size
        draws = draws[:, :, -self.horizon_tokens :, :p].reshape(self.num_samples, batch_size, -1)
        samples = draws[..., : self.prediction_length].transpose(0, 1)
        return Forecast.from_samples(samples, self.quantile_levels)

    def horizon_distribution(self, packed: Packed):
        """The module's predictive mixture of the prediction patches alone: its forward
        (scaling by the observed context, patch projection, [MASK] on the prediction patches,
        the encoder over the whole sequence), with the representations of the context patches
        dropped before the projection to mixture parameters."""
        from uni2ts.common.torch_util import mask_fill, packed_attention_mask

        module = self.module
        context_observed = packed.observed & ~packed.prediction.unsqueeze(-1)
        loc, scale = module.scaler(
            packed.target, context_observed, packed.sample_id, packed.variate_id
        )
        tokens = module.in_proj((packed.target - loc) / scale, packed.patch_size)
        tokens = mask_fill(tokens, packed.prediction, module.mask_encoding.weight)
        tokens = module.encoder(
            tokens,
            packed_attention_mask(packed.sample_id),
            time_id=packed.time_id,
            var_id=packed.variate_id,
        )
        horizon = slice(self.context_tokens, None)
        parameters = module.param_proj(tokens[:, horizon], packed.patch_size[:, horizon])
        return module.distr_output.distribution(
            parameters, loc=loc[:, horizon], scale=scale[:, horizon]
        )

    def probe_forward(self, batch: Batch) -> None:
        """The module's forward on the training sequence (context and [MASK] patches) without
        the likelihood, whose mixture draws a sample and so would move the random state."""
        packed = self.pack(batch["context"], batch["target"])
        self.module(*packed.module_inputs())

    def embed_module(self) -> nn.Module:
        return self.embed_tap

    def stack_blocks(self, stack: str) -> Sequence[nn.Module]:
        return self.module.encoder.layers

    def self_attention_module(self, stack: str, index: int) -> nn.Module:
        """``GroupedQueryAttention``, which returns ``out_proj``'s output."""
        return self.module.encoder.layers[index].self_attn

    def token_masks(self, batch: Batch, layers: Iterable[str]) -> dict[str, Tensor]:
        """Every layer's tokens are the packed patches [B, T]; a real token is a context patch
        with at least one observed value: not an all-missing (or left-padding) patch, not a
        prediction patch (the [MASK] input)."""
        packed = self.pack(batch["context"])
        real = packed.observed.any(dim=-1) & ~packed.prediction
        layers = list(layers)
        self.identify_layers(layers, "Moirai")
        return {name: real for name in layers}

    def input_modules(self) -> list[nn.Module]:
        """The patch projection (``in_proj``) and the embedding of masked (forecast) patches."""
        return [self.module.in_proj, self.module.mask_encoding]

    def head_modules(self) -> list[nn.Module]:
        """``param_proj``: the mixture distribution's parameters of every patch."""
        return [self.module.param_proj]

    def feed_forward_modules(self) -> list[nn.Module]:
        return [layer.ffn for layer in self.module.encoder.layers]

    def attention_weights(self) -> dict[str, dict[str, Tensor]]:
        """Every layer's ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj`` weights (no bias;
        Moirai 1.x has as many key/value groups as heads, so all are [d_model, d_model]). The
        per-head RMS norms of queries and keys and the rotary positions come after ``q``/``k``
        and are not folded in."""
        return {
            f"encoder.{i}": {
                "q": layer.self_attn.q_proj.weight,
                "k": layer.self_attn.k_proj.weight,
                "v": layer.self_attn.v_proj.weight,
                "o": layer.self_attn.out_proj.weight,
            }
            for i, layer in enumerate(self.module.encoder.layers)
        }

    def export(self, directory: str, dtype: str = "float32") -> None:
        """``MoiraiModule.save_pretrained``: uni2ts' own format (config.json +
        model.safetensors), which ``checkpoint=<directory>`` and ``MoiraiModule.from_pretrained``
        both load. ``dtype="float16"`` halves the file; loading casts back to float32."""
        copy.deepcopy(self.module).to(getattr(torch, dtype)).save_pretrained(directory)

    def training_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a training step: weights, gradients and two AdamW moments of what trains
        (weight_floats); per layer the activations kept for backward, ~ T x (10 d_model + 3 d_ff)
        per window, and the attention scores and probabilities (2 x heads x T^2); the distribution
        head, which evaluates every patch size's projection (``len(patch_sizes)`` x T x P x (4 + 7)
        outputs) and the four components' log-likelihoods (~ 4 x 4 x T x P)."""
        module = self.module
        tokens, width = self.context_tokens + self.horizon_tokens, module.d_model
        heads = module.encoder.layers[0].self_attn.num_heads
        ff = module.encoder.layers[0].ffn.fc1.out_features
        layer = tokens * (10 * width + 3 * ff) + 2 * heads * tokens**2
        patch = max(module.patch_sizes)
        head = tokens * patch * (11 * len(module.patch_sizes) + 16)
        activations = batch_size * (module.num_layers * layer + head)
        weights = self.weight_floats(training=True)
        return 4 * (activations + weights)

    def forecast_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a forecast: the weights, the largest layer's activations and
        attention (T x (4 d_model + d_ff) + 2 heads T^2 per window), and the samples: the
        mixture draws every component for every patch, ``num_samples`` x T x P x 6 values."""
        module = self.module
        tokens, width = self.context_tokens + self.horizon_tokens, module.d_model
        heads = module.encoder.layers[0].self_attn.num_heads
        ff = module.encoder.layers[0].ffn.fc1.out_features
        layer = tokens * (4 * width + ff) + 2 * heads * tokens**2
        draws = self.num_samples * tokens * max(module.patch_sizes) * 6
        weights = self.weight_floats(training=False)
        return 4 * (batch_size * (layer + draws) + weights)


def _first_argument_through(tap: nn.Module, _module: nn.Module, args: tuple) -> tuple:
    """Forward pre-hook: the module's first positional input through ``tap``."""
    return (tap(args[0]), *args[1:])
