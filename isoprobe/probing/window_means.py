"""The window-means file: each probe window's mean real token per probed layer, saved so that
``task=analyze`` can compare models on the same windows
(:mod:`isoprobe.analysis.model_similarity`).

The unit two models share is the probe window, the history before one forecast origin of one
series: whatever a model's tokens are (time steps, patches, image patches), their mean over the
window's real tokens (what the probe hub pools) is one row per window. A window is identified by
(series index, forecast origin: the time step its horizon starts at), not by its position in
the validation set, which moves with the context length.

Format: safetensors (tensors and string metadata only: reading it runs no code).

- ``mean/<layer>``: float32 [N, D], one row per probe window in probe-set order, for every
  probed layer (a row of NaN: the window has no real token at that layer);
- ``series_index``, ``forecast_origin``: int64 [N], the windows' identity;
- metadata ``format`` (:data:`FORMAT`), ``version`` (:data:`VERSION`), ``epoch`` (the probe's
  epoch label) and ``layers`` (a JSON list, in probe order).

Where: ``window_means/epoch0.safetensors`` (the model before training) and
``window_means/last.safetensors`` (the latest probe, rewritten at every probe) in the probe's
output directory, each written whole to a temporary file and renamed into place.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save
from torch import Tensor
from torch.utils.data import Dataset

from isoprobe.errors import IsoprobeError

FORMAT = "isoprobe-window-means"
VERSION = "1"
DIRECTORY = "window_means"
#: epoch kind -> file name under :data:`DIRECTORY`
FILES = {"epoch0": "epoch0.safetensors", "last": "last.safetensors"}
MEAN_PREFIX = "mean/"
SERIES, ORIGIN = "series_index", "forecast_origin"


class WindowMeansError(IsoprobeError, ValueError):
    """A window-means file that cannot be read as one; the message names the file and why."""


@dataclass
class WindowMeans:
    """One window-means file, read and checked.

    Attributes:
        epoch: the probe's epoch label.
        layers: layer -> [N, D] float32 window means, in probe order.
        identity: [N, 2] int64 rows (series index, forecast origin), in probe-set order.
    """

    epoch: int
    layers: dict[str, Tensor]
    identity: Tensor


def window_identity(dataset: Dataset, windows: Sequence[int]) -> tuple[Tensor, Tensor] | None:
    """(series index [N], forecast origin [N]) int64 of ``windows`` of ``dataset``, read from
    its ``starts`` rows (:class:`isoprobe.data.windows.WindowDataset`); None for a data set that
    does not say where its windows start."""
    starts = getattr(dataset, "starts", None)
    if starts is None:
        return None
    rows = torch.as_tensor(np.asarray(starts)[list(windows)], dtype=torch.int64).reshape(-1, 2)
    return rows[:, 0].contiguous(), rows[:, 1].contiguous()


def write_window_means(
    path: Path, means: Mapping[str, Tensor], series: Tensor, origin: Tensor, epoch: int
) -> None:
    """Write ``means`` (layer -> [N, D]) with the windows' identity and ``epoch`` to ``path``,
    atomically (a temporary file, flushed to disk, then renamed over ``path``)."""
    tensors = {
        f"{MEAN_PREFIX}{layer}": m.detach().float().cpu().contiguous() for layer, m in means.items()
    }
    tensors[SERIES] = series.to(torch.int64).cpu().contiguous()
    tensors[ORIGIN] = origin.to(torch.int64).cpu().contiguous()
    metadata = {
        "format": FORMAT,
        "version": VERSION,
        "epoch": str(int(epoch)),
        "layers": json.dumps(list(means)),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as handle:
        handle.write(save(tensors, metadata=metadata))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def read_window_means(path: Path) -> WindowMeans:
    """The checked contents of a window-means file; :class:`WindowMeansError` names the file
    and the first thing wrong with it (not safetensors, another format, a missing or misshapen
    tensor, repeated windows)."""
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    except (SafetensorError, OSError) as err:
        raise WindowMeansError(
            f"{path} is not a safetensors file ({_first_line(err)}): it is truncated, corrupt or "
            "something else saved under that name; the probe writes it again on the next run"
        ) from None
    if metadata.get("format") != FORMAT or metadata.get("version") != VERSION:
        raise WindowMeansError(
            f"{path} is not an isoprobe window-means file of version {VERSION} (its metadata "
            f"says format={metadata.get('format')!r}, version={metadata.get('version')!r})"
        )
    try:
        epoch = int(metadata["epoch"])
        layers = json.loads(metadata["layers"])
    except (KeyError, ValueError) as err:
        raise WindowMeansError(f"{path} has no readable epoch or layer list ({err})") from None
    if not isinstance(layers, list) or not all(isinstance(layer, str) for layer in layers):
        raise WindowMeansError(f"{path}: its metadata's layers is not a list of layer names")
    expected = {SERIES, ORIGIN, *(MEAN_PREFIX + layer for layer in layers)}
    if set(tensors) != expected:
        raise WindowMeansError(
            f"{path} holds the tensors {sorted(tensors)}, not those its metadata names "
            f"({sorted(expected)})"
        )
    series, origin = tensors[SERIES], tensors[ORIGIN]
    if series.dtype != torch.int64 or origin.dtype != torch.int64 or series.ndim != 1:
        raise WindowMeansError(f"{path}: the window identity is not two int64 vectors")
    if origin.shape != series.shape:
        raise WindowMeansError(f"{path}: {SERIES} and {ORIGIN} differ in length")
    identity = torch.stack([series, origin], dim=1)
    if len(torch.unique(identity, dim=0)) != len(identity):
        raise WindowMeansError(f"{path} names a window (series, forecast origin) twice")
    means = {}
    for layer in layers:
        X = tensors[MEAN_PREFIX + layer]
        if X.dtype != torch.float32 or X.ndim != 2 or X.shape[0] != len(series):
            raise WindowMeansError(
                f"{path}: layer {layer!r} is {X.dtype} of shape {tuple(X.shape)}, not float32 "
                f"[{len(series)} windows, width]"
            )
        means[layer] = X
    return WindowMeans(epoch, means, identity)


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def save_probe_window_means(
    directory: Path,
    dataset: Dataset,
    windows: Sequence[int],
    means: Mapping[str, Tensor],
    epoch: int,
    step: int,
) -> bool:
    """The window means of one probe as ``last`` and, at step 0 of epoch 0 (the model before
    training), also as ``epoch0``, under ``directory``; False (nothing written) for a data set
    that does not say where its windows start (:func:`window_identity`)."""
    identity = window_identity(dataset, windows)
    if identity is None:
        return False
    kinds = ("epoch0", "last") if step == 0 and epoch == 0 else ("last",)
    for kind in kinds:
        write_window_means(directory / DIRECTORY / FILES[kind], means, *identity, epoch)
    return True
