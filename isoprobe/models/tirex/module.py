"""TiRex (NX-AI 2025; NX-AI/TiRex) as a :class:`ForecastModule`, on isoprobe's own network
(:mod:`isoprobe.models.tirex.network`); the published checkpoint loads as data through
:mod:`isoprobe.models.tirex.loading`.

Reading a window follows the official package: the context is cut to its last
``train_ctx_len`` steps or left-padded to them with NaN; it is standardised by the mean and the
(population) standard deviation of its observed values (a standard deviation of 0 becomes
``|mean| + 1e-5``; an all-missing window has mean 0 and scale 1); it is cut into patches of
``p`` steps, and each token is the patch's values (0 where missing) followed by its observed
flags. Every token's output is the quantiles of the patch after it.

Forecasting is the official ``_forecast_tensor`` with one new patch a call: the last token's
output is the next ``p`` steps; a longer horizon appends a patch of NaN (a masked token, not the
forecast: TiRex was trained to continue its recurrence over missing patches) and calls again,
the window re-cut to ``train_ctx_len``, until the horizon is covered. The quantiles are then
sorted per step (the package leaves crossing ones as they are; sorting keeps them ordered) and
interpolated linearly to ``self.quantile_levels``; the median is the 0.5 level.

The package defines no training objective; the paper's is the quantile (pinball) loss of the
output patches. The loss here: one pass over the window as read above followed by
``ceil(H / p) - 1`` masked patches (the tokens the roll-out appends); every token predicts the
patch after it (the context's next patch, then the target's patches), and the loss is the mean,
over the observed steps of those patches, of the pinball loss ``max(q e, (q - 1) e)``,
``e = y - y_q``, averaged over the model's levels, in the window's standardised units. Tokens
of patches without an observed value (left padding) predict nothing: they are no real tokens.

TiRex has no attention: :attr:`attends` is false, :meth:`attention_weights` is ``{}`` and the
``attention`` probe site is refused by name. A block's output tokens (the residual stream after
its sLSTM and feed-forward) are probed like any other model's.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from isoprobe.models.base import ATTENTION_PROJECTIONS, Batch, Forecast, ForecastModule
from isoprobe.models.checkpoints import (
    ResolvedCheckpoint,
    export_published_network,
    resolve_checkpoint,
    scratch_fields,
)
from isoprobe.models.quantiles import register_level_weights
from isoprobe.models.tirex.config import TirexShape, official_config
from isoprobe.models.tirex.loading import load_network, published_file
from isoprobe.models.tirex.network import TirexNetwork, official_name

log = logging.getLogger(__name__)

#: a zero standard deviation becomes ``|mean| + SCALE_EPS`` (the package's ``StandardScaler``)
SCALE_EPS = 1e-5


def standardisation(context: Tensor) -> tuple[Tensor, Tensor]:
    """Per-window mean and population standard deviation [B, 1] of the observed values of
    ``context`` [B, T]; 0 and 1 for an all-missing window, ``|mean| + 1e-5`` for a constant one."""
    observed = context.isfinite()
    count = observed.sum(dim=1, keepdim=True)
    filled = context.nan_to_num(0.0)
    mean = filled.sum(dim=1, keepdim=True) / count.clamp_min(1)
    variance = ((filled - mean) ** 2 * observed).sum(dim=1, keepdim=True) / count.clamp_min(1)
    scale = torch.where(count > 0, variance.sqrt(), torch.ones_like(mean))
    scale = torch.where(scale == 0, mean.abs() + SCALE_EPS, scale)
    return mean, scale


def pinball(prediction: Tensor, target: Tensor, levels: Tensor) -> Tensor:
    """``mean_q max(q e, (q - 1) e)``, ``e = y - y_q``: ``prediction`` [..., Q, p] at ``levels``
    [Q], ``target`` [..., p] -> [..., p]."""
    errors = target.unsqueeze(-2) - prediction
    levels = levels.view(-1, 1)
    return torch.maximum(levels * errors, (levels - 1) * errors).mean(dim=-2)


class TirexModule(ForecastModule):
    """TiRex fine-tuning/pretraining wrapper.

    Args:
        checkpoint: ``bundled`` | ``auto`` | ``scratch`` | a local directory (an export, or a
            download of NX-AI/TiRex holding ``model.ckpt``) | the published ``model.ckpt`` | a hub
            id (NX-AI/TiRex).
        hub_id: the official checkpoint ``auto`` prefers when it is cached or reachable.
        bundled_name: folder of the shipped checkpoint under ``isoprobe/models/bundled``.
        size: which entry of ``sizes`` ``checkpoint=scratch`` builds.
        sizes: named shapes (:class:`TirexShape` fields): ``mini`` (the bundled one) and
            ``official_35m`` (the published one).
        **base: the :class:`ForecastModule` arguments (optimizer, lengths, quantiles, freq, ...).
    """

    samples = False
    lagged = False
    stacks = ("decoder",)
    attends = False

    def __init__(
        self,
        checkpoint: str = "bundled",
        hub_id: str = "NX-AI/TiRex",
        bundled_name: str = "tirex-mini",
        size: str = "mini",
        sizes: Mapping[str, Mapping[str, Any]] | None = None,
        **base: Any,
    ) -> None:
        super().__init__(**base)
        published = published_file(checkpoint)
        if published is not None:
            self.resolved_checkpoint = ResolvedCheckpoint("path", str(published), checkpoint)
        else:
            self.resolved_checkpoint = resolve_checkpoint(checkpoint, hub_id, bundled_name)
        self.network: TirexNetwork = load_network(
            self.resolved_checkpoint, scratch_fields(size, sizes)
        )
        register_level_weights(self, self.shape.quantiles, "TiRex")
        log.info("TiRex weights: %s", self.resolved_checkpoint.describe())

    @property
    def shape(self) -> TirexShape:
        return self.network.shape

    # ----------------------------------------------------------------- reading a window
    def _window(self, context: Tensor) -> Tensor:
        """``context`` cut to its last ``train_ctx_len`` steps or left-padded to them (NaN)."""
        return F.pad(context, (self.shape.train_ctx_len - context.shape[1], 0), value=math.nan)

    def _tokens(self, window: Tensor, mean: Tensor, scale: Tensor) -> tuple[Tensor, Tensor]:
        """Tokens [B, N, 2p] of ``window`` [B, N p] standardised by ``mean``, ``scale``, and
        which patches hold an observed value [B, N]."""
        patches = ((window - mean) / scale).unflatten(1, (-1, self.shape.input_patch_size))
        observed = patches.isfinite()
        tokens = torch.cat([patches.nan_to_num(0.0), observed.to(patches.dtype)], dim=-1)
        return tokens, observed.any(dim=-1)

    def _next_patch(self, context: Tensor) -> Tensor:
        """One official call: the quantiles [B, Q, p] of the patch after ``context``, in the
        batch's scale."""
        window = self._window(context)
        mean, scale = standardisation(window)
        tokens, _ = self._tokens(window, mean, scale)
        last = self.network(tokens)[:, -1]
        return last * scale.unsqueeze(-1) + mean.unsqueeze(-1)

    # ----------------------------------------------------------------- the contract
    def loss(self, batch: Batch) -> Tensor:
        """The pinball loss of the module docstring on the window, its masked continuation and
        the target."""
        context, target = batch["context"], batch["target"]
        patch = self.shape.input_patch_size
        window = self._window(context)
        mean, scale = standardisation(window)
        extra = math.ceil(target.shape[1] / patch) - 1
        series = F.pad(window, (0, extra * patch), value=math.nan)
        tokens, predicts = self._tokens(series, mean, scale)
        predicts[:, window.shape[1] // patch :] = True  # the masked tokens predict the target
        prediction = self.network(tokens)
        future = torch.cat([window[:, patch:], target], dim=1)
        future = F.pad(future, (0, prediction.shape[1] * patch - future.shape[1]), value=math.nan)
        future = ((future - mean) / scale).unflatten(1, (-1, patch))
        observed = future.isfinite() & predicts.unsqueeze(-1)
        levels = torch.tensor(
            self.shape.quantiles, dtype=prediction.dtype, device=prediction.device
        )
        terms = pinball(prediction, future.nan_to_num(0.0), levels) * observed
        return terms.sum() / observed.sum().clamp_min(1)

    def _roll_out(self, context: Tensor) -> Tensor:
        """The official roll-out (module docstring): the model's quantiles [B, Q, H] in the
        batch's scale, as the package returns them (unsorted)."""
        patch = self.shape.input_patch_size
        pieces = []
        for _ in range(math.ceil(self.prediction_length / patch)):
            pieces.append(self._next_patch(context))
            context = F.pad(context, (0, patch), value=math.nan)
        return torch.cat(pieces, dim=-1)[..., : self.prediction_length]

    @torch.no_grad()
    def forecast(self, batch: Batch) -> Forecast:
        """The roll-out's quantiles sorted per step (so that crossing ones still give ordered
        quantiles), then interpolated linearly to ``self.quantile_levels``; the median is the
        0.5 level of the same curve."""
        heads = self._roll_out(batch["context"]).sort(dim=1).values
        weights = self.level_weights.to(heads.dtype)
        quantiles = torch.einsum("bgh,lg->blh", heads, weights)
        median = torch.einsum("bgh,g->bh", heads, self.median_weights.to(heads.dtype))
        return Forecast(quantiles, self.quantile_levels, median)

    def probe_forward(self, batch: Batch) -> None:
        """One pass over the window (the forecast's first call)."""
        self._next_patch(batch["context"])

    def embed_module(self) -> nn.Module:
        """The input residual layer, whose output the first block reads (no positions: the
        recurrence orders the tokens)."""
        return self.network.input_patch_embedding

    def stack_blocks(self, stack: str) -> Sequence[nn.Module]:
        return self.network.blocks

    def self_attention_module(self, stack: str, index: int) -> nn.Module:
        raise ValueError(
            "TiRex has no attention (its blocks are sLSTM recurrences), so the probe site "
            "'attention' does not apply to model=tirex: probe its blocks' outputs with "
            "callbacks.probe.site=block."
        )

    def token_masks(self, batch: Batch, layers: Iterable[str]) -> dict[str, Tensor]:
        """One token per patch of the window in every layer; it is real exactly when the patch
        holds an observed value."""
        layers = list(layers)
        self.identify_layers(layers, "TiRex")
        real = self._window(batch["context"]).unflatten(1, (-1, self.shape.input_patch_size))
        real = real.isfinite().any(dim=-1)
        return {name: real for name in layers}

    def training_token_masks(self, batch: Batch, layers: Iterable[str]) -> dict[str, Tensor]:
        """The loss reads the window's tokens, then ``ceil(H / p) - 1`` masked ones (no real
        tokens)."""
        extra = math.ceil(batch["target"].shape[1] / self.shape.input_patch_size) - 1
        masks = self.token_masks(batch, layers)
        return {name: F.pad(mask, (0, extra), value=False) for name, mask in masks.items()}

    def attention_weights(self) -> dict[str, dict[str, Tensor]]:
        """None: TiRex's blocks do not attend (:attr:`attends`)."""
        return {}

    def input_modules(self) -> list[nn.Module]:
        """The input residual layer (TiRex has no other input layer)."""
        return [self.network.input_patch_embedding]

    def head_modules(self) -> list[nn.Module]:
        """The output residual layer (after the final RMSNorm)."""
        return [self.network.output_patch_embedding]

    def feed_forward_modules(self) -> list[nn.Module]:
        """Every block's gated feed-forward."""
        return [block.ffn for block in self.network.blocks]

    def lora_target_modules(
        self, projections: Sequence[str] = ATTENTION_PROJECTIONS, feed_forward: bool = False
    ) -> list[nn.Module]:
        """TiRex has no attention projections, so ``model.adapt=lora`` adapts the linear layers
        of every block's feed-forward (what ``model.lora.mlp=true`` adds for other models); the
        sLSTM's headwise projections and recurrent kernel are no linear layers LoRA wraps."""
        return super().lora_target_modules(projections, feed_forward=True)

    def export(self, directory: str, dtype: str = "float32") -> None:
        """model.safetensors with the published tensor names, and config.json with the shape."""
        export_published_network(
            self.network, directory, dtype, official_config(self.shape), official_name
        )

    # ----------------------------------------------------------------- memory
    def _block_floats(self, tokens: int, training: bool) -> int:
        """Floats one block holds for ``tokens`` tokens: the stream, norms, the four gates'
        pre-activations and the recurrence's states and gates (about 24 d), the group norm and
        the feed-forward (3 x its width); a forecast keeps about half."""
        shape = self.shape
        floats = tokens * (24 * shape.embedding_dim + 3 * shape.ffn_dim)
        return floats if training else floats // 2

    def _ends_floats(self, tokens: int) -> int:
        """The input and output residual layers and the loss's targets and errors."""
        shape = self.shape
        outputs = len(shape.quantiles) * shape.output_patch_size
        return tokens * (2 * shape.input_ff_dim + 4 * outputs + 4 * shape.input_patch_size)

    def training_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a training step: weights, gradients and AdamW's moments of what
        trains, and the activations kept for backward over the loss's tokens."""
        patch = self.shape.input_patch_size
        tokens = self.shape.tokens + math.ceil(self.prediction_length / patch) - 1
        activations = self.shape.num_blocks * self._block_floats(tokens, True)
        activations += self._ends_floats(tokens)
        return 4 * (batch_size * activations + self.weight_floats(training=True))

    def forecast_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a forecast: the weights and one call's largest block and ends."""
        tokens = self.shape.tokens
        activations = self._block_floats(tokens, False) + self._ends_floats(tokens)
        return 4 * (batch_size * activations + self.weight_floats(training=False))
