"""Where one probe's results go: :class:`ProbeOutput` (global rank zero only).

Its records' CSV file (a file of another run is kept aside, not overwritten), its pictures on
the figure schedule (the first and the last probe of a run, and every
``figures_every_n_epochs``-th epoch when that is positive; none when it is -1), the end-of-fit
trajectory plot, and every logger of the Trainer under the probe's ``log_prefix``
(:mod:`isoprobe.probing.publish`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from lightning.pytorch import Trainer
from lightning.pytorch.loggers import WandbLogger

from isoprobe.probing.measurement import Measurement
from isoprobe.probing.plots import save_trajectories
from isoprobe.probing.publish import log_image, log_probe, records_table, scalar_metrics
from isoprobe.probing.records import keep_foreign_file, write_records
from isoprobe.probing.schedule import ProbeTime


class Published(Protocol):
    """What :class:`ProbeOutput` reads of its probe (:class:`~isoprobe.probing.probe.Probe`)."""

    log_prefix: str
    log_tables: bool
    figures_every_n_epochs: int
    trajectory_png: str

    @property
    def csv_path(self) -> Path: ...

    @property
    def output_path(self) -> Path: ...

    def save_artefacts(
        self, directory: Path, when: ProbeTime, measurement: Measurement
    ) -> None: ...

    def wandb_media(self, when: ProbeTime, measurement: Measurement) -> dict[str, Any]: ...

    def figure_paths(self, when: ProbeTime) -> dict[str, Path]: ...


class ProbeOutput:
    """The files and logger output of ``probe``, which it holds as ``probe.output``.

    Attributes:
        csv_checked: whether the CSV file in the probe's directory was checked for another
            run's records (until :meth:`new_directory`).
    """

    def __init__(self, probe: Published) -> None:
        self.probe = probe
        self.csv_checked = False
        self._wandb_defined: set[int] = set()
        self._drawn_any = False
        self._undrawn: tuple[ProbeTime, Measurement] | None = None

    def new_directory(self) -> None:
        """The probe was set up again, maybe in another directory: check its CSV file anew
        before the first write."""
        self.csv_checked = False

    def write_csv(self, trainer: Trainer, records: list[dict[str, Any]]) -> None:
        """Write every record so far to the probe's CSV file."""
        if not trainer.is_global_zero:
            return
        if not self.csv_checked:
            keep_foreign_file(self.probe.csv_path, records)
            self.csv_checked = True
        write_records(self.probe.csv_path, records)

    def publish(
        self,
        trainer: Trainer,
        when: ProbeTime,
        records: list[dict[str, Any]],
        measurement: Measurement,
        all_records: list[dict[str, Any]],
        seconds: float,
    ) -> None:
        """One probe (its ``records`` among ``all_records``, which took ``seconds``): the CSV,
        the pictures when the schedule draws them, the loggers."""
        probe = self.probe
        self.write_csv(trainer, all_records)
        every = probe.figures_every_n_epochs
        if every >= 0 and (not self._drawn_any or (every > 0 and when.epoch % every == 0)):
            self._draw(when, measurement)
        elif every >= 0:
            self._undrawn = (when, measurement)
        metrics = scalar_metrics(probe.log_prefix, when, records, seconds)
        media = None
        if any(isinstance(logger, WandbLogger) for logger in trainer.loggers):
            media = probe.wandb_media(when, measurement) if every >= 0 else {}
            if probe.log_tables:
                media[f"{probe.log_prefix}/table"] = records_table(when.epoch, records)
        log_probe(trainer.loggers, when, probe.log_prefix, metrics, media, self._wandb_defined)

    def finish(self, trainer: Trainer, all_records: list[dict[str, Any]]) -> None:
        """At the end of fit: the last probe's pictures if the schedule left them undrawn, and
        the trajectory plot of every metric against epoch."""
        probe = self.probe
        if trainer.is_global_zero and self._undrawn is not None:
            when, measurement = self._undrawn
            self._draw(when, measurement)
            for key, path in probe.figure_paths(when).items():
                if path.is_file():
                    log_image(trainer.loggers, key, path)
        if trainer.is_global_zero and all_records:
            path = probe.output_path / probe.trajectory_png
            if save_trajectories(path, all_records):
                log_image(trainer.loggers, f"{probe.log_prefix}/trajectories", path)

    def _draw(self, when: ProbeTime, measurement: Measurement) -> None:
        self.probe.save_artefacts(self.probe.output_path, when, measurement)
        self._drawn_any = True
        self._undrawn = None
