"""The CPU peak-memory measure: the most resident memory a piece of work holds at once."""

from __future__ import annotations

import pytest
import torch

from isoprobe.tasks.peak_memory import cpu_peak_bytes, cpu_peak_supported

pytestmark = pytest.mark.skipif(
    not cpu_peak_supported(), reason="needs Linux's /proc/self/clear_refs"
)
MIB = 2**20


def test_the_peak_is_the_memory_the_work_touched():
    held = cpu_peak_bytes(lambda: torch.ones(256 * MIB // 4))  # 256 MiB of float32
    assert 250 * MIB <= held <= 280 * MIB


def test_two_allocations_one_after_the_other_peak_at_one_not_their_sum():
    def one_then_another():
        for _ in range(2):
            block = torch.ones(128 * MIB // 4)
            del block

    assert 125 * MIB <= cpu_peak_bytes(one_then_another) <= 150 * MIB


def test_memory_resident_before_the_work_is_not_counted():
    kept = torch.ones(256 * MIB // 4)
    assert cpu_peak_bytes(lambda: kept.sum()) <= 16 * MIB
