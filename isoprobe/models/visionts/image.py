"""A series as VisionTS (Chen et al. 2024, ``visionts.VisionTS.update_config`` and ``forward``)
renders it for the MAE, and the reconstructed image read back as a forecast.

1. **Normalise** the context by its observed mean and standard deviation (population variance
   plus 1e-5 under the root), the standard deviation divided by ``norm_const`` (0.4), so values
   lie mostly within +-2.5.
2. **Segment** by the period ``P``: the context, left-padded by repeating its first value to a
   multiple of ``P``, becomes a ``P x N`` grid (row ``f``: phase within the period, column ``n``:
   the period), ``N = (pad + context) / P``.
3. **Render**: the grid is resized (bilinear, no antialiasing, ``align_corners=False``: what
   torchvision's ``Resize(..., antialias=False)`` does on a tensor) to the image's full height
   and the width of its ``visible_columns`` left patch columns; the right part is zeros (the
   hidden patches); the grey image is repeated over the three colour channels.
   ``visible_columns = int(ratio x grid x align_const)`` (at least 1), ``ratio`` the share of
   context in ``pad + context + horizon + horizon pad``, ``align_const`` = 0.4.
4. **Read back**: the reconstruction averaged over the colour channels is resized to ``P`` rows
   and ``round(S x N / W)`` columns (``W``: the visible width in pixels), so one pixel is one
   step again; flattened period by period, the steps after the context are the forecast, scaled
   back by the context's standard deviation and mean.

Missing values (the official code has none): after normalisation a missing step is 0, the
observed mean, before the left padding (which repeats the first step, 0 when it is missing).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

#: the official defaults of ``update_config``
NORM_CONST = 0.4
ALIGN_CONST = 0.4
#: added to the variance before the root (``visionts.VisionTS.forward``)
VARIANCE_EPS = 1e-5


@dataclass(frozen=True)
class ImageLayout:
    """Where the context and the forecast lie in the image, computed as ``update_config``
    computes them (the same float expressions, so the same rounding)."""

    image_size: int
    patch_size: int
    context_length: int
    prediction_length: int
    periodicity: int
    align_const: float = ALIGN_CONST

    def __post_init__(self) -> None:
        if self.periodicity < 1:
            raise ValueError(
                f"VisionTS's period must be a whole number of steps >= 1, got {self.periodicity}: "
                "set model.periodicity (null takes the data's season_length)"
            )

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def pad_left(self) -> int:
        return (-self.context_length) % self.periodicity

    @property
    def pad_right(self) -> int:
        return (-self.prediction_length) % self.periodicity

    @property
    def context_periods(self) -> int:
        return (self.pad_left + self.context_length) // self.periodicity

    @property
    def visible_columns(self) -> int:
        padded = self.pad_left + self.context_length
        ratio = padded / (padded + self.pad_right + self.prediction_length)
        return max(1, int(ratio * self.grid * self.align_const))

    @property
    def visible_width(self) -> int:
        """The visible part's width in pixels."""
        return int(self.image_size * (self.visible_columns / self.grid))

    @property
    def output_periods(self) -> int:
        """Columns of the read-back grid: the whole image's width in periods."""
        scale = self.context_periods / self.visible_width
        return int(round(self.image_size * scale))

    def check_horizon_fits(self) -> None:
        """Refuse a layout whose read-back grid ends before the horizon does."""
        steps = self.output_periods * self.periodicity
        needed = self.pad_left + self.context_length + self.prediction_length
        if steps < needed:
            raise ValueError(
                f"VisionTS's image holds {steps} steps at period {self.periodicity} but context "
                f"{self.context_length} + horizon {self.prediction_length} need {needed}: "
                "shorten data.prediction_length or lengthen data.context_length."
            )


def resize(image: Tensor, size: tuple[int, int]) -> Tensor:
    """Bilinear resize of ``[B, 1, H, W]`` as torchvision's ``Resize(size, BILINEAR,
    antialias=False)`` on a tensor."""
    return F.interpolate(image, size=size, mode="bilinear", align_corners=False, antialias=False)


def normalise(context: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(normalised context with missing steps at 0, mean [B, 1], scale [B, 1]): step 1 of the
    module docstring over the observed steps."""
    observed = ~context.isnan()
    count = observed.sum(dim=1, keepdim=True).clamp_min(1)
    filled = context.nan_to_num(0.0)
    mean = filled.sum(dim=1, keepdim=True) / count
    centred = torch.where(observed, context - mean, torch.zeros_like(context))
    variance = centred.square().sum(dim=1, keepdim=True) / count
    scale = (variance + VARIANCE_EPS).sqrt() / NORM_CONST
    return centred / scale, mean, scale


def segment(values: Tensor, layout: ImageLayout) -> Tensor:
    """``[B, L]`` -> ``[B, 1, P, N]``: step 2 (left padding repeats the first value)."""
    padded = torch.cat([values[:, :1].expand(-1, layout.pad_left), values], dim=1)
    periods = padded.reshape(values.shape[0], layout.context_periods, layout.periodicity)
    return periods.transpose(1, 2).unsqueeze(1)


def render(values: Tensor, layout: ImageLayout) -> Tensor:
    """Normalised context ``[B, L]`` -> the MAE's input image ``[B, 3, S, S]`` (step 3)."""
    visible = resize(segment(values, layout), (layout.image_size, layout.visible_width))
    hidden_width = (layout.grid - layout.visible_columns) * layout.patch_size
    hidden = visible.new_zeros(visible.shape[0], 1, layout.image_size, hidden_width)
    return torch.cat([visible, hidden], dim=-1).expand(-1, 3, -1, -1)


def read_forecast(image: Tensor, layout: ImageLayout) -> Tensor:
    """Reconstructed image ``[B, 3, S, S]`` -> normalised forecast ``[B, H]`` (step 4, before
    the scaling back)."""
    grey = image.mean(dim=1, keepdim=True)
    grid = resize(grey, (layout.periodicity, layout.output_periods))
    steps = grid[:, 0].transpose(1, 2).reshape(image.shape[0], -1)
    start = layout.pad_left + layout.context_length
    return steps[:, start : start + layout.prediction_length]


def visible_patches_observed(context: Tensor, layout: ImageLayout) -> Tensor:
    """``[B, grid, visible_columns]``: True where a visible patch's pixels read an observed step
    (the observed indicator rendered as the values are: a pixel reads a step exactly where the
    bilinear weight of that step's cell is positive)."""
    observed = (~context.isnan()).to(context.dtype)
    pixels = resize(segment(observed, layout), (layout.image_size, layout.visible_width)) > 0
    p = layout.patch_size
    patches = pixels[:, 0].reshape(context.shape[0], layout.grid, p, layout.visible_columns, p)
    return patches.any(dim=4).any(dim=2)
