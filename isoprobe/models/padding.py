"""A window padded to whole patches (tokens), as the patch-based models read it: missing steps
(NaN) before the context, so that its last step ends the last patch, and after the target."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F


def whole_patches(context: Tensor, patch: int, target: Tensor | None = None) -> Tensor:
    """[B, T]: ``context`` [B, L] left-padded (NaN) to a multiple of ``patch`` steps, then
    ``target`` [B, H] (if any) right-padded (NaN) to one."""
    series = F.pad(context, (-context.shape[1] % patch, 0), value=float("nan"))
    if target is None:
        return series
    tail = F.pad(target, (0, -target.shape[1] % patch), value=float("nan"))
    return torch.cat([series, tail], dim=1)
