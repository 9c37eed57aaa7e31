"""The probe tests run a toy model whose tensors are tiny: one torch thread is faster
than two, and keeps the suite fast when CI runs other work on the same two cores."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
