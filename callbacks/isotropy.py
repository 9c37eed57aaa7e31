"""IsotropyProbe: the geometry of every layer's hidden representations over training.

On a probe set of validation windows fixed for the whole run, the callback collects each
layer's real context tokens (the model's ``token_masks``), subsamples them with a fixed seed to
at most ``max_tokens`` rows and computes :func:`isoprobe.metrics.probe_metrics` in float64
(definitions: :mod:`isoprobe.metrics.reference`). Epoch 0 is the model as loaded, probed before
the first training step; epoch e is the model after e training epochs. A validation-only run
(``trainer.validate``) is probed once: as epoch ``trainer.current_epoch``, or, for weights read
from a checkpoint, as the epoch they were saved at.

Outputs: ``probe/<metric>/<layer>`` and ``probe/epoch`` to every logger (rank zero);
``csv_name`` (``probe_metrics.csv``: one row per epoch x layer x metric, rewritten atomically
every probe),
``pca/<layer>_epoch<e>.png`` and, at the end of fit, ``probe_trajectories.png`` in the output
directory; with a W&B logger also a per-epoch table and 3-D PCA point clouds.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

from isoprobe.callbacks.collect import (
    WINDOW_SELECTIONS,
    ProbePlan,
    gather_subsampled_tokens,
    probe_window_indices,
    run_probe_forward,
)
from isoprobe.callbacks.plots import (
    cluster_colours,
    pca_coordinates,
    save_point_cloud,
    save_trajectories,
)
from isoprobe.callbacks.publish import (
    PointCloud,
    log_epoch,
    log_trajectory_image,
    scalar_metrics,
    wandb_media,
)
from isoprobe.callbacks.records import (
    DEFAULT_PROBE,
    keep_foreign_file,
    make_record,
    write_records,
)
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor, nn
from torch.utils.data import Dataset
from tqdm.auto import tqdm
from typing_extensions import override

from isoprobe.metrics import (
    ALL_METRICS,
    ClusterCosine,
    ProbeMetricsConfig,
    cluster_adjusted_cosine,
    probe_metrics,
)
from isoprobe.models.base import check_probe_site

CSV_NAME = "probe_metrics.csv"
TOKEN_CHOICES = ("real", "all")
TRAJECTORY_PNG = "probe_trajectories.png"
PCA_DIR = "pca"
ERROR_METRIC = "error"
TOKENS_METRIC = "n_tokens"  # rows measured (after masking and subsampling)
_METRIC_ORDER = [key for keys in ALL_METRICS.values() for key in keys]


def _cluster_values(clusters: ClusterCosine) -> dict[str, float]:
    """The ``cos_cluster`` group of :func:`probe_metrics` keys from a clustering result."""
    return {
        "cos_cluster": float(clusters.value),
        "cos_cluster_baseline": float(clusters.baseline),
        "cos_cluster_excess": float(clusters.excess),
        "n_clusters": float(clusters.k),
        "silhouette": float(clusters.silhouette),
    }


class IsotropyProbe(Callback):
    """Probe isotropy, effective dimension, partition ratio and rank of every layer.

    Args:
        every_n_epochs: probe after every n-th training epoch (epoch 0 is always probed).
            Nothing is probed in the sanity check or under ``fast_dev_run``.
        num_windows: size of the fixed probe set of validation windows.
        window_selection: ``first``: the first windows of ``datamodule.val_dataset``;
            ``random``: a seeded random subset of them.
        max_tokens: tokens per layer, subsampled with a fixed seed (2000 as the isotropy paper).
        layers: layer names to probe; None = all that the model's ``probe_layers()`` returns.
        metrics: :class:`isoprobe.metrics.ProbeMetricsConfig` fields (``metrics``, ``k_min``,
            ``k_max``, ``min_silhouette``, ``seed``, ``ed_threshold``, ``rank_eps``);
            ``seed`` defaults to this callback's ``seed``.
        batch_size: probe windows per forward pass.
        seed: seed of the random window choice, the token subsample and k-means.
        output_dir: where ``probe_metrics.csv`` and the PNGs go; None = ``trainer.log_dir``
            (the first logger's directory, else ``trainer.default_root_dir``).
        site: ``block`` (every block's output, the residual stream) | ``attention`` (every
            self-attention sub-layer's output before the residual add, the isotropy paper's
            site); see ``ForecastModule.probe_layers``.
        name: the probe's name: its records' ``probe`` field and its checkpoint state key, so
            that several probes can share one Trainer.
        csv_name: the file its records go to in ``output_dir``.
        tokens: ``real`` (the model's ``token_masks``: observed context values only) | ``all``
            (every position, EOS, padding and special tokens included, as the paper's code).
        pca_layers: layers whose 3-D PCA point cloud (coloured by k-means cluster) is saved and
            logged each probe; None = the first and the last ``encoder.*`` layer probed (the
            first and last probed layer if there is no encoder layer); ``[]`` = none.
        log_tables: also log a W&B table of the epoch's (epoch, layer, metric, value) rows.

    Attributes:
        records: every row so far (see the property); ``probed_epochs``: the epochs probed;
        ``window_indices``: the probe set; ``seconds``: wall time of each probe by epoch.
    """

    def __init__(
        self,
        every_n_epochs: int = 1,
        num_windows: int = 32,
        window_selection: str = "first",
        max_tokens: int = 2000,
        layers: list[str] | None = None,
        metrics: dict[str, Any] | None = None,
        batch_size: int = 16,
        seed: int = 0,
        output_dir: str | None = None,
        pca_layers: list[str] | None = None,
        log_tables: bool = True,
        site: str = "block",
        tokens: str = "real",
        name: str = DEFAULT_PROBE,
        csv_name: str = CSV_NAME,
    ) -> None:
        if every_n_epochs < 1:
            raise ValueError(f"every_n_epochs must be >= 1, got {every_n_epochs}")
        if num_windows < 1:
            raise ValueError(f"num_windows must be >= 1, got {num_windows}")
        if max_tokens < 2:
            raise ValueError(f"max_tokens must be >= 2 (metrics need two tokens), got {max_tokens}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if layers is not None and len(layers) == 0:
            raise ValueError(
                "layers=[] probes nothing; give layer names, null for every layer, or turn the "
                "probe off with callbacks=none"
            )
        check_probe_site(site)
        if tokens not in TOKEN_CHOICES:
            raise ValueError(f"tokens must be one of {TOKEN_CHOICES}, got {tokens!r}")
        if window_selection not in WINDOW_SELECTIONS:
            raise ValueError(
                f"window_selection must be one of {WINDOW_SELECTIONS}, got {window_selection!r}"
            )
        self.every_n_epochs = int(every_n_epochs)
        self.num_windows = int(num_windows)
        self.window_selection = window_selection
        self.max_tokens = int(max_tokens)
        self.layers = list(layers) if layers is not None else None
        self.metrics_config = ProbeMetricsConfig.from_any({"seed": seed, **dict(metrics or {})})
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.output_dir = output_dir
        self.pca_layers = list(pca_layers) if pca_layers is not None else None
        self.log_tables = bool(log_tables)
        self.site = site
        self.tokens = tokens
        self.name = name
        self.csv_name = csv_name

        self._records: list[dict[str, Any]] = []
        self._probed_epochs: set[int] = set()
        self._window_indices: list[int] | None = None
        self._dir: Path | None = None
        self._csv_checked = False
        self._wandb_defined: set[int] = set()
        self._saved_at: tuple[int, int] | None = None
        self.seconds: dict[int, float] = {}

    @property
    @override
    def state_key(self) -> str:
        # unique per probe name, so that several probes share one Trainer and one checkpoint
        return self._generate_state_key(name=self.name)

    @property
    def records(self) -> list[dict[str, Any]]:
        """Every record so far, in probe order, as a list of dicts with keys ``epoch``,
        ``global_step``, ``layer``, ``metric``, ``value`` (float, NaN where undefined) and
        ``note`` (the reason for ``metric == "error"`` rows, else empty)."""
        return [dict(r) for r in self._records]

    @property
    def probed_epochs(self) -> list[int]:
        return sorted(self._probed_epochs)

    @property
    def window_indices(self) -> list[int] | None:
        """Validation-set indices of the probe set (chosen at the first probe)."""
        return None if self._window_indices is None else list(self._window_indices)

    @property
    def csv_path(self) -> Path:
        if self._dir is None:
            raise RuntimeError("IsotropyProbe: the output directory is known after setup()")
        return self._dir / self.csv_name

    # ---------------------------------------------------------------- Lightning hooks

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # trainer.log_dir broadcasts from rank 0, so every rank asks for it
        root = self.output_dir if self.output_dir else trainer.log_dir or trainer.default_root_dir
        self._dir = Path(root)
        self._csv_checked = False
        self._pca_layers(self._probed_layers(pl_module))

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._records:
            self._write_csv(trainer)  # a resumed run's file starts with the trajectory so far
        if trainer.global_step == 0:
            self._probe(trainer, pl_module, epoch=trainer.current_epoch)
        elif not self._records:
            rank_zero_info(
                "IsotropyProbe: resuming from a checkpoint without probe records; the "
                f"trajectory starts after epoch {trainer.current_epoch}"
            )

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Lightning runs the epoch-end validation before this hook, so this is the probe
        # "at the end of validation" of the epoch, whatever val_check_interval says
        epoch = trainer.current_epoch + 1
        if not trainer.sanity_checking and epoch % self.every_n_epochs == 0:
            self._probe(trainer, pl_module, epoch)

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == TrainerFn.VALIDATING and not trainer.sanity_checking:
            epoch, step = self._saved_at or (trainer.current_epoch, trainer.global_step)
            self._probe(trainer, pl_module, epoch, step)

    @override
    def on_load_checkpoint(
        self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # validate(ckpt_path=...) outside fit (task=probe on saved weights): those weights are
        # probed and labelled with the epoch and step they were saved at, the labels the run
        # that saved them gave its probe after that epoch
        if trainer.state.fn == TrainerFn.FITTING:
            self._saved_at = None
        else:
            self._saved_at = (int(checkpoint["epoch"]) + 1, int(checkpoint["global_step"]))

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero and self._records:
            path = self._dir / TRAJECTORY_PNG
            if save_trajectories(path, self._records):
                log_trajectory_image(trainer.loggers, path)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "records": [dict(r) for r in self._records],
            "probed_epochs": sorted(self._probed_epochs),
            "window_indices": self._window_indices,
            "seed": self.seed,
            "max_tokens": self.max_tokens,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # saved weights probed outside fit keep the probe set of the run that saved them, not
        # its trajectory: this run's records are its own
        if self._saved_at is None:
            self._records = [dict(r) for r in state_dict["records"]]
            self._probed_epochs = set(
                state_dict.get("probed_epochs", (int(r["epoch"]) for r in self._records))
            )
        self._window_indices = state_dict["window_indices"]
        changed = {
            name: (state_dict[name], getattr(self, name))
            for name in ("seed", "max_tokens")
            if state_dict[name] != getattr(self, name)
        }
        if changed:
            rank_zero_warn(
                f"IsotropyProbe: the checkpoint's probe used {changed} (checkpoint, config); "
                "keeping the checkpoint's probe set, token seed and token count so the "
                "trajectory stays comparable"
            )
        self.seed = int(state_dict["seed"])
        self.max_tokens = int(state_dict["max_tokens"])

    # ---------------------------------------------------------------- the probe

    def _probed_layers(self, pl_module: LightningModule) -> dict[str, nn.Module]:
        if not hasattr(pl_module, "probe_layers"):
            raise TypeError(
                f"IsotropyProbe needs a model with probe_layers(), probe_forward() and "
                f"token_masks() (an isoprobe ForecastModule); {type(pl_module).__name__} has not"
            )
        available = pl_module.probe_layers(self.site)
        if self.layers is None:
            return dict(available)
        unknown = [name for name in self.layers if name not in available]
        if unknown:
            raise ValueError(
                f"IsotropyProbe: unknown layer(s) {unknown}; this model's layers are "
                f"{list(available)}. Set callbacks.isotropy.layers to some of them (or null)."
            )
        return {name: available[name] for name in self.layers}

    def _pca_layers(self, layers: dict[str, nn.Module]) -> list[str]:
        if self.pca_layers is not None:
            unknown = [name for name in self.pca_layers if name not in layers]
            if unknown:
                raise ValueError(
                    f"IsotropyProbe: pca_layers {unknown} are not probed; probed layers are "
                    f"{list(layers)}. Set callbacks.isotropy.pca_layers to some of them."
                )
            return list(self.pca_layers)
        encoder = [name for name in layers if name.startswith("encoder.")]
        candidates = encoder or list(layers)
        return list(dict.fromkeys([candidates[0], candidates[-1]])) if candidates else []

    @staticmethod
    def _val_dataset(trainer: Trainer) -> Dataset:
        dataset = getattr(trainer.datamodule, "val_dataset", None)
        if dataset is None:
            raise RuntimeError(
                "IsotropyProbe needs the validation windows as trainer.datamodule.val_dataset; "
                "pass a LightningDataModule with a val_dataset to fit()/validate()"
            )
        return dataset

    def _probe(
        self, trainer: Trainer, pl_module: LightningModule, epoch: int, step: int | None = None
    ) -> None:
        if epoch in self._probed_epochs or trainer.fast_dev_run:
            return
        started = time.perf_counter()
        layers = self._probed_layers(pl_module)
        pca_layers = set(self._pca_layers(layers))
        dataset = self._val_dataset(trainer)
        if self._window_indices is None:
            self._window_indices = probe_window_indices(
                len(dataset), self.num_windows, self.window_selection, self.seed
            )
        plan = ProbePlan.build(len(self._window_indices), self.batch_size, trainer.world_size)
        local = run_probe_forward(
            trainer, pl_module, dataset, self._window_indices, plan, layers, self.tokens == "all"
        )
        tokens = gather_subsampled_tokens(trainer, plan, local, self.max_tokens, self.seed)
        del local

        records: list[dict[str, Any]] = []
        clouds: dict[str, PointCloud] = {}
        step = trainer.global_step if step is None else step
        show = trainer.is_global_zero and trainer.progress_bar_callback is not None
        for layer, X in tqdm(
            tokens.items(), desc=f"isotropy probe, epoch {epoch}", leave=False, disable=not show
        ):
            values, cloud = self._measure(layer, X, epoch, layer in pca_layers)
            if cloud is not None:
                clouds[layer] = cloud
            records += [
                make_record(epoch, step, layer, metric, value, note, probe=self.name)
                for metric, (value, note) in values.items()
            ]
        self._records += records
        self._probed_epochs.add(epoch)
        self.seconds[epoch] = time.perf_counter() - started
        if trainer.is_global_zero:
            self._publish(trainer, epoch, step, records, clouds)

    def _measure(
        self, layer: str, X: Tensor, epoch: int, with_cloud: bool
    ) -> tuple[dict[str, tuple[float, str]], PointCloud | None]:
        """metric -> (value, note) of one layer's tokens, and its point cloud if asked.

        A layer that cannot be measured (too few tokens, non-finite rows) gives one
        ``error`` row with the reason; the other layers go on.
        """
        cfg = self.metrics_config
        try:
            if with_cloud:
                clusters = cluster_adjusted_cosine(
                    X, cfg.k_min, cfg.k_max, cfg.min_silhouette, cfg.seed
                )
                rest = tuple(m for m in cfg.metrics if m != "cos_cluster")
                values = probe_metrics(X, dataclasses.replace(cfg, metrics=rest))
                if "cos_cluster" in cfg.metrics:
                    values.update(_cluster_values(clusters))
            else:
                values = probe_metrics(X, cfg)
        except ValueError as err:
            rank_zero_warn(f"IsotropyProbe: layer {layer} at epoch {epoch} not measured: {err}")
            return {ERROR_METRIC: (math.nan, str(err))}, None
        undefined = [m for m, v in values.items() if math.isnan(v)]
        if undefined:
            rank_zero_warn(
                f"IsotropyProbe: layer {layer} at epoch {epoch} is degenerate "
                f"({X.shape[0]} tokens): {undefined} undefined (NaN)"
            )
        ordered = {TOKENS_METRIC: (float(X.shape[0]), "")}
        ordered.update((m, (values[m], "")) for m in _METRIC_ORDER if m in values)
        cloud = None
        if with_cloud:
            cloud = PointCloud(pca_coordinates(X), cluster_colours(clusters.labels), clusters.k)
        return ordered, cloud

    def _write_csv(self, trainer: Trainer) -> None:
        if not trainer.is_global_zero:
            return
        if not self._csv_checked:
            keep_foreign_file(self.csv_path, self._records)
            self._csv_checked = True
        write_records(self.csv_path, self._records)

    def _publish(
        self,
        trainer: Trainer,
        epoch: int,
        step: int,
        records: list[dict[str, Any]],
        clouds: dict[str, PointCloud],
    ) -> None:
        self._write_csv(trainer)
        for layer, cloud in clouds.items():
            save_point_cloud(
                self._dir / PCA_DIR / f"{layer}_epoch{epoch}.png",
                cloud.coords,
                cloud.colours,
                f"{layer}, epoch {epoch}: {len(cloud.coords)} tokens, "
                f"{cloud.num_clusters} cluster(s)",
            )
        metrics = scalar_metrics(epoch, records, self.seconds[epoch])
        media = None
        if any(isinstance(logger, WandbLogger) for logger in trainer.loggers):
            media = wandb_media(epoch, records, clouds, self.log_tables)
        log_epoch(trainer.loggers, step, metrics, media, self._wandb_defined)
