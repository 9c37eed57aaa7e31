"""Collect every probed layer's real context tokens of a fixed probe set, identically on any
number of processes.

The probe set is split into the batches one process would run (consecutive windows,
``batch_size`` each) and those batches are dealt round-robin to the ranks, so every window is
computed in exactly the batch it would be in with one process: the hidden states are bitwise
the same whatever the world size. Each rank keeps only the masked-true rows; the ranks
all-gather per-window token counts (tiny), every rank works out from them which global tokens
the seeded subsample keeps, and only those rows are all-gathered and put back in probe order.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from lightning.pytorch import LightningModule, Trainer
from torch import Tensor, nn
from torch.utils.data import Dataset, default_collate

from isoprobe.probing.capture import capture_outputs, inference_mode_of, masked_rows

log = logging.getLogger(__name__)

WINDOW_SELECTIONS = ("first", "random")
#: the numerics of the probe's forward pass: ``float32`` whatever ``trainer.precision`` (autocast
#: off, weights kept in another dtype cast to float32 for the pass), or ``trainer``: the
#: trainer's validation precision (``bf16-mixed``: under autocast)
PROBE_PRECISIONS = ("float32", "trainer")


def probe_window_indices(size: int, num_windows: int, selection: str, seed: int) -> list[int]:
    """Dataset indices of the probe set: the first ``num_windows`` windows, or a seeded random
    subset of that size (in dataset order). All windows when the data set is smaller."""
    if selection not in WINDOW_SELECTIONS:
        raise ValueError(f"window_selection must be one of {WINDOW_SELECTIONS}, got {selection!r}")
    if num_windows < 1:
        raise ValueError(f"num_windows must be >= 1, got {num_windows}")
    if size == 0:
        raise ValueError(
            "the validation data set is empty: the isotropy probe needs validation windows "
            "(check the data split, or disable the probe with callbacks.probe=null)"
        )
    count = min(num_windows, size)
    if count < num_windows:
        log.warning(
            "the probe: the validation set has %d windows, fewer than num_windows=%d; "
            "probing all of them",
            size,
            num_windows,
        )
    if selection == "first":
        return list(range(count))
    chosen = torch.randperm(size, generator=torch.Generator().manual_seed(seed))[:count]
    return sorted(chosen.tolist())


@functools.lru_cache(maxsize=32)
def subsample_indices(num_rows: int, max_rows: int, seed: int) -> Tensor:
    """Sorted indices of at most ``max_rows`` of ``num_rows`` rows, a function of
    (num_rows, max_rows, seed) only: the same tokens every epoch while the masks are the same."""
    if num_rows <= max_rows:
        return torch.arange(num_rows)
    perm = torch.randperm(num_rows, generator=torch.Generator().manual_seed(seed))
    return perm[:max_rows].sort().values


@dataclass(frozen=True)
class ProbePlan:
    """Which probe-set positions each rank runs, batch by batch.

    ``batches[r]`` lists rank r's batches as tuples of positions into the probe set; every rank
    has the same number of batches (for equal collectives), and ``padding[r][j]`` marks a batch
    rank r runs only to learn the layers' widths and dtypes (its tokens are dropped).
    """

    num_positions: int
    batches: tuple[tuple[tuple[int, ...], ...], ...]
    padding: tuple[tuple[bool, ...], ...]

    @classmethod
    def build(cls, num_positions: int, batch_size: int, world_size: int) -> ProbePlan:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        chunks = [
            tuple(range(start, min(start + batch_size, num_positions)))
            for start in range(0, num_positions, batch_size)
        ]
        per_rank = math.ceil(len(chunks) / world_size)
        batches, padding = [], []
        for rank in range(world_size):
            own = chunks[rank::world_size]
            pad = per_rank - len(own)
            batches.append(tuple(own) + (chunks[0],) * pad)
            padding.append((False,) * len(own) + (True,) * pad)
        return cls(num_positions, tuple(batches), tuple(padding))

    def positions(self, rank: int) -> list[int]:
        """Rank's real probe-set positions in the order its tokens are stored."""
        return [
            p
            for batch, pad in zip(self.batches[rank], self.padding[rank], strict=True)
            if not pad
            for p in batch
        ]


