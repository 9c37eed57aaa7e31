"""The keys and values of the tokens a forecast's roll-out has run so far, per attention layer,
so that each later pass runs only the tokens appended since (a KV cache).

It is exact where nothing appended changes an earlier token: causal attention, and inputs whose
scaling of a token reads nothing after it (running statistics, a clamp fixed by the context).
The models that use it say why that holds for them (Toto, TimesFM 2.5).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class KeyValueCache:
    """Per attention layer (the module itself is the key): its keys and values [rows, ...,
    tokens, ...] so far; ``tokens``: how many tokens they hold, which a pass skips."""

    def __init__(self) -> None:
        self.entries: dict[nn.Module, tuple[Tensor, Tensor]] = {}
        self.tokens = 0

    def repeat(self, copies: int) -> None:
        """Every row's keys and values ``copies`` times, copy-major (as ``Tensor.repeat``)."""
        self.entries = {
            layer: (k.repeat(copies, *[1] * (k.dim() - 1)), v.repeat(copies, *[1] * (v.dim() - 1)))
            for layer, (k, v) in self.entries.items()
        }

    def extend(self, layer: nn.Module, k: Tensor, v: Tensor, dim: int) -> tuple[Tensor, Tensor]:
        """``layer``'s keys and values so far followed by ``k`` and ``v``, the new tokens'
        (joined along their token dimension ``dim``), which it holds from now on."""
        if self.tokens:
            cached_k, cached_v = self.entries[layer]
            k, v = torch.cat([cached_k, k], dim=dim), torch.cat([cached_v, v], dim=dim)
        self.entries[layer] = (k, v)
        return k, v
