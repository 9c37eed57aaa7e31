"""The probe set: which validation windows, layers and tokens the probe's collection pass reads
(:class:`ProbeSet`), and that pass (:func:`collect_tokens`, :mod:`isoprobe.probing.collect`)."""

from __future__ import annotations

from dataclasses import dataclass

from lightning.pytorch import LightningModule, Trainer
from torch import Tensor, nn
from torch.utils.data import Dataset

from isoprobe.models.base import check_probe_site
from isoprobe.probing.collect import (
    PROBE_PRECISIONS,
    WINDOW_SELECTIONS,
    ProbePlan,
    gather_subsampled_tokens,
    gather_window_means,
    probe_window_indices,
    run_probe_forward,
)

TOKEN_CHOICES = ("real", "all")


@dataclass
class ProbeSet:
    """What the collection pass reads (the probe callback's settings of the same names).

    Attributes:
        num_windows: size of the fixed probe set of validation windows.
        window_selection: ``first`` windows of ``datamodule.val_dataset`` | ``random`` (seeded).
        max_tokens: tokens per layer, subsampled with a fixed seed.
        layers: layer names to probe; None = every layer of the model's ``probe_layers(site)``.
        batch_size: probe windows per forward pass.
        seed: seed of the random window choice and the token subsample.
        site: ``block`` (every block's output) | ``attention`` (every self-attention sub-layer's
            output before the residual add).
        tokens: ``real`` (the model's ``token_masks``) | ``all`` (every position).
        precision: ``float32`` (autocast off) | ``trainer`` (the trainer's precision).
    """

    num_windows: int = 32
    window_selection: str = "first"
    max_tokens: int = 2000
    layers: list[str] | None = None
    batch_size: int = 16
    seed: int = 0
    site: str = "block"
    tokens: str = "real"
    precision: str = "float32"

    def __post_init__(self) -> None:
        if self.num_windows < 1:
            raise ValueError(f"num_windows must be >= 1, got {self.num_windows}")
        if self.max_tokens < 2:
            raise ValueError(
                f"max_tokens must be >= 2 (metrics need two tokens), got {self.max_tokens}"
            )
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.layers is not None and len(self.layers) == 0:
            raise ValueError(
                "layers=[] probes nothing; give layer names, null for every layer, or leave "
                "the probe out of the callbacks"
            )
        check_probe_site(self.site)
        if self.tokens not in TOKEN_CHOICES:
            raise ValueError(f"tokens must be one of {TOKEN_CHOICES}, got {self.tokens!r}")
        if self.precision not in PROBE_PRECISIONS:
            raise ValueError(
                f"precision must be one of {PROBE_PRECISIONS} (float32: the probe's forward in "
                f"float32 whatever trainer.precision), got {self.precision!r}"
            )
        if self.window_selection not in WINDOW_SELECTIONS:
            raise ValueError(
                f"window_selection must be one of {WINDOW_SELECTIONS}, "
                f"got {self.window_selection!r}"
            )
        self.layers = None if self.layers is None else list(self.layers)

    def layers_of(self, pl_module: LightningModule) -> dict[str, nn.Module]:
        """Layer name -> module of the probed layers (``layers``, or all)."""
        if not hasattr(pl_module, "probe_layers"):
            raise TypeError(
                f"the probe needs a model with probe_layers(), probe_forward() and "
                f"token_masks() (an isoprobe ForecastModule); {type(pl_module).__name__} has not"
            )
        available = pl_module.probe_layers(self.site)
        if self.layers is None:
            return dict(available)
        unknown = [layer for layer in self.layers if layer not in available]
        if unknown:
            raise ValueError(
                f"the probe: unknown layer(s) {unknown}; this model's layers are "
                f"{list(available)}. Set callbacks.probe.layers to some of them (or null)."
            )
        return {layer: available[layer] for layer in self.layers}

    def choose_windows(self, dataset: Dataset) -> list[int]:
        """The probe set's indices into ``dataset`` (chosen once per run)."""
        return probe_window_indices(
            len(dataset), self.num_windows, self.window_selection, self.seed
        )


def val_dataset(trainer: Trainer) -> Dataset:
    """The validation windows the probe set is drawn from."""
    dataset = getattr(trainer.datamodule, "val_dataset", None)
    if dataset is None:
        raise RuntimeError(
            "the probe needs the validation windows as trainer.datamodule.val_dataset; pass a "
            "LightningDataModule with a val_dataset to fit()/validate()"
        )
    return dataset


def collect_tokens(
    trainer: Trainer,
    pl_module: LightningModule,
    probe_set: ProbeSet,
    windows: list[int],
    pooled: bool,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Layer -> [N, D] subsampled tokens of the probe set and, if ``pooled``, layer ->
    [windows, D] each window's mean real token: one forward pass per batch for every probed
    layer, identical on every rank (see :mod:`isoprobe.probing.collect`)."""
    layers = probe_set.layers_of(pl_module)
    plan = ProbePlan.build(len(windows), probe_set.batch_size, trainer.world_size)
    local = run_probe_forward(
        trainer,
        pl_module,
        val_dataset(trainer),
        tuple(windows),
        plan,
        layers,
        probe_set.tokens == "all",
        probe_set.precision,
        set(layers) if pooled else set(),
    )
    tokens = gather_subsampled_tokens(trainer, plan, local, probe_set.max_tokens, probe_set.seed)
    return tokens, gather_window_means(trainer, plan, local)
