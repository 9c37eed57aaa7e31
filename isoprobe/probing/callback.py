"""The probe: ONE Lightning callback that owns the probe set, the schedule, the collection pass,
the records and the output.

Data flows one way: a Lightning hook (before the first training step, after a training epoch or
an optimizer step, after a validation-only run) asks :class:`ProbeCallback` to probe; if the
time is due by its :class:`~isoprobe.probing.schedule.Schedule` and not yet probed, it runs
ONE collection pass over its probe set (:mod:`isoprobe.probing.probe_set`), hands every measure
set it runs (``measures``: :data:`~isoprobe.probing.measure_sets.MEASURE_SETS`) the same
:class:`~isoprobe.probing.measure_set.ProbeInputs`, turns their rows into records (``probe,
epoch, global_step, layer, metric, value, note``) and hands each output group its records
(:class:`~isoprobe.probing.probe_output.ProbeOutput`: its CSV file, pictures and loggers).

Never in the sanity check or under ``fast_dev_run``. A validation-only run (``trainer.validate``
on saved weights) probes once, labelled with the epoch and step its weights were saved at. The
records, the probe set and the measure sets' state (the CKA reference) go in the checkpoint
under the callback's ``name``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from isoprobe.metrics.plugins import import_plugins
from isoprobe.probing.measure_set import Drawn, ProbeInputs
from isoprobe.probing.measure_sets import build_measure_sets
from isoprobe.probing.probe_output import OUTPUTS, ProbeOutput
from isoprobe.probing.probe_set import ProbeSet, collect_tokens, val_dataset
from isoprobe.probing.records import make_record
from isoprobe.probing.schedule import ProbeTime, Schedule
from isoprobe.probing.window_means import save_probe_window_means

DEFAULT_NAME = "probe"
DEFAULT_MEASURES = ("isotropy", "rank", "cka", "readout")


class ProbeCallback(Callback):
    """Probe the hidden representations of a ForecastModule while it trains (module docstring).

    Args:
        measures: the measure sets to run, in order (their rows keep this order in each output
            group): ``isotropy``, ``rank``, ``cka``, ``readout``, or the name of a registered
            ``pair``, ``windows`` or ``weights`` measure.
        isotropy, rank, cka, readout: each set's options
            (:class:`~isoprobe.probing.isotropy.IsotropyMeasures`,
            :class:`~isoprobe.probing.rank.RankMeasures`,
            :class:`~isoprobe.probing.similarity.SimilarityMeasures`,
            :class:`~isoprobe.probing.readout.ReadoutMeasures`); read only when named in
            ``measures``.
        plugins: modules imported first (dotted names), whose measures, registered with
            :func:`isoprobe.metrics.register_measure`, then run: a ``tokens`` measure in the
            isotropy measures, one of another kind where ``measures`` names it.
        measure_options: the parameters of a registered measure that ``measures`` names, under
            its name (``procrustes_drift={"scaling": True}``).
        save_window_means: save each probe window's mean real token per probed layer
            (``window_means/epoch0.safetensors``, ``window_means/last.safetensors``).
        name: the checkpoint state's key; a name other than ``probe`` starts every output name
            with ``<name>_`` (:meth:`~isoprobe.probing.probe_output.OutputSpec.named`).
        every_n_epochs, every_n_steps, log_spaced_steps: the schedule
            (:class:`~isoprobe.probing.schedule.Schedule`).
        num_windows, window_selection, max_tokens, layers, batch_size: the probe set
            (:class:`~isoprobe.probing.probe_set.ProbeSet`).
        seed, site, tokens, precision: the rest of the probe set: the token seed (also the
            isotropy measures' default seed), the probe site, the tokens and the precision of
            the collection pass.
        output_dir: where the CSV files and pictures go; None = ``trainer.log_dir``.
        log_tables: a W&B table of each probe's rows.
        figures_every_n_epochs: pictures at the first and last probe, and every n-th epoch when
            n > 0; -1: none.

    Attributes:
        passes: how many collection passes the probe has run.
        seconds: output group -> step -> wall time of that group's probe.
    """

    def __init__(
        self,
        measures: list[str] | tuple[str, ...] = DEFAULT_MEASURES,
        isotropy: dict[str, Any] | None = None,
        rank: dict[str, Any] | None = None,
        cka: dict[str, Any] | None = None,
        readout: dict[str, Any] | None = None,
        plugins: list[str] | tuple[str, ...] = (),
        save_window_means: bool = False,
        name: str = DEFAULT_NAME,
        every_n_epochs: int = 1,
        every_n_steps: int | None = None,
        log_spaced_steps: int | None = None,
        num_windows: int = 32,
        window_selection: str = "first",
        max_tokens: int = 2000,
        layers: list[str] | None = None,
        batch_size: int = 16,
        seed: int = 0,
        site: str = "block",
        tokens: str = "real",
        precision: str = "float32",
        output_dir: str | None = None,
        log_tables: bool = True,
        figures_every_n_epochs: int = 0,
        **measure_options: dict[str, Any] | None,
    ) -> None:
        self.schedule = Schedule(every_n_epochs, every_n_steps, log_spaced_steps)
        if figures_every_n_epochs < -1:
            raise ValueError(
                f"figures_every_n_epochs must be >= -1 (0: first and last probe only, -1: "
                f"never), got {figures_every_n_epochs}"
            )
        self.probe_set = ProbeSet(
            int(num_windows),
            window_selection,
            int(max_tokens),
            layers,
            int(batch_size),
            int(seed),
            site,
            tokens,
            precision,
        )
        import_plugins(list(plugins), "callbacks.probe.plugins")
        options = {"isotropy": isotropy, "rank": rank, "cka": cka, "readout": readout}
        options.update(measure_options)
        self.measure_sets = build_measure_sets(list(measures), options, int(seed))
        self.save_window_means = bool(save_window_means)
        self.name = name
        self.output_dir = output_dir
        self.log_tables = bool(log_tables)
        self.figures_every_n_epochs = int(figures_every_n_epochs)
        groups = dict.fromkeys(m.output for m in self.measure_sets.values())
        self.specs = {
            group: OUTPUTS[group] if name == DEFAULT_NAME else OUTPUTS[group].named(name)
            for group in groups
        }
        self.outputs: dict[str, ProbeOutput] = {}
        self.passes = 0
        self.seconds: dict[str, dict[int, float]] = {group: {} for group in groups}
        self._records: dict[str, list[dict[str, Any]]] = {group: [] for group in groups}
        self._probed: set[tuple[int, int]] = set()
        self._window_indices: list[int] | None = None
        self._dir: Path | None = None
        self._saved_at: tuple[int, int] | None = None
        self._unsaved_warned = False

    # ---------------------------------------------------------------- public state

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(name=self.name)

    @property
    def records(self) -> list[dict[str, Any]]:
        """Every record so far, output group by output group, in probe order: dicts with keys
        ``probe``, ``epoch``, ``global_step``, ``layer``, ``metric``, ``value`` (float, NaN
        where undefined) and ``note`` (the reason for ``metric == "error"`` rows)."""
        return [dict(r) for records in self._records.values() for r in records]

    def records_of(self, group: str) -> list[dict[str, Any]]:
        """The records of output group ``group`` (``isotropy`` or ``rank``)."""
        return [dict(r) for r in self._records[group]]

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
            raise RuntimeError("the probe's output directory is known after setup")
        return self._dir

    def csv_rows(self) -> dict[Path, int]:
        """CSV file -> how many records the probe wrote to it so far."""
        return {
            self.output_path / self.specs[group].csv_name: len(records)
            for group, records in self._records.items()
            if records
        }

    # ---------------------------------------------------------------- Lightning hooks

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # trainer.log_dir broadcasts from rank 0, so every rank asks for it
        root = self.output_dir if self.output_dir else trainer.log_dir or trainer.default_root_dir
        self._dir = Path(root)
        self.outputs = {
            group: ProbeOutput(spec, self._dir, self.log_tables, self.figures_every_n_epochs)
            for group, spec in self.specs.items()
        }
        layers = self.probe_set.layers_of(pl_module)  # an unknown layer fails before training
        for measures in self.measure_sets.values():
            measures.check_layers(layers)

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        for group, records in self._records.items():
            if records:  # a resumed run's file starts with the trajectory so far
                self.outputs[group].write_csv(trainer, records)
        if trainer.global_step == 0:
            self._probe(trainer, pl_module, trainer.current_epoch, trainer.global_step, None)
        elif not any(self._records.values()):
            rank_zero_info(
                "the probe: resuming from a checkpoint without probe records; the trajectory "
                f"starts after epoch {trainer.current_epoch}"
            )

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Lightning runs the epoch-end validation before this hook, so this is the probe
        # "at the end of validation" of the epoch, whatever val_check_interval says
        epoch = trainer.current_epoch + 1
        due = self.schedule.after_epoch(epoch)
        self._probe(trainer, pl_module, epoch, trainer.global_step, due)

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.schedule.by_steps:
            return
        # the epoch label counts the epochs completed, as the probe after an epoch's end does
        last = trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        step = trainer.global_step
        due = self.schedule.after_step(step, trainer.estimated_stepping_batches)
        self._probe(trainer, pl_module, trainer.current_epoch + int(last), step, due)

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == TrainerFn.VALIDATING and not trainer.sanity_checking:
            epoch, step = self._saved_at or (trainer.current_epoch, trainer.global_step)
            self._probe(trainer, pl_module, epoch, step, None)

    @override
    def on_load_checkpoint(
        self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # validate(ckpt_path=...) outside fit (task=probe on saved weights): those weights are
        # probed and labelled with the epoch and step they were saved at
        if trainer.state.fn == TrainerFn.FITTING:
            self._saved_at = None
        else:
            self._saved_at = (int(checkpoint["epoch"]) + 1, int(checkpoint["global_step"]))

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        for group, output in self.outputs.items():
            output.finish(trainer, self._records[group])

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "records": {group: [dict(r) for r in rs] for group, rs in self._records.items()},
            "probed": sorted(self._probed),
            "window_indices": self._window_indices,
            "seed": self.probe_set.seed,
            "max_tokens": self.probe_set.max_tokens,
            "measures": {name: m.state_dict() for name, m in self.measure_sets.items()},
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # saved weights probed outside fit keep the probe set of the run that saved them, not
        # its trajectory nor its CKA reference: this run's records are its own
        if self._saved_at is None:
            saved = state_dict["records"]
            self._records = {group: [dict(r) for r in saved.get(group, [])] for group in self.specs}
            self._probed = {(int(r["epoch"]), int(r["global_step"])) for r in self.records} | {
                (int(epoch), int(step)) for epoch, step in state_dict.get("probed", ())
            }
            for name, measures in self.measure_sets.items():
                measures.load_state_dict(state_dict.get("measures", {}).get(name, {}))
        self._window_indices = state_dict["window_indices"]
        probe_set = self.probe_set
        changed = {
            key: (state_dict[key], getattr(probe_set, key))
            for key in ("seed", "max_tokens")
            if state_dict[key] != getattr(probe_set, key)
        }
        if changed:
            rank_zero_warn(
                f"the probe: the checkpoint's probe used {changed} (checkpoint, config); "
                "keeping the checkpoint's probe set, token seed and token count so the "
                "trajectory stays comparable"
            )
        probe_set.seed = int(state_dict["seed"])
        probe_set.max_tokens = int(state_dict["max_tokens"])

    # ---------------------------------------------------------------- the probe

    def _probe(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        epoch: int,
        step: int,
        due: bool | None,
    ) -> None:
        """Probe at ``epoch`` and ``step`` if not yet probed then and ``due`` (None: a probe
        time that is always due, the start of training or a validation-only run)."""
        if trainer.fast_dev_run or trainer.sanity_checking:
            return
        if (epoch, step) in self._probed or due is False:
            return
        started = time.perf_counter()
        inputs = self._collect(trainer, pl_module, ProbeTime(epoch, step, self.schedule.by_steps))
        pass_seconds = time.perf_counter() - started
        rows: dict[str, list] = {group: [] for group in self.specs}
        drawn: dict[str, list[Drawn]] = {group: [] for group in self.specs}
        seconds = dict.fromkeys(self.specs, 0.0)
        seconds[next(iter(self.specs))] = pass_seconds  # the pass counts once, in the first
        for measures in self.measure_sets.values():
            began = time.perf_counter()
            measurement = measures.measure(inputs)
            rows[measures.output] += measurement.rows
            drawn[measures.output].append(Drawn(measures, measurement.artefacts))
            seconds[measures.output] += time.perf_counter() - began
        self._probed.add((epoch, step))
        self.passes += 1
        if trainer.is_global_zero:
            self._write_files(trainer, inputs)
        for group, spec in self.specs.items():
            records = [
                make_record(epoch, step, r.layer, r.metric, r.value, r.note, probe=spec.probe)
                for r in rows[group]
            ]
            self._records[group] += records
            self.seconds[group][step] = seconds[group]
            if trainer.is_global_zero:
                self.outputs[group].publish(
                    trainer,
                    inputs.when,
                    records,
                    drawn[group],
                    self._records[group],
                    seconds[group],
                )

    def _collect(
        self, trainer: Trainer, pl_module: LightningModule, when: ProbeTime
    ) -> ProbeInputs:
        """The one collection pass of a probe time, as every measure set reads it."""
        dataset = val_dataset(trainer)
        if self._window_indices is None:
            self._window_indices = self.probe_set.choose_windows(dataset)
        sets = self.measure_sets.values()
        pooled = self.save_window_means or any(m.pools_windows for m in sets)
        tokens, means = {}, {}
        if pooled or any(m.reads_tokens for m in sets):
            tokens, means = collect_tokens(
                trainer, pl_module, self.probe_set, self._window_indices, pooled
            )
        progress = trainer.is_global_zero and trainer.progress_bar_callback is not None
        return ProbeInputs(
            when, tokens, means, pl_module, dataset, list(self._window_indices), progress
        )

    def _write_files(self, trainer: Trainer, inputs: ProbeInputs) -> None:
        """The files rewritten each probe: the measure sets' own and the window means."""
        for measures in self.measure_sets.values():
            measures.write_files(self.output_path)
        if not self.save_window_means:
            return
        when = inputs.when
        saved = save_probe_window_means(
            self.output_path,
            inputs.dataset,
            inputs.windows,
            inputs.window_means,
            when.epoch,
            when.step,
        )
        if not saved and not self._unsaved_warned:
            rank_zero_warn(
                "the probe: window means not saved: the validation set does not say where its "
                "windows start (a `starts` array of (series, forecast origin) rows, as "
                "isoprobe.data.windows.WindowDataset has)"
            )
            self._unsaved_warned = True
