"""Capture what chosen layers output during one forward pass, and keep a layer's real tokens:
what the probe's collection pass (:mod:`isoprobe.probing.collect`) and the embedders of
:mod:`isoprobe.spectra.embedders` share."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor, nn


def _first_tensor(output: object) -> Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output


@contextlib.contextmanager
def inference_mode_of(module: nn.Module) -> Iterator[None]:
    """Eval mode and no grad, restoring every submodule's own train/eval flag afterwards."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, training in modes:
            m.training = training


@contextlib.contextmanager
def capture_outputs(layers: dict[str, nn.Module]) -> Iterator[dict[str, list[Tensor]]]:
    captured: dict[str, list[Tensor]] = {name: [] for name in layers}

    def hook_for(name: str):
        def hook(_module: nn.Module, _args: object, output: object) -> None:
            captured[name].append(_first_tensor(output).detach())

        return hook

    handles = [module.register_forward_hook(hook_for(name)) for name, module in layers.items()]
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def masked_rows(name: str, outputs: list[Tensor], mask: Tensor | None) -> tuple[Tensor, list[int]]:
    if len(outputs) != 1:
        raise RuntimeError(
            f"the probe callback: layer {name!r} ran {len(outputs)} times in one probe_forward; "
            "probe_forward must run each probed module exactly once (no generation loops)"
        )
    hidden = outputs[0]
    if not isinstance(hidden, Tensor) or hidden.dim() < 3:
        shape = tuple(hidden.shape) if isinstance(hidden, Tensor) else type(hidden).__name__
        raise RuntimeError(
            f"the probe callback: layer {name!r} must output [B, ..., D] (or a tuple starting with "
            f"it), got {shape}; point probe_layers() at the module whose output is the "
            "representation"
        )
    if mask is None:
        mask = torch.ones(hidden.shape[:-1], dtype=torch.bool, device=hidden.device)
    if tuple(mask.shape) != tuple(hidden.shape[:-1]):
        raise RuntimeError(
            f"the probe callback: token_masks(batch, ...)[{name!r}] has shape {tuple(mask.shape)} "
            f"but the layer's output is {tuple(hidden.shape)}; the mask must be its shape "
            "without the width"
        )
    mask = mask.to(device=hidden.device, dtype=torch.bool)
    return hidden[mask], mask.flatten(1).sum(dim=1).tolist()
