"""Under DDP ``data.batch_size`` is the global batch: W processes each take batch_size / W
windows a step, and together they train on one process's batches (tests/probing/
test_isotropy_ddp.py checks the training itself)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from isoprobe.data import TimeSeriesDataModule
from isoprobe.data.datamodule import EpochSampler

GIVEN = "tests/given_series"
SERIES = [[float(i % 17) for i in range(200)], [float(i % 5) for i in range(150)]]


def loader_for(rank: int, processes: int, batch_size: int = 8, windows: int = 36):
    dm = TimeSeriesDataModule(
        GIVEN,
        dataset_kwargs={"series": SERIES},
        batch_size=batch_size,
        max_train_windows=windows,
        split=(0.8, 0.1, 0.1),
    )
    dm.setup("fit")
    dm.trainer = SimpleNamespace(global_rank=rank, world_size=processes, current_epoch=2)
    return dm.train_dataloader()


def batches(rank: int, processes: int, **kwargs) -> list[list[int]]:
    """Each batch as the list of its windows' first context value and target's last."""
    return [
        [(float(c[0]), float(t[-1])) for c, t in zip(b["context"], b["target"], strict=True)]
        for b in loader_for(rank, processes, **kwargs)
    ]


@pytest.mark.parametrize("windows", [36, 35])
@pytest.mark.parametrize("processes", [2, 4])
def test_the_processes_steps_cover_one_process_batches(processes, windows):
    one = batches(0, 1, windows=windows)
    shares = [batches(rank, processes, windows=windows) for rank in range(processes)]
    assert all(len(share) == len(shares[0]) for share in shares)  # the same number of steps
    # every global batch of 8 splits evenly; the epoch's last windows % W windows (all in the
    # last batch) are left out
    for step, batch in enumerate(one):
        taken = sorted(w for share in shares if step < len(share) for w in share[step])
        kept = len(batch) - len(batch) % processes
        assert taken == sorted(batch[:kept])
    assert sum(len(b) for share in shares for b in share) == windows - windows % processes


def test_the_ranks_take_every_w_th_window_of_the_order():
    sampler = EpochSampler(100, 30, seed=3, epoch=lambda: 1)
    order = list(sampler)
    shares = [list(EpochSampler(100, 30, 3, lambda: 1, rank, 4)) for rank in range(4)]
    assert [len(s) for s in shares] == [7] * 4  # 30 // 4, the last 2 left out
    for rank, share in enumerate(shares):
        assert share == order[rank:28:4]


def test_a_global_batch_that_does_not_split_evenly_is_refused():
    with pytest.raises(ValueError, match=r"data.batch_size=6 .* multiple of 4"):
        loader_for(0, 4, batch_size=6)
