"""The probe framework: a probe callback is a measure set of its Trainer's probe hub.

The :class:`~isoprobe.probing.hub.ProbeHub` of the Trainer owns what the probes share: the
schedule (epoch 0, the model as loaded, before the first training step; then after every
``every_n_epochs``-th epoch, after that epoch's validation, or by optimizer steps:
:mod:`isoprobe.probing.schedule`; a validation-only run
(``trainer.validate``) once, labelled with the epoch its weights were saved after; never in the
sanity check or under ``fast_dev_run``), following, and the collection pass (the real tokens of
every probed layer, :mod:`isoprobe.probing.collect`, run ONCE per probe time for the probes
that read the same windows, site and tokens, then freed). A :class:`Probe` joins the hub at
setup, chooses and keeps its probe set of validation windows (in the checkpoint), measures what
the hub hands it, and keeps its records (``probe, epoch, global_step, layer, metric, value,
note``), which :class:`~isoprobe.probing.probe_output.ProbeOutput` writes to their CSV file,
draws and publishes to every logger under the probe's ``log_prefix`` (W&B: plotted against
``<prefix>/step``, a table per probe, media the probe adds); its checkpoint state goes under a
unique ``state_key`` (the probe's ``name``).

A subclass implements :meth:`Probe.measure` (and, for pictures, :meth:`Probe.save_artefacts`
and :meth:`Probe.wandb_media`); one that measures weights only sets ``reads_tokens = False``,
one that needs each window's pooled tokens (the readout) ``pools_windows = True``.
"""

from __future__ import annotations

import inspect
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor, nn
from typing_extensions import override

from isoprobe.models.base import check_probe_site
from isoprobe.probing.collect import PROBE_PRECISIONS, WINDOW_SELECTIONS, probe_window_indices
from isoprobe.probing.hub import FOLLOWED, Collected, ProbeHub, TokenRequest, val_dataset
from isoprobe.probing.measurement import Measurement, Row
from isoprobe.probing.probe_output import ProbeOutput
from isoprobe.probing.records import make_record
from isoprobe.probing.schedule import ProbeTime, Schedule

__all__ = ["Measurement", "Probe", "Row"]

TOKEN_CHOICES = ("real", "all")


