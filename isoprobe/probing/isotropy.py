"""The isotropy measures: the geometry of every probed layer's hidden representations.

At each probe time (:mod:`isoprobe.probing.callback`), each layer's collected tokens, at most
``max_tokens`` rows subsampled with a fixed seed, go through
:func:`isoprobe.metrics.probe_metrics` in float64 (definitions: :mod:`isoprobe.metrics.reference`).

Rows go to the ``isotropy`` output group (``probe_metrics.csv``, ``probe/<metric>/<layer>``);
pictures: ``pca/<layer>_<label>.png`` (``epoch<e>``, or ``step<s>`` in a schedule in steps) and,
with a W&B logger, 3-D PCA point clouds.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from tqdm.auto import tqdm

from isoprobe.metrics import ClusterCosine, ProbeMetricsConfig, Tokens, measure_tokens
from isoprobe.probing.measure_set import MeasureSet, ProbeInputs
from isoprobe.probing.measurement import Measurement, Row
from isoprobe.probing.plots import cluster_colours, pca_coordinates, save_point_cloud
from isoprobe.probing.publish import PointCloud, point_clouds
from isoprobe.probing.schedule import ProbeTime

PCA_DIR = "pca"
ERROR_METRIC = "error"
TOKENS_METRIC = "n_tokens"  # rows measured (after masking and subsampling)


class IsotropyMeasures(MeasureSet):
    """Isotropy, effective dimension, partition ratio and rank of every probed layer.

    Args:
        metrics: :class:`isoprobe.metrics.ProbeMetricsConfig` fields (``metrics``: ``all`` or
            names of registered ``tokens`` measures, ``k_min``, ``k_max``, ``min_silhouette``,
            ``seed``, ``ed_threshold``, ``rank_eps``, and ``params``: name -> the options of a
            measure registered with a ``params`` dataclass); ``seed`` defaults to ``seed``.
        pca_layers: layers whose 3-D PCA point cloud (coloured by k-means cluster) is saved and
            logged each probe; None = the first and the last ``encoder.*`` layer probed (the
            first and last probed layer if there is no encoder layer); ``[]`` = none.
        seed: the probe's seed.
    """

    output = "isotropy"

    def __init__(
        self,
        metrics: dict[str, Any] | None = None,
        pca_layers: list[str] | None = None,
        seed: int = 0,
    ) -> None:
        self.metrics_config = ProbeMetricsConfig.from_any({"seed": seed, **dict(metrics or {})})
        self.pca_layers = list(pca_layers) if pca_layers is not None else None
        self._clouds_of: list[str] = []

    def check_layers(self, layers: dict[str, nn.Module]) -> None:
        self._clouds_of = self._pca_layers(layers)

    def measure(self, inputs: ProbeInputs) -> Measurement:
        when = inputs.when
        pca_layers = set(self._clouds_of)
        rows: list[Row] = []
        clouds: dict[str, PointCloud] = {}
        for layer, X in tqdm(
            inputs.tokens.items(),
            desc=f"isotropy probe, {when.label}",
            leave=False,
            disable=not inputs.progress,
        ):
            values, clusters = self._measure_layer(layer, X, when.title, layer in pca_layers)
            if clusters is not None:
                clouds[layer] = PointCloud(
                    pca_coordinates(X), cluster_colours(clusters.labels), clusters.k
                )
            rows += [Row(layer, metric, value, note) for metric, (value, note) in values.items()]
        return Measurement(rows, clouds)

    def save_artefacts(self, directory: Path, when: ProbeTime, artefacts: Any) -> None:
        for layer, cloud in artefacts.items():
            save_point_cloud(
                directory / PCA_DIR / f"{layer}_{when.label}.png",
                cloud.coords,
                cloud.colours,
                f"{layer}, {when.title}: {len(cloud.coords)} tokens, "
                f"{cloud.num_clusters} cluster(s)",
            )

    def wandb_media(
        self, prefix: str, directory: Path, when: ProbeTime, artefacts: Any
    ) -> dict[str, Any]:
        return point_clouds(prefix, artefacts)

    def _pca_layers(self, layers: dict[str, nn.Module]) -> list[str]:
        if self.pca_layers is not None:
            unknown = [layer for layer in self.pca_layers if layer not in layers]
            if unknown:
                raise ValueError(
                    f"the isotropy measures: pca_layers {unknown} are not probed; probed "
                    f"layers are {list(layers)}. Set callbacks.probe.isotropy.pca_layers to "
                    "some of them."
                )
            return list(self.pca_layers)
        encoder = [layer for layer in layers if layer.startswith("encoder.")]
        candidates = encoder or list(layers)
        return list(dict.fromkeys([candidates[0], candidates[-1]])) if candidates else []

    def _measure_layer(
        self, layer: str, X: Tensor, label: str, with_cloud: bool
    ) -> tuple[dict[str, tuple[float, str]], ClusterCosine | None]:
        """metric -> (value, note) of one layer's tokens and, ``with_cloud``, its clustering
        for the cloud.

        A layer that cannot be measured (too few tokens, non-finite rows) gives one
        ``error`` row with the reason; the other layers go on.
        """
        try:
            measured = Tokens(X, self.metrics_config)
            values = measure_tokens(measured)
            clusters = measured.clusters if with_cloud else None
        except ValueError as err:
            rank_zero_warn(f"isotropy measures: layer {layer} at {label} not measured: {err}")
            return {ERROR_METRIC: (math.nan, str(err))}, None
        undefined = [m for m, v in values.items() if math.isnan(v)]
        if undefined:
            rank_zero_warn(
                f"isotropy measures: layer {layer} at {label} is degenerate "
                f"({X.shape[0]} tokens): {undefined} undefined (NaN)"
            )
        ordered = {TOKENS_METRIC: (float(X.shape[0]), "")}
        ordered.update((m, (value, "")) for m, value in values.items())
        return ordered, clusters
