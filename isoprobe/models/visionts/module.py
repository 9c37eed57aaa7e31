"""VisionTS (Chen et al. 2024, "VisionTS: Visual Masked Autoencoders Are Free-Lunch Zero-Shot
Time Series Forecasters"; official code: the ``visionts`` package) as a :class:`ForecastModule`.

A window is drawn as a grey image by its period (:mod:`isoprobe.models.visionts.image`): its
context fills the left patch columns, the right ones are hidden, and an ImageNet masked
autoencoder (:mod:`isoprobe.models.visionts.mae`) reconstructs them; the reconstruction read
back is the forecast, a point forecast (every quantile level is that point).

The period (``model.periodicity``): null takes the data's ``season_length`` (the official
code's choice from the frequency); a number fixes it.

Objective: the mean squared error of the forecast over the observed target steps, both divided
by the context's standard deviation (the window's own normalisation, so the loss does not grow
with the series' scale): the MSE the VisionTS paper fine-tunes with, on the normalised series.

Probe sites: ``embed`` (``cls`` and the visible patches, as the first encoder block reads them),
``encoder.<i>`` (``[B, 1 + V, D]``) and ``decoder.<i>`` (``[B, 1 + (S / p)^2, D']``: ``cls`` and
every patch, the hidden ones as ``mask_token``). Real tokens: the visible patches whose pixels
read an observed step, at their positions in each stack; ``cls`` and the hidden patches (the
forecast's placeholders) are not real.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from isoprobe.models.base import Batch, Forecast, ForecastModule
from isoprobe.models.checkpoints import (
    CheckpointError,
    ResolvedCheckpoint,
    bundled_path,
    scratch_fields,
    scratch_shape,
)
from isoprobe.models.visionts.checkpoint import (
    CACHE_DIR,
    DOWNLOAD_HOST,
    DOWNLOAD_URL,
    EXPORT_WEIGHTS,
    OFFICIAL_FILES,
    export_directory,
    official_file,
    read_export_shape,
    read_state_dict,
)
from isoprobe.models.visionts.image import (
    NORM_CONST,
    ImageLayout,
    normalise,
    read_forecast,
    render,
    visible_patches_observed,
)
from isoprobe.models.visionts.mae import MAEShape, MaskedAutoencoder
from isoprobe.network import host_reachable

log = logging.getLogger(__name__)


class VisionTSModule(ForecastModule):
    """VisionTS training/probing wrapper.

    Args:
        checkpoint: ``scratch`` (default) | ``official`` (the published MAE of ``size``,
            downloaded once) | ``auto`` (``official`` when cached or reachable) | ``bundled``
            (none ships) | a ``mae_visualize_vit_*.pth`` file (architecture: ``size``) | a
            directory :meth:`export` wrote.
        bundled_name: the name ``checkpoint=bundled`` asks for (isoprobe ships none).
        periodicity: the period the context is segmented by; null: the data's season length.
        size: which entry of ``sizes`` builds the model (and names the published file).
        sizes: named :class:`~isoprobe.models.visionts.mae.MAEShape` fields.
        **base: the :class:`ForecastModule` arguments.
    """

    samples = False
    lagged = False
    stacks = ("encoder", "decoder")

    def __init__(
        self,
        checkpoint: str = "scratch",
        bundled_name: str = "visionts-mini",
        periodicity: int | None = None,
        size: str = "mini",
        sizes: Mapping[str, Mapping[str, Any]] | None = None,
        **base: Any,
    ) -> None:
        super().__init__(**base)
        self.periodicity = int(periodicity) if periodicity is not None else self.season_length
        fields = scratch_fields(size, sizes)
        self.resolved_checkpoint, source = _resolve(checkpoint, bundled_name, size)
        if source is None:
            shape = MAEShape(**scratch_shape(fields))
            self.mae = MaskedAutoencoder(shape)
        else:
            shape = read_export_shape(source) if source.is_dir() else _sized(fields, size)
            weights = source / EXPORT_WEIGHTS if source.is_dir() else source
            state = read_state_dict(weights, shape)
            self.mae = MaskedAutoencoder(shape)
            self.mae.load_state_dict(state, strict=True)
        self.layout = ImageLayout(
            shape.image_size,
            shape.patch_size,
            self.context_length,
            self.prediction_length,
            self.periodicity,
        )
        self.layout.check_horizon_fits()
        log.info("VisionTS weights: %s", self.resolved_checkpoint.describe())

    # ----------------------------------------------------------------- the model
    def _reconstruct(self, context: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(normalised forecast [B, H], mean [B, 1], scale [B, 1])."""
        values, mean, scale = normalise(context)
        image = render(values, self.layout)
        reconstruction = self.mae(image, self.layout.visible_columns)
        return read_forecast(reconstruction, self.layout), mean, scale

    def loss(self, batch: Batch) -> Tensor:
        """MSE over the observed target steps of the normalised forecast against the target
        normalised by the context's mean and standard deviation (module docstring)."""
        forecast, mean, scale = self._reconstruct(batch["context"])
        target = batch["target"]
        observed = ~target.isnan()
        errors = (
            (forecast * scale + mean - target.nan_to_num(0.0)) / (scale * NORM_CONST)
        ).square()
        return errors[observed].mean()

    @torch.no_grad()
    def forecast(self, batch: Batch) -> Forecast:
        """The reconstruction read back, scaled to the context: every quantile level is it."""
        forecast, mean, scale = self._reconstruct(batch["context"])
        point = forecast * scale + mean
        levels = len(self.quantile_levels)
        return Forecast(
            point.unsqueeze(1).expand(-1, levels, -1).contiguous(), self.quantile_levels, point
        )

    # ----------------------------------------------------------------- probing
    def embed_module(self) -> nn.Module:
        """The encoder's input."""
        return self.mae.encoder_input

    def stack_blocks(self, stack: str) -> Sequence[nn.Module]:
        return self.mae.blocks if stack == "encoder" else self.mae.decoder_blocks

    def self_attention_module(self, stack: str, index: int) -> nn.Module:
        """The block's attention after ``proj``, before the residual add."""
        return self.stack_blocks(stack)[index].attn

    def token_masks(self, batch: Batch, layers: Iterable[str]) -> dict[str, Tensor]:
        """``[B, 1 + V]`` for ``embed`` and the encoder, ``[B, 1 + (S / p)^2]`` for the decoder:
        True at the visible patches that read an observed step (module docstring)."""
        identities = self.identify_layers(layers, "VisionTS")
        context = batch["context"]
        patches = visible_patches_observed(context, self.layout).flatten(1)
        batch_size = context.shape[0]
        no_cls = patches.new_zeros(batch_size, 1)
        encoder = torch.cat([no_cls, patches], dim=1)
        grid = self.layout.grid
        every = patches.new_zeros(batch_size, grid**2)
        every[:, self.mae.visible_positions(self.layout.visible_columns)] = patches
        decoder = torch.cat([no_cls, every], dim=1)
        return {
            name: decoder if layer.stack == "decoder" else encoder
            for name, layer in identities.items()
        }

    def attention_weights(self) -> dict[str, dict[str, Tensor]]:
        """Every encoder then decoder block's ``q``, ``k``, ``v`` (the published fused ``qkv``
        split in three layers) and ``proj`` weights."""
        stacks = {"encoder": self.mae.blocks, "decoder": self.mae.decoder_blocks}
        return {
            f"{stack}.{i}": {
                "q": block.attn.q.weight,
                "k": block.attn.k.weight,
                "v": block.attn.v.weight,
                "o": block.attn.proj.weight,
            }
            for stack, blocks in stacks.items()
            for i, block in enumerate(blocks)
        }

    def input_modules(self) -> list[nn.Module]:
        """The patch embedding and the class token (the position embedding is fixed)."""
        return [self.mae.patch_embed, self.mae.encoder_input]

    def head_modules(self) -> list[nn.Module]:
        """``decoder_pred``: from the decoder's normed stream to every patch's pixels."""
        return [self.mae.decoder_pred]

    def feed_forward_modules(self) -> list[nn.Module]:
        return [block.mlp for block in (*self.mae.blocks, *self.mae.decoder_blocks)]

    # ----------------------------------------------------------------- weights
    def export(self, directory: str, dtype: str = "float32") -> None:
        """``config.json`` and ``model.pth`` in the published ``{'model': state_dict}`` layout
        (:mod:`isoprobe.models.visionts.checkpoint`)."""
        state = {k: v.to(getattr(torch, dtype)) for k, v in self.mae.state_dict().items()}
        export_directory(state, self.mae.shape, directory)

    def _tokens(self) -> tuple[int, int]:
        grid = self.layout.grid
        return 1 + grid * self.layout.visible_columns, 1 + grid**2

    def training_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a training step: the weights with gradients and AdamW moments, and
        per window the image tensors (about 8 copies of ``3 S^2``) and, per block, the
        activations kept for backward (``T (10 D + 2 x mlp width)``) and the attention
        probabilities (``heads x T^2``)."""
        shape = self.mae.shape
        encoder, decoder = self._tokens()
        per_window = 8 * 3 * shape.image_size**2
        stacks = (
            (encoder, shape.width, shape.heads, shape.depth),
            (decoder, shape.decoder_width, shape.decoder_heads, shape.decoder_depth),
        )
        for tokens, width, heads, depth in stacks:
            block = tokens * (10 * width + 2 * int(width * shape.mlp_ratio)) + heads * tokens**2
            per_window += depth * block
        return 4 * (batch_size * per_window + self.weight_floats(training=True))

    def forecast_memory_bytes(self, batch_size: int) -> int:
        """Float32 bytes of a forecast: the weights and per window the image tensors (about 6
        copies of ``3 S^2``) and the widest block's transient tensors (``T (4 D + mlp width)``
        and ``heads x T^2``)."""
        shape = self.mae.shape
        encoder, decoder = self._tokens()
        widest = max(
            tokens * (4 * width + int(width * shape.mlp_ratio)) + heads * tokens**2
            for tokens, width, heads in (
                (encoder, shape.width, shape.heads),
                (decoder, shape.decoder_width, shape.decoder_heads),
            )
        )
        per_window = 6 * 3 * shape.image_size**2 + widest
        return 4 * (batch_size * per_window + self.weight_floats(training=False))


def _resolve(
    checkpoint: str, bundled_name: str, size: str
) -> tuple[ResolvedCheckpoint, Path | None]:
    """``model.checkpoint`` -> (where the weights come from, the file or export directory to
    read; None for scratch)."""
    if checkpoint == "scratch":
        return ResolvedCheckpoint("scratch", "", checkpoint), None
    if checkpoint == "bundled":
        bundled_path(bundled_name)  # isoprobe ships none: refused, saying what to use instead
    if checkpoint == "auto":
        published = size in OFFICIAL_FILES
        cached = published and (CACHE_DIR / OFFICIAL_FILES[size]).is_file()
        if not (cached or (published and host_reachable(DOWNLOAD_HOST))):
            bundled_path(bundled_name)  # offline and not cached: the same refusal
    if checkpoint in ("auto", "official"):
        path = official_file(size)
        return ResolvedCheckpoint("hub", DOWNLOAD_URL + OFFICIAL_FILES[size], checkpoint), path
    path = Path(checkpoint).expanduser()
    if path.exists():
        return ResolvedCheckpoint("path", str(path.resolve()), checkpoint), path.resolve()
    raise CheckpointError(
        f"model.checkpoint={checkpoint!r} does not exist. model=visionts takes scratch, official "
        "(the published MAE of model.size), auto, a mae_visualize_vit_*.pth file or a directory "
        "its export wrote."
    )


def _sized(fields: Mapping[str, Any] | None, size: str) -> MAEShape:
    """The architecture a bare ``.pth`` file must have: ``model.size``'s."""
    return MAEShape(**scratch_shape(fields, f"model.sizes (model.size={size}) to read a .pth file"))
