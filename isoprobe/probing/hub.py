"""The probe hub: one per Trainer, it owns what the probes of that Trainer share.

- **Membership.** Every probe callback (a *measure set*: :class:`~isoprobe.probing.probe.Probe`)
  joins the hub of its Trainer at setup (:meth:`ProbeHub.of`); no probe looks for its peers in
  ``trainer.callbacks``. A probe with ``follow=<name>`` takes the probe set and schedule
  (:data:`FOLLOWED`) of the member of that name, whichever of the two joins first.
- **The schedule.** Whichever member's Lightning hook fires first at a probe time (before the
  first training step, after a training epoch or an optimizer step, after a validation-only
  run) asks the hub to :meth:`~ProbeHub.probe`, and the hub runs every member due then by its
  :class:`~isoprobe.probing.schedule.Schedule`; the others' hooks find that time done.
- **The collection pass.** Members whose :class:`TokenRequest` is equal (the same windows,
  site, tokens, batch size, token count, seed and precision) read ONE forward pass
  (:mod:`isoprobe.probing.collect`): the union of their layers, each member takes its own,
  and the pass is freed when they have measured. Members that pool windows (the readout, the
  saved window means) get each window's mean real token per layer from that same pass.

Data flows one way: the hub collects and hands each member its tokens; members only measure,
record and publish. This module imports no probe (members are :class:`Member` protocols), so
the callbacks have no import cycle.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from lightning.pytorch import LightningModule, Trainer
from torch import Tensor, nn
from torch.utils.data import Dataset

from isoprobe.probing.collect import (
    ProbePlan,
    gather_subsampled_tokens,
    gather_window_means,
    run_probe_forward,
)
from isoprobe.probing.schedule import Schedule

#: what asks the hub to probe: the start of training, the end of a training epoch, the end of an
#: optimizer step, a validation-only run
MOMENTS = ("start", "epoch", "step", "validate")

#: what a probe takes from the probe it follows: its probe set (so both read one pass) and its
#: schedule (so they probe at the same times)
FOLLOWED = (
    "every_n_epochs",
    "every_n_steps",
    "log_spaced_steps",
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


@dataclass(frozen=True)
class TokenRequest:
    """What a collection pass depends on besides the layers: members with equal requests share
    one pass."""

    site: str
    tokens: str
    windows: tuple[int, ...]
    batch_size: int
    max_tokens: int
    seed: int
    precision: str = "float32"


@dataclass
class Collected:
    """One pass, as a member reads it: its layers' subsampled tokens [N, D] (probe-set order,
    the same rows every epoch) and, where it pools windows, each window's mean real token per
    layer [windows, D] (probe-set order)."""

    tokens: dict[str, Tensor]
    pooled: dict[str, Tensor] | None = None


class Member(Protocol):
    """What the hub asks of a measure set (:class:`~isoprobe.probing.probe.Probe` is one)."""

    name: str
    follow: str | None
    own_settings: dict[str, Any]
    schedule: Schedule
    reads_tokens: bool
    pools_windows: bool

    def token_request(self, trainer: Trainer) -> TokenRequest: ...

    def probed_layers(self, pl_module: LightningModule) -> dict[str, nn.Module]: ...

    def has_probed(self, epoch: int, step: int) -> bool: ...

    def take(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        collected: Collected | None,
        epoch: int,
        step: int,
        pass_seconds: float,
    ) -> None: ...


_HUBS: weakref.WeakKeyDictionary[Trainer, ProbeHub] = weakref.WeakKeyDictionary()


class ProbeHub:
    """The members, schedule and collection pass of one Trainer (see the module docstring).

    Attributes:
        passes: how many collection passes the hub has run (one per probe time and request).
    """

    def __init__(self) -> None:
        self._members: list[Member] = []
        self._defaults: dict[int, Mapping[str, Any]] = {}
        self.passes = 0

    @classmethod
    def of(cls, trainer: Trainer) -> ProbeHub:
        """The hub of ``trainer`` (made by the first probe that asks)."""
        hub = _HUBS.get(trainer)
        if hub is None:
            hub = _HUBS[trainer] = cls()
        return hub

    @property
    def members(self) -> list[Member]:
        return list(self._members)

    def join(self, member: Member, defaults: Mapping[str, Any]) -> None:
        """Add ``member`` (once; ``defaults``: its :data:`FOLLOWED` settings' defaults) and
        apply ``follow`` between it and the members already here."""
        if all(other is not member for other in self._members):
            clash = [other for other in self._members if other.name == member.name]
            if clash:
                raise ValueError(
                    f"two probes named {member.name!r} in one Trainer: give each its own name "
                    "(its records' probe column and its checkpoint state)"
                )
            self._members.append(member)
            self._defaults[id(member)] = dict(defaults)
        for follower in self._members:
            leader = self._leader(follower)
            if leader is not None and (follower is member or leader is member):
                _apply(follower, leader, self._defaults[id(follower)])

    def _leader(self, member: Member) -> Member | None:
        return next((m for m in self._members if member.follow and m.name == member.follow), None)

    def probe(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        epoch: int,
        step: int,
        moment: str,
    ) -> None:
        """Probe every member due at ``epoch`` and ``step``: not yet probed then and, at the end
        of a training epoch or optimizer step (``moment``, one of :data:`MOMENTS`), due by its
        schedule. One pass per distinct request."""
        if trainer.fast_dev_run or trainer.sanity_checking:
            return
        due = [
            m
            for m in self._members
            if not m.has_probed(epoch, step) and _due(m.schedule, moment, epoch, step, trainer)
        ]
        groups: dict[TokenRequest | None, list[Member]] = {}
        for member in due:
            request = member.token_request(trainer) if member.reads_tokens else None
            groups.setdefault(request, []).append(member)
        for request, members in groups.items():
            started = time.perf_counter()
            passes = self._collect(trainer, pl_module, request, members)
            seconds = time.perf_counter() - started
            for member, collected in zip(members, passes, strict=True):
                member.take(trainer, pl_module, collected, epoch, step, seconds)
                seconds = 0.0  # the pass counts once, in the first member's time
            del passes

    def _collect(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        request: TokenRequest | None,
        members: Sequence[Member],
    ) -> list[Collected | None]:
        if request is None:
            return [None] * len(members)
        layers: dict[str, nn.Module] = {}
        pooled_layers: set[str] = set()
        for member in members:
            own = member.probed_layers(pl_module)
            layers.update(own)
            if member.pools_windows:
                pooled_layers.update(own)
        tokens, pooled = collect_tokens(trainer, pl_module, request, layers, pooled_layers)
        self.passes += 1
        taken = []
        for member in members:
            own = list(member.probed_layers(pl_module))
            mine = Collected({layer: tokens[layer] for layer in own})
            if member.pools_windows:
                mine.pooled = {layer: pooled[layer] for layer in own}
            taken.append(mine)
        return taken


def _due(schedule: Schedule, moment: str, epoch: int, step: int, trainer: Trainer) -> bool:
    if moment == "epoch":
        return schedule.after_epoch(epoch)
    if moment == "step":
        return schedule.after_step(step, trainer.estimated_stepping_batches)
    return True


def _apply(follower: Member, leader: Member, defaults: Mapping[str, Any]) -> None:
    """Give ``follower`` the :data:`FOLLOWED` settings of ``leader``; one it was given other
    than its default and than the leader's is refused, since following would ignore it."""
    settings = {key: getattr(leader, key) for key in FOLLOWED}
    given = {
        key: value
        for key, value in follower.own_settings.items()
        if value != defaults[key] and value != settings[key]
    }
    if given:
        raise ValueError(
            f"{type(follower).__name__} {follower.name!r} follows probe {leader.name!r}, whose "
            f"probe set and schedule it takes, but was given {given}: set them on "
            f"{leader.name!r}, or follow=null for a probe set of its own"
        )
    for key, value in settings.items():
        setattr(follower, key, list(value) if isinstance(value, list) else value)


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
    pooled_layers: set[str] | frozenset[str] = frozenset(),
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Layer -> [N, D] subsampled tokens of the probe set, and for ``pooled_layers`` layer ->
    [windows, D] each window's mean real token: one forward pass per batch for all ``layers``,
    identical on every rank (see :mod:`isoprobe.probing.collect`)."""
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
        pooled_layers,
    )
    tokens = gather_subsampled_tokens(trainer, plan, local, request.max_tokens, request.seed)
    return tokens, gather_window_means(trainer, plan, local)
