"""What figure 2 embeds, one embedder per system: a ``ForecastModule``'s ``embed`` probe layer
on the signals (every model isoprobe has, through the model contract alone), and the systems
that are not forecasters (TOTEM's tokenizer, the text and image baselines), each with its own
class. Every embedder gives the embedded inputs Ξ [n tokens, d]."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Protocol

import torch
from omegaconf import DictConfig
from torch import Tensor

from isoprobe.models.base import ForecastModule
from isoprobe.models.build import build_model
from isoprobe.probing.capture import capture_outputs, inference_mode_of, masked_rows

#: the layer whose output is the embedded inputs (the contract's "embed", what block 0 reads)
EMBED_LAYER = "embed"


@dataclass(frozen=True)
class EmbeddedInputs:
    """Ξ [n, d] and, for a system that reads the signals, which series each row came from [n]
    (None for a baseline of another modality)."""

    rows: Tensor
    series_index: Tensor | None = None


class InputEmbedder(Protocol):
    """``modality``: what the system reads (``time series``, ``text``, ``image``);
    ``source``: its weights; ``embedded_inputs(series)``: its embedded inputs of the signals
    ``series`` [N, T] (a baseline of another modality ignores them and embeds its own)."""

    modality: str
    source: str

    def embedded_inputs(self, series: Tensor) -> EmbeddedInputs: ...


def signal_batch(series: Tensor, horizon: int) -> dict[str, Tensor]:
    """A forecasting batch of ``series`` [B, T]: the first ``T - horizon`` steps as the context,
    the rest as the target, unscaled (``loc`` 0, ``scale`` 1: each model scales the window
    itself, as in any run with ``data.scaling=none``)."""
    size = series.shape[0]
    return {
        "context": series[:, : series.shape[1] - horizon],
        "target": series[:, series.shape[1] - horizon :],
        "loc": torch.zeros(size),
        "scale": torch.ones(size),
    }


class ForecasterEmbedder:
    """Any ``ForecastModule`` (a ``configs/model/*.yaml`` config): the real tokens of its
    ``embed`` layer (``probe_layers()["embed"]`` masked by ``token_masks``) over the signals'
    windows, run as the probe runs it (eval mode, no gradient, ``probe_forward``)."""

    modality = "time series"

    def __init__(self, model_cfg: DictConfig, horizon: int, batch_size: int) -> None:
        self.horizon, self.batch_size = int(horizon), int(batch_size)
        self.model_cfg = model_cfg
        self._build = build_model
        self.model: ForecastModule | None = None

    def _model(self, context_length: int) -> ForecastModule:
        if self.model is None:
            windows = SimpleNamespace(
                context_length=context_length,
                prediction_length=self.horizon,
                season_length=1,
                freq=None,
            )
            self.model = self._build(self.model_cfg, windows)
        return self.model

    @property
    def source(self) -> str:
        return self.model.resolved_checkpoint.describe() if self.model else "not built"

    def embedded_inputs(self, series: Tensor) -> EmbeddedInputs:
        model = self._model(series.shape[1] - self.horizon)
        layers = {EMBED_LAYER: model.probe_layers("block")[EMBED_LAYER]}
        rows, counts = [], []
        with inference_mode_of(model), capture_outputs(layers) as captured:
            for start in range(0, series.shape[0], self.batch_size):
                batch = signal_batch(series[start : start + self.batch_size], self.horizon)
                captured[EMBED_LAYER].clear()
                model.probe_forward(batch)
                mask = model.token_masks(batch, [EMBED_LAYER])[EMBED_LAYER]
                kept, per_window = masked_rows(EMBED_LAYER, captured[EMBED_LAYER], mask)
                rows.append(kept.float())
                counts += per_window
        index = torch.arange(len(counts)).repeat_interleave(torch.tensor(counts))
        return EmbeddedInputs(torch.cat(rows), index)
