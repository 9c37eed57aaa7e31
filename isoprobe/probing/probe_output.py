"""Where one output group of the probe goes: :class:`ProbeOutput` (global rank zero only).

An output group (:class:`OutputSpec`, :data:`OUTPUTS`) is a CSV file of records, a log prefix
and a trajectory plot: ``isotropy`` (``probe_metrics.csv``, ``probe/``) holds the rows of the
isotropy, CKA and readout measures, ``rank`` (``rank_metrics.csv``, ``rank/``) those of the
ε-ranks. :class:`ProbeOutput` writes the group's records to its CSV file (a file of another run
is kept aside, not overwritten), draws its measure sets' pictures on the figure schedule (the
first and the last probe of a run, and every ``figures_every_n_epochs``-th epoch when that is
positive; none when it is -1), the end-of-fit trajectory plot, and logs to every logger of the
Trainer under the group's prefix (:mod:`isoprobe.probing.publish`). It is handed what it
writes; it holds no probe.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.loggers import WandbLogger

from isoprobe.probing.measure_set import Drawn
from isoprobe.probing.plots import save_trajectories
from isoprobe.probing.publish import log_image, log_probe, records_table, scalar_metrics
from isoprobe.probing.records import keep_foreign_file, write_records
from isoprobe.probing.schedule import ProbeTime


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """An output group: its records' ``probe`` column, CSV file, trajectory plot, log prefix."""

    probe: str
    csv_name: str
    trajectory_png: str
    log_prefix: str

    def named(self, name: str) -> OutputSpec:
        """The group of a probe callback called ``name`` other than the default: every name
        starts with ``<name>_``, so two probe callbacks of one run write apart."""
        return OutputSpec(
            f"{name}_{self.probe}",
            f"{name}_{self.csv_name}",
            f"{name}_{self.trajectory_png}",
            f"{name}_{self.log_prefix}",
        )


#: the output groups a measure set's ``output`` names
OUTPUTS = {
    "isotropy": OutputSpec("isotropy", "probe_metrics.csv", "probe_trajectories.png", "probe"),
    "rank": OutputSpec("rank", "rank_metrics.csv", "rank_trajectories.png", "rank"),
}


class ProbeOutput:
    """The files and logger output of one output group in ``directory``.

    Args:
        spec: the group's names.
        directory: where its CSV file and pictures go.
        log_tables: a W&B table of each probe's rows.
        figures_every_n_epochs: the figure schedule (module docstring).
    """

    def __init__(
        self, spec: OutputSpec, directory: Path, log_tables: bool, figures_every_n_epochs: int
    ) -> None:
        self.spec = spec
        self.directory = directory
        self.log_tables = log_tables
        self.figures_every_n_epochs = figures_every_n_epochs
        self._csv_checked = False
        self._wandb_defined: set[int] = set()
        self._drawn_any = False
        self._undrawn: tuple[ProbeTime, list[Drawn]] | None = None

    @property
    def csv_path(self) -> Path:
        return self.directory / self.spec.csv_name

    def write_csv(self, trainer: Trainer, records: list[dict[str, Any]]) -> None:
        """Write every record so far to the group's CSV file."""
        if not trainer.is_global_zero:
            return
        if not self._csv_checked:
            keep_foreign_file(self.csv_path, records)
            self._csv_checked = True
        write_records(self.csv_path, records)

    def publish(
        self,
        trainer: Trainer,
        when: ProbeTime,
        records: list[dict[str, Any]],
        drawn: list[Drawn],
        all_records: list[dict[str, Any]],
        seconds: float,
    ) -> None:
        """One probe (its ``records`` among ``all_records``, which took ``seconds``; ``drawn``:
        its measure sets' artefacts): the CSV, the pictures when the schedule draws them, the
        loggers."""
        prefix = self.spec.log_prefix
        self.write_csv(trainer, all_records)
        every = self.figures_every_n_epochs
        if every >= 0 and (not self._drawn_any or (every > 0 and when.epoch % every == 0)):
            self._draw(when, drawn)
        elif every >= 0:
            self._undrawn = (when, drawn)
        metrics = scalar_metrics(prefix, when, records, seconds)
        media = None
        if any(isinstance(logger, WandbLogger) for logger in trainer.loggers):
            media = {}
            if every >= 0:
                for d in drawn:
                    media.update(d.measures.wandb_media(prefix, self.directory, when, d.artefacts))
            if self.log_tables:
                media[f"{prefix}/table"] = records_table(when.epoch, records)
        log_probe(trainer.loggers, when, prefix, metrics, media, self._wandb_defined)

    def finish(self, trainer: Trainer, all_records: list[dict[str, Any]]) -> None:
        """At the end of fit: the last probe's pictures if the schedule left them undrawn, and
        the trajectory plot of every metric against epoch."""
        if not trainer.is_global_zero:
            return
        if self._undrawn is not None:
            when, drawn = self._undrawn
            self._draw(when, drawn)
            for d in drawn:
                paths = d.measures.figure_paths(self.spec.log_prefix, self.directory, when)
                for key, path in paths.items():
                    if path.is_file():
                        log_image(trainer.loggers, key, path)
        if all_records:
            path = self.directory / self.spec.trajectory_png
            if save_trajectories(path, all_records):
                log_image(trainer.loggers, f"{self.spec.log_prefix}/trajectories", path)

    def _draw(self, when: ProbeTime, drawn: list[Drawn]) -> None:
        for d in drawn:
            d.measures.save_artefacts(self.directory, when, d.artefacts)
        self._drawn_any = True
        self._undrawn = None
