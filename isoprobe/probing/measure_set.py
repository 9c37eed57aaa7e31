"""What the probe hands a measure set at one probe time (:class:`ProbeInputs`), and what a
measure set is (:class:`MeasureSet`): it measures those inputs into rows and draws its
pictures. A measure set never sees the probe callback, its records or its output."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from lightning.pytorch import LightningModule
from torch import Tensor, nn
from torch.utils.data import Dataset

from isoprobe.probing.measurement import Measurement
from isoprobe.probing.schedule import ProbeTime


@dataclass
class ProbeInputs:
    """One probe time, as every measure set reads it.

    Attributes:
        when: the probe's epoch and step.
        tokens: layer -> [N, D] subsampled tokens of the probe set (probe-set order, the same
            rows at every probe and on every rank); empty when no set reads tokens.
        window_means: layer -> [windows, D] each probe window's mean real token; empty unless a
            set pools windows.
        model: the module probed (its weights, for a set that reads them).
        dataset: the validation windows the probe set is drawn from.
        windows: the probe set's indices into ``dataset``.
        progress: whether a set may show a progress bar (global rank zero, a bar shown).
    """

    when: ProbeTime
    tokens: dict[str, Tensor]
    window_means: dict[str, Tensor]
    model: LightningModule
    dataset: Dataset
    windows: Sequence[int]
    progress: bool = False


class MeasureSet:
    """A group of measures the probe runs at each probe time.

    A subclass sets :attr:`output` (the output group its rows go to: a CSV file and a log
    prefix, :data:`isoprobe.probing.probe_output.OUTPUTS`) and implements :meth:`measure`; it
    may draw pictures (:meth:`save_artefacts`, :meth:`figure_paths`, :meth:`wandb_media`),
    write files of its own each probe (:meth:`write_files`) and keep state in the checkpoint.
    """

    #: the output group of its rows
    output: ClassVar[str] = "isotropy"
    #: whether :meth:`measure` reads the collected tokens
    reads_tokens: ClassVar[bool] = True
    #: whether :meth:`measure` reads each probe window's mean real token per layer
    pools_windows: ClassVar[bool] = False

    def check_layers(self, layers: dict[str, nn.Module]) -> None:
        """Refuse a setting that names layers outside ``layers`` (the probed ones), at setup."""

    def measure(self, inputs: ProbeInputs) -> Measurement:
        raise NotImplementedError

    def save_artefacts(self, directory: Path, when: ProbeTime, artefacts: Any) -> None:
        """Write the pictures of one probe under ``directory`` (global rank zero)."""

    def figure_paths(self, prefix: str, directory: Path, when: ProbeTime) -> dict[str, Path]:
        """The pictures of one probe that go to W&B as images (key -> PNG), once drawn."""
        return {}

    def wandb_media(
        self, prefix: str, directory: Path, when: ProbeTime, artefacts: Any
    ) -> dict[str, Any]:
        """W&B media of one probe, logged in the same history row as its values."""
        return {}

    def write_files(self, directory: Path) -> None:
        """Files the set rewrites after each probe (global rank zero)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` of a resumed run."""


@dataclass
class Drawn:
    """One measure set's artefacts of one probe, with the set that draws them."""

    measures: MeasureSet
    artefacts: Any
