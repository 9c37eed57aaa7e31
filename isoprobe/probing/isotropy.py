"""IsotropyProbe: the geometry of every layer's hidden representations over training.

On the probe set (see :mod:`isoprobe.probing.probe` for the schedule, the probe set and the
shared collection pass), each layer's collected tokens, at most ``max_tokens`` rows subsampled
with a fixed seed, go through :func:`isoprobe.metrics.probe_metrics` in float64 (definitions:
:mod:`isoprobe.metrics.reference`).

Outputs: ``probe/<metric>/<layer>`` and ``probe/epoch`` to every logger (rank zero);
``csv_name`` (``probe_metrics.csv``: one row per epoch x layer x metric, rewritten atomically
every probe), ``pca/<layer>_<label>.png`` (``epoch<e>``, or ``step<s>`` in a schedule in
steps) and, at the end of fit, ``probe_trajectories.png`` in
the output directory; with a W&B logger also a per-epoch table and 3-D PCA point clouds. With
``save_window_means``, each probe window's mean real token per layer goes to
``window_means/epoch0.safetensors`` and ``window_means/last.safetensors``
(:mod:`isoprobe.probing.window_means`).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from tqdm.auto import tqdm

from isoprobe.metrics import ClusterCosine, ProbeMetricsConfig, Tokens, measure_tokens
from isoprobe.metrics.plugins import import_plugins
from isoprobe.probing.hub import Collected, val_dataset
from isoprobe.probing.measurement import Measurement, Row
from isoprobe.probing.plots import cluster_colours, pca_coordinates, save_point_cloud
from isoprobe.probing.probe import Probe
from isoprobe.probing.publish import PointCloud, point_clouds
from isoprobe.probing.readout import ReadoutMeasures
from isoprobe.probing.records import DEFAULT_PROBE
from isoprobe.probing.schedule import ProbeTime
from isoprobe.probing.similarity import HEATMAP_DIR, PAIRS_CSV, LayerMatrix, SimilarityMeasures
from isoprobe.probing.window_means import DIRECTORY, FILES, window_identity, write_window_means

CSV_NAME = "probe_metrics.csv"
TRAJECTORY_PNG = "probe_trajectories.png"
PCA_DIR = "pca"
ERROR_METRIC = "error"
TOKENS_METRIC = "n_tokens"  # rows measured (after masking and subsampling)


@dataclasses.dataclass
class _Clouds:
    """The isotropy probe's artefacts of one epoch: PCA point clouds by layer and the
    layer-against-layer CKA matrix (None without it)."""

    clouds: dict[str, PointCloud]
    matrix: LayerMatrix | None = None


class IsotropyProbe(Probe):
    """Probe isotropy, effective dimension, partition ratio and rank of every layer.

    Args:
        metrics: :class:`isoprobe.metrics.ProbeMetricsConfig` fields (``metrics``: ``all`` or
            names of registered measures, ``k_min``, ``k_max``, ``min_silhouette``, ``seed``,
            ``ed_threshold``, ``rank_eps``); ``seed`` defaults to this callback's ``seed``.
        plugins: modules to import first, whose measures (registered with
            :func:`isoprobe.metrics.register_measure`) then run with the built-in ones.
        similarity: :class:`~isoprobe.probing.similarity.SimilarityMeasures` options (``drift``,
            ``layer_pairs``, ``debiased``): the two-token-set measures ``cka_drift`` and
            ``cka_prev`` and the layer-against-layer CKA heatmap; None = off (the default here;
            on in ``configs/callbacks/isotropy.yaml``).
        readout: :class:`~isoprobe.probing.readout.ReadoutMeasures` options
            (``train_fraction``): the per-layer ridge readout ``readout_nmse``,
            ``readout_skill``; None = off (the default here; on in the config).
        save_window_means: save each probe window's mean real token per probed layer
            (:mod:`~isoprobe.probing.window_means`: ``window_means/epoch0.safetensors`` and
            ``window_means/last.safetensors``), for ``task=analyze``'s model-against-model CKA;
            off here, on in the config.
        pca_layers: layers whose 3-D PCA point cloud (coloured by k-means cluster) is saved and
            logged each probe; None = the first and the last ``encoder.*`` layer probed (the
            first and last probed layer if there is no encoder layer); ``[]`` = none.
        name, csv_name, trajectory_png, log_prefix: as :class:`Probe`, defaults ``isotropy``,
            ``probe_metrics.csv``, ``probe_trajectories.png``, ``probe``.
        **probe: the :class:`Probe` settings (schedule, probe set, tokens, site, output).

    Attributes:
        records: every row so far; ``probed_epochs``: the epochs probed; ``window_indices``:
        the probe set; ``seconds``: wall time of each probe by step.
    """

    def __init__(
        self,
        metrics: dict[str, Any] | None = None,
        plugins: list[str] | None = None,
        similarity: dict[str, Any] | None = None,
        readout: dict[str, Any] | None = None,
        pca_layers: list[str] | None = None,
        save_window_means: bool = False,
        name: str = DEFAULT_PROBE,
        csv_name: str = CSV_NAME,
        trajectory_png: str = TRAJECTORY_PNG,
        log_prefix: str = "probe",
        **probe: Any,
    ) -> None:
        super().__init__(name, csv_name, trajectory_png, log_prefix, **probe)
        import_plugins(list(plugins or []), f"callbacks.{name}.plugins")
        self.metrics_config = ProbeMetricsConfig.from_any(
            {"seed": self.seed, **dict(metrics or {})}
        )
        self.pca_layers = list(pca_layers) if pca_layers is not None else None
        self.similarity = None if similarity is None else SimilarityMeasures(**dict(similarity))
        self.readout = None if readout is None else ReadoutMeasures(**dict(readout))
        self.save_window_means = bool(save_window_means)
        self.pools_windows = self.readout is not None or self.save_window_means
        self._unsaved_warned = False

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._pca_layers(self.probed_layers(pl_module))

    def measure(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        tokens: dict[str, Tensor] | None,
        when: ProbeTime,
    ) -> Measurement:
        pca_layers = set(self._pca_layers(self.probed_layers(pl_module)))
        rows: list[Row] = []
        clouds: dict[str, PointCloud] = {}
        show = trainer.is_global_zero and trainer.progress_bar_callback is not None
        previous: tuple[str, Tokens | None] = ("", None)
        for layer, X in tqdm(
            tokens.items(), desc=f"isotropy probe, {when.label}", leave=False, disable=not show
        ):
            before = previous[1] if _same_tokens(previous[0], layer) else None
            values, measured, clusters = self._measure_layer(
                layer, X, when.title, before, layer in pca_layers
            )
            if clusters is not None:
                clouds[layer] = PointCloud(
                    pca_coordinates(X), cluster_colours(clusters.labels), clusters.k
                )
            rows += [Row(layer, metric, value, note) for metric, (value, note) in values.items()]
            if measured is not None:
                measured.previous = None  # only the layer just before stays in memory
            previous = (layer, measured)
        matrix = None
        if self.similarity is not None:
            pair_rows, matrix = self.similarity.measure(tokens, when)
            rows += pair_rows
        if self.readout is not None:
            targets = self.readout.targets(val_dataset(trainer), self.window_indices)
            rows += self.readout.measure(self.window_means, targets)
        return Measurement(rows, _Clouds(clouds, matrix))

    def take(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        collected: Collected | None,
        epoch: int,
        step: int,
        pass_seconds: float,
    ) -> None:
        super().take(trainer, pl_module, collected, epoch, step, pass_seconds)
        if trainer.is_global_zero and self.similarity is not None and self.similarity.layer_pairs:
            self.similarity.write_pairs(self.output_path / PAIRS_CSV)
        if trainer.is_global_zero and self.save_window_means and collected is not None:
            self._write_window_means(trainer, collected.pooled or {}, ProbeTime(epoch, step))

    def _write_window_means(
        self, trainer: Trainer, means: dict[str, Tensor], when: ProbeTime
    ) -> None:
        """The window means of this probe as ``last`` and, at step 0 (the model before
        training), also as ``epoch0`` (global rank zero; the gathered means are the same on
        every rank)."""
        identity = window_identity(val_dataset(trainer), self.window_indices)
        if identity is None:
            if not self._unsaved_warned:
                rank_zero_warn(
                    "IsotropyProbe: window means not saved: the validation set does not say "
                    "where its windows start (a `starts` array of (series, forecast origin) "
                    "rows, as isoprobe.data.windows.WindowDataset has)"
                )
                self._unsaved_warned = True
            return
        kinds = ("epoch0", "last") if when.step == 0 and when.epoch == 0 else ("last",)
        for kind in kinds:
            path = self.output_path / DIRECTORY / FILES[kind]
            write_window_means(path, means, *identity, when.epoch)

    def save_artefacts(self, directory: Path, when: ProbeTime, measurement: Measurement) -> None:
        for layer, cloud in measurement.artefacts.clouds.items():
            save_point_cloud(
                directory / PCA_DIR / f"{layer}_{when.label}.png",
                cloud.coords,
                cloud.colours,
                f"{layer}, {when.title}: {len(cloud.coords)} tokens, "
                f"{cloud.num_clusters} cluster(s)",
            )
        if self.similarity is not None:
            path = directory / HEATMAP_DIR / f"{when.label}.png"
            self.similarity.save_heatmap(path, when.title, measurement.artefacts.matrix)

    def wandb_media(self, when: ProbeTime, measurement: Measurement) -> dict[str, Any]:
        media = point_clouds(self.log_prefix, measurement.artefacts.clouds)
        paths = self.figure_paths(when)
        if paths:
            import wandb

            media.update((k, wandb.Image(str(p))) for k, p in paths.items() if p.is_file())
        return media

    def figure_paths(self, when: ProbeTime) -> dict[str, Path]:
        if self.similarity is None or not self.similarity.layer_pairs:
            return {}
        path = self.output_path / HEATMAP_DIR / f"{when.label}.png"
        return {f"{self.log_prefix}/cka_layers": path}

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.similarity is not None:
            state["similarity"] = self.similarity.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        # saved weights probed outside fit keep no trajectory, nor its epoch-0 reference
        if self.similarity is not None and self._saved_at is None:
            self.similarity.load_state_dict(state_dict.get("similarity", {}))

    def _pca_layers(self, layers: dict[str, nn.Module]) -> list[str]:
        if self.pca_layers is not None:
            unknown = [layer for layer in self.pca_layers if layer not in layers]
            if unknown:
                raise ValueError(
                    f"IsotropyProbe: pca_layers {unknown} are not probed; probed layers are "
                    f"{list(layers)}. Set callbacks.{self.name}.pca_layers to some of them."
                )
            return list(self.pca_layers)
        encoder = [layer for layer in layers if layer.startswith("encoder.")]
        candidates = encoder or list(layers)
        return list(dict.fromkeys([candidates[0], candidates[-1]])) if candidates else []

    def _measure_layer(
        self, layer: str, X: Tensor, label: str, previous: Tokens | None, with_cloud: bool
    ) -> tuple[dict[str, tuple[float, str]], Tokens | None, ClusterCosine | None]:
        """metric -> (value, note) of one layer's tokens, the measured :class:`Tokens` (None
        when the layer was not measured) and, ``with_cloud``, its clustering for the cloud.

        A layer that cannot be measured (too few tokens, non-finite rows) gives one
        ``error`` row with the reason; the other layers go on.
        """
        try:
            measured = Tokens(X, self.metrics_config, previous)
            values = measure_tokens(measured)
            clusters = measured.clusters if with_cloud else None
        except ValueError as err:
            rank_zero_warn(f"IsotropyProbe: layer {layer} at {label} not measured: {err}")
            return {ERROR_METRIC: (math.nan, str(err))}, None, None
        undefined = [m for m, v in values.items() if math.isnan(v)]
        if undefined:
            rank_zero_warn(
                f"IsotropyProbe: layer {layer} at {label} is degenerate "
                f"({X.shape[0]} tokens): {undefined} undefined (NaN)"
            )
        ordered = {TOKENS_METRIC: (float(X.shape[0]), "")}
        ordered.update((m, (value, "")) for m, value in values.items())
        return ordered, measured, clusters


def _same_tokens(previous: str, layer: str) -> bool:
    """Whether ``layer`` has the tokens of the layer probed before it, row for row: two layers of
    one stack (``encoder.2``, ``encoder.3.attn``), or ``embed`` and the stack's first layer (the
    layers of a stack share their mask, hence their subsample). ``decoder.0`` after the last
    encoder layer reads other positions."""
    return previous == "embed" or (bool(previous) and _stack(previous) == _stack(layer))


def _stack(layer: str) -> str:
    return layer.split(".", 1)[0]