class Probe(Callback, ABC):
    """Base of every probe callback (see the module docstring).

    Args:
        name: the probe's name: its records' ``probe`` field and its checkpoint state key.
        every_n_epochs: probe after every n-th training epoch (epoch 0 is always probed).
        every_n_steps: probe after every n-th optimizer step instead (step 0 is always probed).
        log_spaced_steps: probe at this many steps, log-spaced from step 0 to the last, instead
            (:class:`~isoprobe.probing.schedule.Schedule`).
        num_windows: size of the fixed probe set of validation windows.
        window_selection: ``first`` windows of ``datamodule.val_dataset`` | ``random`` (seeded).
        max_tokens: tokens per layer, subsampled with a fixed seed.
        layers: layer names to probe; None = every layer of the model's ``probe_layers(site)``.
        batch_size: probe windows per forward pass.
        seed: seed of the random window choice and the token subsample.
        output_dir: where the CSV and PNGs go; None = ``trainer.log_dir``.
        site: ``block`` (every block's output) | ``attention`` (every self-attention
            sub-layer's output before the residual add).
        tokens: ``real`` (the model's ``token_masks``) | ``all`` (every position).
        csv_name: the file its records go to in ``output_dir``.
        trajectory_png: the end-of-fit plot of every metric against epoch, in ``output_dir``.
        log_prefix: logged keys are ``<log_prefix>/<metric>/<layer>``.
        log_tables: also log a W&B table of each probe's rows.
        figures_every_n_epochs: the probe's pictures (PCA clouds, flow-of-ranks, spectra) are
            drawn at the first and the last probe of a run, and also after every n-th epoch
            when n > 0 (1: every probe). A picture takes a tenth to a third of a second to
            draw, more than the rest of a small model's probe; the values are in the CSV and
            the loggers at every probe either way. -1: no pictures at all (a study's grid,
            whose analysis draws its own).
        precision: the numerics of the collection pass (:data:`PROBE_PRECISIONS`):
            ``float32`` (autocast off, float32 weights) whatever ``trainer.precision``, so the
            geometry of given weights does not depend on the training precision, or
            ``trainer``: the trainer's validation precision (``bf16-mixed``: autocast).
        follow: the name of another probe whose probe set and schedule (the
            :data:`~isoprobe.probing.hub.FOLLOWED` settings) this one takes when that
            probe is in the Trainer (its own apply when it is not); a followed setting given
            here other than its default is refused then, as it would be ignored.

    Attributes:
        own_settings: the :data:`~isoprobe.probing.hub.FOLLOWED` settings as given.
        hub: the :class:`~isoprobe.probing.hub.ProbeHub` of the Trainer this probe was set
            up in (None before setup); ``collection`` is the same object (its former name).
        output: the :class:`~isoprobe.probing.probe_output.ProbeOutput` that writes, draws
            and logs its results.
    """

    #: whether :meth:`measure` reads collected tokens (weights-only probes set False)
    reads_tokens = True
    #: whether :meth:`measure` reads each probe window's mean real token per layer
    pools_windows = False

    def __init__(
        self,
        name: str,
        csv_name: str,
        trajectory_png: str,
        log_prefix: str,
        every_n_epochs: int = 1,
        every_n_steps: int | None = None,
        log_spaced_steps: int | None = None,
        num_windows: int = 32,
        window_selection: str = "first",
        max_tokens: int = 2000,
        layers: list[str] | None = None,
        batch_size: int = 16,
        seed: int = 0,
        output_dir: str | None = None,
        site: str = "block",
        tokens: str = "real",
        log_tables: bool = True,
        figures_every_n_epochs: int = 0,
        precision: str = "float32",
        follow: str | None = None,
    ) -> None:
        Schedule(every_n_epochs, every_n_steps, log_spaced_steps)  # refuses a bad schedule
        if figures_every_n_epochs < -1:
            raise ValueError(
                f"figures_every_n_epochs must be >= -1 (0: first and last probe only, -1: "
                f"never), got {figures_every_n_epochs}"
            )
        if num_windows < 1:
            raise ValueError(f"num_windows must be >= 1, got {num_windows}")
        if max_tokens < 2:
            raise ValueError(f"max_tokens must be >= 2 (metrics need two tokens), got {max_tokens}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if layers is not None and len(layers) == 0:
            raise ValueError(
                "layers=[] probes nothing; give layer names, null for every layer, or leave "
                "the probe out of the callbacks"
            )
        check_probe_site(site)
        if tokens not in TOKEN_CHOICES:
            raise ValueError(f"tokens must be one of {TOKEN_CHOICES}, got {tokens!r}")
        if precision not in PROBE_PRECISIONS:
            raise ValueError(
                f"precision must be one of {PROBE_PRECISIONS} (float32: the probe's forward in "
                f"float32 whatever trainer.precision), got {precision!r}"
            )
        if window_selection not in WINDOW_SELECTIONS:
            raise ValueError(
                f"window_selection must be one of {WINDOW_SELECTIONS}, got {window_selection!r}"
            )
        self.name = name
        self.csv_name = csv_name
        self.trajectory_png = trajectory_png
        self.log_prefix = log_prefix
        self.every_n_epochs = int(every_n_epochs)
        self.every_n_steps = None if every_n_steps is None else int(every_n_steps)
        self.log_spaced_steps = None if log_spaced_steps is None else int(log_spaced_steps)
        self.num_windows = int(num_windows)
        self.window_selection = window_selection
        self.max_tokens = int(max_tokens)
        self.layers = list(layers) if layers is not None else None
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.output_dir = output_dir
        self.site = site
        self.tokens = tokens
        self.log_tables = bool(log_tables)
        self.figures_every_n_epochs = int(figures_every_n_epochs)
        self.precision = precision
        if follow == name:
            raise ValueError(f"probe {name!r} cannot follow itself")
        self.follow = follow
        self.own_settings = {key: getattr(self, key) for key in FOLLOWED}
        self.hub: ProbeHub | None = None
        self.output = ProbeOutput(self)

        self._records: list[dict[str, Any]] = []
        self._probed: set[tuple[int, int]] = set()
        self._window_indices: list[int] | None = None
        self._dir: Path | None = None
        self._saved_at: tuple[int, int] | None = None
        #: wall time of each probe by step
        self.seconds: dict[int, float] = {}
        #: during :meth:`measure` of a probe that pools windows: layer -> [windows, D]
        self.window_means: dict[str, Tensor] | None = None

    # ---------------------------------------------------------------- what a probe measures

    @abstractmethod
    def measure(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        tokens: dict[str, Tensor] | None,
        when: ProbeTime,
    ) -> Measurement:
        """The probe's rows from ``tokens`` (layer -> [N, D] collected rows, the same on every
        rank; None if the probe does not read tokens) and/or the model's weights (a probe that
        pools windows finds each window's mean token in :attr:`window_means`)."""

    def save_artefacts(self, directory: Path, when: ProbeTime, measurement: Measurement) -> None:
        """Write the probe's pictures of one probe under ``directory`` (global rank zero)."""

    def wandb_media(self, when: ProbeTime, measurement: Measurement) -> dict[str, Any]:
        """W&B media of one probe, logged in the same history row as its values."""
        return {}

    def figure_paths(self, when: ProbeTime) -> dict[str, Path]:
        """The pictures of one probe that go to W&B as images (key -> PNG), once drawn."""
        return {}

    # ---------------------------------------------------------------- public state

    @property
    def collection(self) -> ProbeHub | None:
        """The hub of the Trainer (the shared collection pass), as :attr:`hub`."""
        return self.hub

    @property
    def schedule(self) -> Schedule:
        return Schedule(self.every_n_epochs, self.every_n_steps, self.log_spaced_steps)

    def has_probed(self, epoch: int, step: int) -> bool:
        return (epoch, step) in self._probed

    @property
    @override
    def state_key(self) -> str:
        # unique per probe name, so that several probes share one Trainer and one checkpoint
        return self._generate_state_key(name=self.name)

    @property
    def records(self) -> list[dict[str, Any]]:
        """Every record so far, in probe order: dicts with keys ``probe``, ``epoch``,
        ``global_step``, ``layer``, ``metric``, ``value`` (float, NaN where undefined) and
        ``note`` (the reason for ``metric == "error"`` rows, else empty)."""
        return [dict(r) for r in self._records]

    @property
    def probed_epochs(self) -> list[int]:
        return sorted({epoch for epoch, _ in self._probed})

    @property
    def probed_steps(self) -> list[int]:
        return sorted({step for _, step in self._probed})

    @property
    def window_indices(self) -> list[int] | None:
        """Validation-set indices of the probe set (chosen at the first probe)."""
        return None if self._window_indices is None else list(self._window_indices)

    @property
    def output_path(self) -> Path:
        """Where the probe's files go (known after ``setup``)."""
        if self._dir is None:
            raise RuntimeError(f"{type(self).__name__}: the output directory is known after setup")
        return self._dir

    @property
    def csv_path(self) -> Path:
        return self.output_path / self.csv_name

    # ---------------------------------------------------------------- Lightning hooks

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # trainer.log_dir broadcasts from rank 0, so every rank asks for it
        root = self.output_dir if self.output_dir else trainer.log_dir or trainer.default_root_dir
        self._dir = Path(root)
        self.output.new_directory()
        defaults = inspect.signature(Probe.__init__).parameters
        self.hub = ProbeHub.of(trainer)
        self.hub.join(self, {key: defaults[key].default for key in FOLLOWED})
        self.probed_layers(pl_module)  # an unknown layer name fails before training starts

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._records:
            # a resumed run's file starts with the trajectory so far
            self.output.write_csv(trainer, self._records)
        if trainer.global_step == 0:
            self.hub.probe(trainer, pl_module, trainer.current_epoch, trainer.global_step, "start")
        elif not self._records:
            rank_zero_info(
                f"{type(self).__name__}: resuming from a checkpoint without probe records; the "
                f"trajectory starts after epoch {trainer.current_epoch}"
            )

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Lightning runs the epoch-end validation before this hook, so this is the probe
        # "at the end of validation" of the epoch, whatever val_check_interval says
        epoch = trainer.current_epoch + 1
        self.hub.probe(trainer, pl_module, epoch, trainer.global_step, "epoch")

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.schedule.by_steps:
            return
        # the epoch label counts the epochs completed, as the probe after an epoch's end does
        last = trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        epoch = trainer.current_epoch + int(last)
        self.hub.probe(trainer, pl_module, epoch, trainer.global_step, "step")

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == TrainerFn.VALIDATING and not trainer.sanity_checking:
            epoch, step = self._saved_at or (trainer.current_epoch, trainer.global_step)
            self.hub.probe(trainer, pl_module, epoch, step, "validate")

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
        self.output.finish(trainer, self._records)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "records": [dict(r) for r in self._records],
            "probed": sorted(self._probed),
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
            self._probed = {(int(r["epoch"]), int(r["global_step"])) for r in self._records} | {
                (int(epoch), int(step)) for epoch, step in state_dict.get("probed", ())
            }
        self._window_indices = state_dict["window_indices"]
        changed = {
            key: (state_dict[key], getattr(self, key))
            for key in ("seed", "max_tokens")
            if state_dict[key] != getattr(self, key)
        }
        if changed:
            rank_zero_warn(
                f"{type(self).__name__}: the checkpoint's probe used {changed} (checkpoint, "
                "config); keeping the checkpoint's probe set, token seed and token count so the "
                "trajectory stays comparable"
            )
        self.seed = int(state_dict["seed"])
        self.max_tokens = int(state_dict["max_tokens"])

    # ---------------------------------------------------------------- the probe

    def probed_layers(self, pl_module: LightningModule) -> dict[str, nn.Module]:
        """Layer name -> module of the layers this probe reads (``layers``, or all)."""
        if not hasattr(pl_module, "probe_layers"):
            raise TypeError(
                f"{type(self).__name__} needs a model with probe_layers(), probe_forward() and "
                f"token_masks() (an isoprobe ForecastModule); {type(pl_module).__name__} has not"
            )
        available = pl_module.probe_layers(self.site)
        if self.layers is None:
            return dict(available)
        unknown = [layer for layer in self.layers if layer not in available]
        if unknown:
            raise ValueError(
                f"{type(self).__name__}: unknown layer(s) {unknown}; this model's layers are "
                f"{list(available)}. Set callbacks.{self.name}.layers to some of them (or null)."
            )
        return {layer: available[layer] for layer in self.layers}

    def token_request(self, trainer: Trainer) -> TokenRequest:
        """This probe's collection request (choosing the probe set at the first call)."""
        if self._window_indices is None:
            self._window_indices = probe_window_indices(
                len(val_dataset(trainer)), self.num_windows, self.window_selection, self.seed
            )
        return TokenRequest(
            self.site,
            self.tokens,
            tuple(self._window_indices),
            self.batch_size,
            self.max_tokens,
            self.seed,
            self.precision,
        )

    def take(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        collected: Collected | None,
        epoch: int,
        step: int,
        pass_seconds: float,
    ) -> None:
        """Measure what the hub collected at ``epoch`` and ``step`` (``pass_seconds``: the share
        of the collection pass this probe's time counts), record and publish it."""
        started = time.perf_counter()
        self.window_means = None if collected is None else collected.pooled
        tokens = None if collected is None else collected.tokens
        when = ProbeTime(epoch, step, self.schedule.by_steps)
        measurement = self.measure(trainer, pl_module, tokens, when)
        self.window_means = None
        del tokens, collected
        records = [
            make_record(epoch, step, r.layer, r.metric, r.value, r.note, probe=self.name)
            for r in measurement.rows
        ]
        self._records += records
        self._probed.add((epoch, step))
        self.seconds[step] = pass_seconds + time.perf_counter() - started
        if trainer.is_global_zero:
            self.output.publish(
                trainer, when, records, measurement, self._records, self.seconds[step]
            )
