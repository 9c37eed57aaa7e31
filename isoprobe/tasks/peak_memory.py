"""Peak memory of a piece of work on the CPU, where torch keeps no allocator statistics: the
process's resident-set high-water mark (Linux's ``VmHWM``), reset to the current resident set
just before the work (``/proc/self/clear_refs``), less that resident set.

Freed heap memory is handed back to the system first (``malloc_trim``), so that the work cannot
reuse pages an earlier computation left resident and so hide its own peak. The reading is the
process's, not the tensors': in a long-lived process whose heap is fragmented, the allocator may
place a block in fresh pages while the pages of a block freed a moment ago stay resident, and the
reading then exceeds the most the work's tensors held at once. Measure in a fresh process (a run,
a bench) for the work's own figure.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
from collections.abc import Callable
from pathlib import Path

from torch import nn

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")
RESET_PEAK = "5"  # clear_refs: reset VmHWM to the current VmRSS (Linux >= 4.0)


def _status_bytes(field: str) -> int:
    for line in STATUS.read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024  # the kernel reports kB
    raise OSError(f"{STATUS} has no {field}")


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``; None on a C library without it."""
    name = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None


def _trim_heap() -> None:
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def weight_bytes(module: nn.Module) -> int:
    """The bytes of ``module``'s parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


def cpu_peak_supported() -> bool:
    """Whether this system lets a process reset and read its resident-set peak."""
    try:
        CLEAR_REFS.write_text(RESET_PEAK)
        _status_bytes("VmHWM")
    except OSError:
        return False
    return True


def cpu_peak_bytes(work: Callable[[], object]) -> int:
    """The most resident memory ``work()`` held at once above what was resident before it.
    Raises ``OSError`` where the system cannot report it (see :func:`cpu_peak_supported`)."""
    _trim_heap()
    before = _status_bytes("VmRSS")
    CLEAR_REFS.write_text(RESET_PEAK)
    work()
    return max(0, _status_bytes("VmHWM") - before)
