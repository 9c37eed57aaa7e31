"""The collection pass the probes of one Trainer share: :class:`SharedCollection`.

As torchmetrics' compute groups let metrics that would compute the same state share one, the
probes of a Trainer whose :class:`TokenRequest` is equal (the same windows, site, tokens, batch
size, token count and seed) share one forward pass at each probe time: it collects the union of
their layers, each probe takes its own layers' tokens, and the tokens are freed once every probe
of the group has read them. A layer's tokens depend on the request only, not on which other
layers are collected with it, so a probe reads what it would collect alone.

One :class:`SharedCollection` serves one Trainer and is held by each of its probes
(``probe.collection``): at setup a probe joins the collection another probe of the Trainer
already holds, else it starts one. A measure across layers (CKA between consecutive layers)
needs no probe of its own: it is a registered measure of the isotropy probe that reads
``Tokens.previous`` (:mod:`isoprobe.metrics.registry`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from isoprobe.callbacks.collect import ProbePlan, gather_subsampled_tokens, run_probe_forward
from lightning.pytorch import LightningModule, Trainer
from torch import Tensor, nn
from torch.utils.data import Dataset

if TYPE_CHECKING:
    from isoprobe.callbacks.probe import Probe

#: what a probe takes from the probe it follows: its probe set (so both read one pass) and its
#: schedule (so they probe at the same times)
FOLLOWED = (
    "every_n_epochs",
    "num_windows",
    "window_selection",
    "max_tokens",
    "site",
    "tokens",
    "layers",
    "batch_size",
    "figures_every_n_epochs",
    "precision",
)


def followed_settings(
    probe: Probe, probes: Iterable[Probe], defaults: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The :data:`FOLLOWED` settings of the probe ``probe`` follows (``probe.follow``) when that
    one is among ``probes``; None when it is not (``probe`` keeps its own). A setting given to
    ``probe`` other than its default (``defaults``) and than the followed probe's is refused,
    since following would ignore it."""
    leader = next((p for p in probes if probe.follow and p.name == probe.follow), None)
    if leader is None:
        return None
    settings = {key: getattr(leader, key) for key in FOLLOWED}
    given = {
        key: value
        for key, value in probe.own_settings.items()
        if value != defaults[key] and value != settings[key]
    }
    if given:
        raise ValueError(
            f"{type(probe).__name__} {probe.name!r} follows probe {leader.name!r}, whose probe "
            f"set and schedule it takes, but was given {given}: set them on {leader.name!r}, or "
            "follow=null for a probe set of its own"
        )
    return settings


@dataclass(frozen=True)
class TokenRequest:
    """What a collection pass depends on besides the layers: probes with equal requests share
    one pass."""

    site: str
    tokens: str
    windows: tuple[int, ...]
    batch_size: int
    max_tokens: int
    seed: int
    precision: str = "float32"


@dataclass
class _Pass:
    key: tuple[Any, ...]
    tokens: dict[str, Tensor]
    waiting: set[str] = field(default_factory=set)


class SharedCollection:
    """The latest collection pass of one Trainer, kept until every probe that shares it has
    read it (see the module docstring)."""

    def __init__(self, trainer: Trainer) -> None:
        self._trainer = weakref.ref(trainer)
        self._pass: _Pass | None = None

    @classmethod
    def join(cls, trainer: Trainer, probes: Iterable[Probe]) -> SharedCollection:
        """The collection of ``trainer`` that one of ``probes`` (its probes) holds, else a new
        one."""
        for probe in probes:
            if probe.collection is not None and probe.collection.serves(trainer):
                return probe.collection
        return cls(trainer)

    def serves(self, trainer: Trainer) -> bool:
        return self._trainer() is trainer

    def tokens(
        self, probe: Probe, trainer: Trainer, pl_module: LightningModule, when: tuple[int, int]
    ) -> dict[str, Tensor]:
        """``probe``'s layers' tokens at ``when`` (epoch, step), from the pass it shares with
        every probe of this collection that makes the same request (run by whichever asks
        first)."""
        request = probe.token_request(trainer)
        key = (request, trainer.state.fn, when)
        if self._pass is None or self._pass.key != key:
            peers = [
                member
                for member in trainer.callbacks
                if getattr(member, "collection", None) is self
                and member.reads_tokens
                and member.token_request(trainer) == request
            ]
            layers: dict[str, nn.Module] = {}
            for member in peers:
                layers.update(member.probed_layers(pl_module))
            collected = collect_tokens(trainer, pl_module, request, layers)
            self._pass = _Pass(key, collected, {member.name for member in peers})
        shared = self._pass
        shared.waiting.discard(probe.name)
        mine = {layer: shared.tokens[layer] for layer in probe.probed_layers(pl_module)}
        if not shared.waiting:
            self._pass = None
        return mine

    def clear(self) -> None:
        """Free a pass that some probe has not read (the fit ended)."""
        self._pass = None


def val_dataset(trainer: Trainer) -> Dataset:
    """The validation windows the probe set is drawn from."""
    dataset = getattr(trainer.datamodule, "val_dataset", None)
    if dataset is None:
        raise RuntimeError(
            "the probes need the validation windows as trainer.datamodule.val_dataset; pass a "
            "LightningDataModule with a val_dataset to fit()/validate()"
        )
    return dataset


def collect_tokens(
    trainer: Trainer,
    pl_module: LightningModule,
    request: TokenRequest,
    layers: dict[str, nn.Module],
) -> dict[str, Tensor]:
    """Layer -> [N, D] subsampled tokens of the probe set: one forward pass per batch for all
    ``layers``, identical on every rank (see :mod:`isoprobe.callbacks.collect`)."""
    plan = ProbePlan.build(len(request.windows), request.batch_size, trainer.world_size)
    local = run_probe_forward(
        trainer,
        pl_module,
        val_dataset(trainer),
        request.windows,
        plan,
        layers,
        request.tokens == "all",
        request.precision,
    )
    return gather_subsampled_tokens(trainer, plan, local, request.max_tokens, request.seed)