@dataclass
class LocalTokens:
    """One rank's masked rows of one layer, windows in ``ProbePlan.positions`` order."""

    rows: Tensor  # [n_local, D]
    counts: list[int]  # masked-true tokens per window
    window_means: Tensor | None = None  # [local windows, D] mean masked row (NaN: none)


@contextlib.contextmanager
def _float32_forward(module: nn.Module, device_type: str) -> Iterator[None]:
    """Autocast off and every floating weight and buffer of ``module`` in float32 (those a
    ``*-true`` precision keeps in bfloat16 or float16 are cast for the block and back after it,
    exactly: float32 holds each of their values), so the forward computes in float32."""
    cast = [
        (tensor, tensor.dtype)
        for tensor in (*module.parameters(), *module.buffers())
        if tensor.is_floating_point() and tensor.dtype in (torch.bfloat16, torch.float16)
    ]
    for tensor, _ in cast:
        tensor.data = tensor.data.float()
    try:
        with torch.autocast(device_type=device_type, enabled=False):
            yield
    finally:
        for tensor, dtype in cast:
            tensor.data = tensor.data.to(dtype)


def _precision_context(
    trainer: Trainer, module: nn.Module, precision: str
) -> contextlib.AbstractContextManager:
    """Where the probe's forward runs: in float32 or under the trainer's validation precision
    (:data:`PROBE_PRECISIONS`)."""
    if precision == "trainer":
        return trainer.precision_plugin.val_step_context()
    return _float32_forward(module, trainer.strategy.root_device.type)


def _window_means(hidden: Tensor, mask: Tensor) -> Tensor:
    """[B, D]: each window's mean over its masked-true positions (NaN where it has none)."""
    flat = hidden.flatten(1, -2)
    weights = mask.flatten(1).to(flat.dtype)
    return (flat * weights[..., None]).sum(dim=1) / weights.sum(dim=1, keepdim=True)


def _layer_mask(name: str, outputs: list[Tensor], masks: dict[str, Tensor]) -> Tensor:
    hidden = outputs[0]
    mask = masks.get(name)
    if mask is None:
        return torch.ones(hidden.shape[:-1], dtype=torch.bool, device=hidden.device)
    return mask.to(device=hidden.device, dtype=torch.bool)


def run_probe_forward(
    trainer: Trainer,
    pl_module: LightningModule,
    dataset: Dataset,
    windows: Sequence[int],
    plan: ProbePlan,
    layers: dict[str, nn.Module],
    all_tokens: bool = False,
    precision: str = "float32",
    pooled_layers: set[str] | frozenset[str] = frozenset(),
) -> dict[str, LocalTokens]:
    """This rank's share of the probe set through the model: masked rows per layer (every
    position of the layer's output if ``all_tokens``, else the model's ``token_masks``, asked
    once per batch for every layer) and, for ``pooled_layers``, each window's mean masked row.

    One forward pass per batch captures every layer (forward hooks), in eval mode, without
    gradients, in float32 or under the trainer's validation precision (``precision``, one of
    :data:`PROBE_PRECISIONS`; with ``trainer`` the batch is converted as the trainer converts a
    step's input).
    """
    if precision not in PROBE_PRECISIONS:
        raise ValueError(f"precision must be one of {PROBE_PRECISIONS}, got {precision!r}")
    rank = trainer.global_rank
    rows: dict[str, list[Tensor]] = {name: [] for name in layers}
    counts: dict[str, list[int]] = {name: [] for name in layers}
    means: dict[str, list[Tensor]] = {name: [] for name in pooled_layers}
    with inference_mode_of(pl_module), capture_outputs(layers) as captured:
        for batch_positions, is_padding in zip(plan.batches[rank], plan.padding[rank], strict=True):
            items = [dataset[windows[p]] for p in batch_positions]
            batch = trainer.strategy.batch_to_device(default_collate(items))
            if precision == "trainer":
                batch = trainer.precision_plugin.convert_input(batch)
            for outputs in captured.values():
                outputs.clear()
            with _precision_context(trainer, pl_module, precision):
                pl_module.probe_forward(batch)
            masks = {} if all_tokens else pl_module.token_masks(batch, list(layers))
            for name in layers:
                kept, per_window = masked_rows(name, captured[name], masks.get(name))
                rows[name].append(kept[:0] if is_padding else kept)
                if not is_padding:
                    counts[name] += per_window
                if name in means and not is_padding:
                    mask = _layer_mask(name, captured[name], masks)
                    means[name].append(_window_means(captured[name][0], mask))
    return {
        name: LocalTokens(
            torch.cat(rows[name]),
            counts[name],
            _cat_or_empty(means[name], rows[name][0]) if name in means else None,
        )
        for name in layers
    }


