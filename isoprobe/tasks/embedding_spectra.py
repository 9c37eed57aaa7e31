"""``task=embedding_spectra`` (rank-structure paper, figure 2 and table 1): thousands of patches
of diverse signals (:mod:`isoprobe.spectra.signals`) embedded by every time-series model the
config lists, and the text and image baselines on their own inputs; the singular values of each
embedded-input matrix, its ε-ranks and the projections on its two leading singular vectors go
into the run directory (:mod:`isoprobe.spectra.report`).

``embedding_spectra.models.<name>`` is any ``configs/model/*.yaml`` (a ``ForecastModule``, read
at its ``embed`` probe layer); ``embedding_spectra.embedders.<name>`` any other embedder
(``configs/embedder/*.yaml``: TOTEM's tokenizer, the baselines). A model joins the figure by a
line in ``configs/experiment/rank/embedding_spectra.yaml``."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from isoprobe.probing.collect import subsample_indices
from isoprobe.settings import SettingsError
from isoprobe.spectra.embedders import ForecasterEmbedder, InputEmbedder
from isoprobe.spectra.report import write_outputs
from isoprobe.spectra.signals import FAMILIES, diverse_signals
from isoprobe.spectra.spectrum import embedding_spectrum
from isoprobe.tasks.run_lock import run_directory_lock
from isoprobe.tasks.task import Task

log = logging.getLogger(__name__)


def _epsilons(options: DictConfig) -> list[float]:
    values = OmegaConf.to_container(options.epsilon, resolve=True)
    values = values if isinstance(values, list) else [values]
    if not values or not all(isinstance(v, (int, float)) and 0 < v <= 1 for v in values):
        raise SettingsError(f"embedding_spectra.epsilon must be numbers in (0, 1], got {values}")
    return [float(v) for v in values]


def _check_projected(options: DictConfig) -> list[str]:
    """The names of panels (b, c), each one of the systems listed (checked before any loads)."""
    listed = [
        name
        for group in ("models", "embedders")
        for name, entry in (options.get(group) or {}).items()
        if entry is not None
    ]
    projected = list(options.projected)
    unknown = [name for name in projected if name not in listed]
    if unknown:
        raise SettingsError(
            f"embedding_spectra.projected names {unknown}, which embedding_spectra.models and "
            f".embedders do not list; choose among {listed}"
        )
    return projected


def embedders(options: DictConfig) -> dict[str, InputEmbedder]:
    """Every system the config lists, by name: the models, then the other embedders (an entry
    set to null is left out)."""
    built: dict[str, InputEmbedder] = {}
    for name, model_cfg in (options.get("models") or {}).items():
        if model_cfg is not None:
            built[name] = ForecasterEmbedder(
                model_cfg, options.prediction_length, options.batch_size
            )
    for name, embedder_cfg in (options.get("embedders") or {}).items():
        if embedder_cfg is not None:
            built[name] = instantiate(embedder_cfg, _convert_="all")
    if not built:
        raise SettingsError(
            "task=embedding_spectra has nothing to embed: list models in "
            "embedding_spectra.models or embedders in embedding_spectra.embedders "
            "(experiment=rank/embedding_spectra lists them all)"
        )
    return built


def run_embedding_spectra(cfg: DictConfig) -> dict[str, Any]:
    options = cfg.embedding_spectra
    epsilons = _epsilons(options)
    projected = _check_projected(options)
    output = Path(cfg.paths.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    with run_directory_lock(output):
        length = options.context_length + options.prediction_length
        series, families = diverse_signals(options.per_family, length, options.seed)
        spectra, modalities, sources, seconds, labels = {}, {}, {}, {}, {}
        for name, embedder in embedders(options).items():
            start = time.perf_counter()
            embedded = embedder.embedded_inputs(series)
            keep = subsample_indices(len(embedded.rows), options.max_tokens, options.seed)
            spectra[name] = embedding_spectrum(embedded.rows[keep])
            if embedded.series_index is not None:
                labels[name] = [families[i] for i in embedded.series_index[keep].tolist()]
            modalities[name], sources[name] = embedder.modality, embedder.source
            seconds[name] = time.perf_counter() - start
            log.info(
                "%s (%s, %s): %d of %d tokens, width %d, %.1f s",
                name,
                embedder.modality,
                embedder.source,
                len(keep),
                len(embedded.rows),
                embedded.rows.shape[1],
                seconds[name],
            )
        notes = [
            f"{len(series)} series of {length} steps, {options.per_family} of each family "
            f"({', '.join(FAMILIES)}), seed {options.seed}; the time-series models read the "
            f"first {options.context_length} steps as the context. Each model's embedded inputs "
            f"are at most {options.max_tokens} of its tokens (a seeded subset), not centred.",
        ]
        paths = write_outputs(
            output, spectra, modalities, sources, epsilons, projected, labels, notes
        )
    for kind, path in paths.items():
        log.info("%s: %s", kind, path)
    return {"outputs": {k: str(v) for k, v in paths.items()}, "seconds": seconds}


EMBEDDING_SPECTRA = Task("embedding_spectra", trains=False, alone=run_embedding_spectra)
