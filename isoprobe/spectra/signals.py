"""The diverse signals whose patches the time-series models embed (rank-structure paper §2:
"thousands of patches from diverse signals (e.g., sinusoids, exponential functions, and white
noise)"). The paper names the families, not their parameters; these are drawn here:

- ``sinusoid``: ``a sin(2π t / p + φ) + c``, period ``p`` uniform in [4, 128] steps, phase
  uniform in [0, 2π), amplitude ``a`` log-uniform in [0.1, 10], offset ``c`` normal(0, 1);
- ``exponential``: ``a exp(r t / T) + c`` over the series' ``T`` steps, rate ``r`` uniform in
  [-5, 5] (decay and growth), ``a`` log-uniform in [0.1, 10] with a random sign, ``c`` normal(0, 1);
- ``white_noise``: i.i.d. normal(``c``, ``s``²), ``s`` log-uniform in [0.1, 10], ``c`` normal(0, 1).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

FAMILIES = ("sinusoid", "exponential", "white_noise")


def _log_uniform(generator: torch.Generator, n: int, low: float, high: float) -> Tensor:
    u = torch.rand(n, 1, generator=generator, dtype=torch.float64)
    return torch.exp(math.log(low) + u * (math.log(high) - math.log(low)))


def _uniform(generator: torch.Generator, n: int, low: float, high: float) -> Tensor:
    return low + (high - low) * torch.rand(n, 1, generator=generator, dtype=torch.float64)


def _normal(generator: torch.Generator, n: int, columns: int = 1) -> Tensor:
    return torch.randn(n, columns, generator=generator, dtype=torch.float64)


def family_series(family: str, count: int, length: int, generator: torch.Generator) -> Tensor:
    """``count`` series [count, length] of one of :data:`FAMILIES` (float32)."""
    t = torch.arange(length, dtype=torch.float64).unsqueeze(0)
    if family == "sinusoid":
        period = _uniform(generator, count, 4.0, 128.0)
        phase = _uniform(generator, count, 0.0, 2 * math.pi)
        amplitude = _log_uniform(generator, count, 0.1, 10.0)
        values = amplitude * torch.sin(2 * math.pi * t / period + phase)
        return (values + _normal(generator, count)).float()
    if family == "exponential":
        rate = _uniform(generator, count, -5.0, 5.0)
        sign = torch.where(torch.rand(count, 1, generator=generator) < 0.5, -1.0, 1.0)
        amplitude = sign.double() * _log_uniform(generator, count, 0.1, 10.0)
        values = amplitude * torch.exp(rate * t / length)
        return (values + _normal(generator, count)).float()
    if family == "white_noise":
        spread = _log_uniform(generator, count, 0.1, 10.0)
        return (_normal(generator, count) + spread * _normal(generator, count, length)).float()
    raise ValueError(f"unknown signal family {family!r}; choose from {FAMILIES}")


def diverse_signals(
    per_family: int, length: int, seed: int, families: tuple[str, ...] = FAMILIES
) -> tuple[Tensor, list[str]]:
    """``per_family`` series of each family, stacked [len(families) * per_family, length], and
    each row's family name."""
    if per_family < 1 or length < 1:
        raise ValueError(f"per_family and length must be >= 1, got {per_family} and {length}")
    generator = torch.Generator().manual_seed(seed)
    series = [family_series(name, per_family, length, generator) for name in families]
    names = [name for name in families for _ in range(per_family)]
    return torch.cat(series), names