def _cat_or_empty(parts: list[Tensor], like: Tensor) -> Tensor:
    return torch.cat(parts) if parts else like.new_zeros((0, like.shape[-1]))


def _all_gather(trainer: Trainer, tensor: Tensor) -> Tensor:
    """[world, *shape] on every rank (a leading axis of 1 without a process group)."""
    if trainer.world_size == 1:
        return tensor.unsqueeze(0)
    return trainer.strategy.all_gather(tensor)


def gather_subsampled_tokens(
    trainer: Trainer,
    plan: ProbePlan,
    local: dict[str, LocalTokens],
    max_tokens: int,
    seed: int,
) -> dict[str, Tensor]:
    """Layer -> [N, D] rows: every window's masked tokens in probe-set order (window, then
    position), subsampled by :func:`subsample_indices`; the same tensor on every rank and for
    any world size. Only the kept rows travel between ranks."""
    world, rank = trainer.world_size, trainer.global_rank
    names = list(local)
    rank_positions = [plan.positions(r) for r in range(world)]
    width = max(1, max(len(p) for p in rank_positions))
    device = next(iter(local.values())).rows.device
    own_counts = torch.zeros(len(names), width, dtype=torch.long, device=device)
    for i, name in enumerate(names):
        counts = local[name].counts
        own_counts[i, : len(counts)] = torch.tensor(counts, dtype=torch.long)
    all_counts = _all_gather(trainer, own_counts).cpu()  # [world, layers, width]

    owner = torch.empty(plan.num_positions, dtype=torch.long)
    for r, positions in enumerate(rank_positions):
        owner[positions] = r
    tokens: dict[str, Tensor] = {}
    for i, name in enumerate(names):
        count = torch.zeros(plan.num_positions, dtype=torch.long)
        local_start = torch.zeros(plan.num_positions, dtype=torch.long)
        for r, positions in enumerate(rank_positions):
            c = all_counts[r, i, : len(positions)]
            count[positions] = c
            local_start[positions] = c.cumsum(0) - c
        global_start = count.cumsum(0) - count
        keep = subsample_indices(int(count.sum()), max_tokens, seed)
        window = torch.searchsorted(global_start + count, keep, right=True)
        keep_rank = owner[window]
        keep_local = local_start[window] + keep - global_start[window]
        per_rank = torch.bincount(keep_rank, minlength=world)
        slot = torch.empty_like(keep)
        for r in range(world):
            slot[keep_rank == r] = torch.arange(int(per_rank[r]))
        rows = local[name].rows
        mine = rows[keep_local[keep_rank == rank].to(rows.device)]
        padded = rows.new_zeros((int(per_rank.max()), rows.shape[1]))
        padded[: mine.shape[0]] = mine
        gathered = _all_gather(trainer, padded)
        tokens[name] = gathered[keep_rank.to(rows.device), slot.to(rows.device)]
    return tokens


def gather_window_means(
    trainer: Trainer, plan: ProbePlan, local: dict[str, LocalTokens]
) -> dict[str, Tensor]:
    """Layer -> [windows, D]: each probe-set window's mean masked row, in probe-set order, the
    same on every rank, for the layers collected with their window means."""
    world = trainer.world_size
    rank_positions = [plan.positions(r) for r in range(world)]
    width = max(len(p) for p in rank_positions)
    order = torch.full((plan.num_positions,), -1, dtype=torch.long)
    for r, positions in enumerate(rank_positions):
        order[positions] = torch.arange(len(positions)) + r * width
    means: dict[str, Tensor] = {}
    for name, layer in local.items():
        if layer.window_means is None:
            continue
        mine = layer.window_means
        padded = mine.new_zeros((width, mine.shape[1]))
        padded[: mine.shape[0]] = mine
        gathered = _all_gather(trainer, padded).reshape(world * width, mine.shape[1])
        means[name] = gathered[order.to(gathered.device)]
    return means
