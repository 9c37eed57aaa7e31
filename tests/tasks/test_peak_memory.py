"""The CPU peak-memory measure: the most resident memory a piece of work holds at once.

The measurements run in a fresh interpreter. The measure reads the process's resident set, and
what that set does depends on the heap the process already has: in a process that ran other
tests, glibc may serve an allocation from a free chunk of an earlier, fragmented heap rather than
from the pages a block just freed, so two blocks one after the other can both stay resident. A
new process has no such history, so the numbers below are the work's own.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from isoprobe.tasks.peak_memory import cpu_peak_supported

pytestmark = pytest.mark.skipif(
    not cpu_peak_supported(), reason="needs Linux's /proc/self/clear_refs"
)
MIB = 2**20
MEASUREMENTS = """
import json
import torch
from isoprobe.tasks.peak_memory import cpu_peak_bytes

MIB = 2**20


def one_then_another():
    for _ in range(2):
        block = torch.ones(128 * MIB // 4)
        del block


peaks = {"one block": cpu_peak_bytes(lambda: torch.ones(256 * MIB // 4))}
peaks["one then another"] = cpu_peak_bytes(one_then_another)
kept = torch.ones(256 * MIB // 4)
peaks["resident before"] = cpu_peak_bytes(lambda: kept.sum())
print(json.dumps(peaks))
"""


@pytest.fixture(scope="module")
def peaks() -> dict[str, int]:
    """Each measurement's peak in bytes, taken one after the other in a new interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", MEASUREMENTS], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_peak_is_the_memory_the_work_touched(peaks):
    assert 250 * MIB <= peaks["one block"] <= 280 * MIB  # 256 MiB of float32


def test_two_allocations_one_after_the_other_peak_at_one_not_their_sum(peaks):
    assert 125 * MIB <= peaks["one then another"] <= 150 * MIB


def test_memory_resident_before_the_work_is_not_counted(peaks):
    assert peaks["resident before"] <= 16 * MIB
