"""An isotropy regulariser: the training loss plus λ·R, R a differentiable anisotropy penalty of
the real tokens of chosen layers in each training batch (the isotropy paper's future work).

Two penalties of a layer's real tokens X [n, D] (rows x_i; ``regularizer.penalty``):

- ``cos_inter`` (default): the mean cosine over pairs of distinct tokens, the paper's
  inter-token cosine similarity (METRICS' ``cos_inter``), 0 for an isotropic cloud and 1 when
  every token points one way. With u_i = x_i / ‖x_i‖,
  R = 1/(n(n-1)) Σ_{i≠j} ⟨u_i, u_j⟩ = (‖Σ_i u_i‖² − n) / (n(n−1)), which costs O(nD).
- ``covariance``: the squared Frobenius distance of the trace-normalised covariance from I/D,
  R = ‖C/tr C − I/D‖²_F = Σ λ_k² / (Σ λ_k)² − 1/D (C = X̃ᵀX̃/n of the centred tokens, λ_k
  its eigenvalues; the inverse participation ratio less its floor), 0 when the spread is the
  same in every direction. It sees the spread around the mean, which ``cos_inter`` (dominated
  by a shared mean direction) does not; it costs O(n min(n, D)²).

R is the mean over the chosen layers (``regularizer.layers``: ``last``, the last block of each
stack, or a list of ``probe_layers()`` names). A layer's tokens are those the probe measures: its
output in the training forward (at the first run of a module that runs several times, as
TimesFM's decoding steps) at the positions the model's ``training_token_masks`` marks real.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

PENALTIES = ("cos_inter", "covariance")


def cos_inter_penalty(x: Tensor) -> Tensor:
    """Mean cosine over pairs of distinct rows of ``x`` [n, D] (module docstring)."""
    n = x.shape[0]
    unit = x / x.norm(dim=1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
    total = unit.sum(dim=0)
    return (total @ total - n) / (n * (n - 1))


def covariance_penalty(x: Tensor) -> Tensor:
    """‖C/tr C − I/D‖²_F of the centred rows of ``x`` [n, D] (module docstring)."""
    centred = x - x.mean(dim=0, keepdim=True)
    gram = centred @ centred.T if x.shape[0] < x.shape[1] else centred.T @ centred
    trace = torch.diagonal(gram).sum().clamp_min(torch.finfo(x.dtype).tiny)
    return (gram * gram).sum() / trace**2 - 1.0 / x.shape[1]


class IsotropyRegularizer:
    """``weight`` · the mean ``penalty`` over ``layers`` (module docstring)."""

    def __init__(self, weight: float, penalty: str = "cos_inter", layers: Any = "last") -> None:
        if not (isinstance(weight, (int, float)) and weight >= 0):
            raise ValueError(f"regularizer.weight must be a number >= 0, got {weight!r}")
        if penalty not in PENALTIES:
            raise ValueError(f"regularizer.penalty must be one of {PENALTIES}, got {penalty!r}")
        if layers != "last" and not (isinstance(layers, list) and layers):
            raise ValueError(
                f"regularizer.layers must be 'last' or a list of layer names, got {layers!r}"
            )
        self.weight = float(weight)
        self.penalty = cos_inter_penalty if penalty == "cos_inter" else covariance_penalty
        self.layers = layers

    @classmethod
    def from_config(cls, settings: Mapping[str, Any] | None) -> IsotropyRegularizer | None:
        """The regulariser a ``regularizer`` config asks for; None for ``regularizer=none``."""
        if not settings or settings.get("name", "none") == "none":
            return None
        return cls(settings["weight"], settings.get("penalty", "cos_inter"), settings["layers"])

    def layer_names(self, model) -> list[str]:
        if self.layers != "last":
            model.identify_layers(self.layers, type(model).__name__)
            return list(self.layers)
        last: dict[str, str] = {}
        for layer in model.probe_layer_identities("block").values():
            if layer.is_block:
                last[layer.stack] = layer.name  # blocks come in order: the last one stays
        return list(last.values())

    @contextmanager
    def capture(self, model) -> Iterator[dict[str, Tensor]]:
        """Within the block, every chosen layer's output of the forward pass (its first run),
        with its graph."""
        captured: dict[str, Tensor] = {}
        modules = model.probe_layers("block")
        handles = []
        for name in self.layer_names(model):

            def hook(_module, _inputs, output, name=name) -> None:
                if name not in captured:
                    captured[name] = output[0] if isinstance(output, tuple) else output

            handles.append(modules[name].register_forward_hook(hook))
        try:
            yield captured
        finally:
            for handle in handles:
                handle.remove()

    def __call__(self, model, batch, captured: Mapping[str, Tensor]) -> Tensor:
        """The mean penalty over the captured layers' real tokens (those with at least 2)."""
        masks = model.training_token_masks(batch, list(captured))
        values = []
        for name, output in captured.items():
            tokens = output[masks[name].to(output.device)].float()
            if tokens.shape[0] >= 2:
                values.append(self.penalty(tokens))
        if not values:
            return next(iter(captured.values())).new_zeros(())
        return torch.stack(values).mean()
