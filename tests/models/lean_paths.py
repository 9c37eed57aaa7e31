"""Which path a module with a lean evaluation forward took, for the tests of
:mod:`isoprobe.models.t5_stack` and :mod:`isoprobe.models.patchtst_encoder`."""

from __future__ import annotations

from functools import partial

import pytest
import torch


def spy_on_paths(monkeypatch: pytest.MonkeyPatch, lean_class: type, official_class: type):
    """A list that gets one entry per forward of a ``lean_class`` module: True where it took
    the lean path (``_lean_forward``), False where it ran ``official_class.forward``."""
    calls: list[bool] = []
    lean_forward, official_forward = lean_class._lean_forward, official_class.forward

    def spy_lean(self, *args):
        calls.append(True)
        return lean_forward(self, *args)

    def spy_official(self, *args, **kwargs):
        if type(self) is lean_class:
            calls.append(False)
        return official_forward(self, *args, **kwargs)

    monkeypatch.setattr(lean_class, "_lean_forward", spy_lean)
    monkeypatch.setattr(official_class, "forward", spy_official)
    return calls


def probe_captures(module, batch: dict) -> dict:
    """What forward hooks on every layer the probe reads (blocks and attentions) capture in
    one ``probe_forward`` of ``module`` on ``batch``: {layer name: its output}."""
    captured = {}

    def keep(name, _module, _args, out):
        captured[name] = out[0] if isinstance(out, tuple) else out

    layers = {**module.probe_layers(), **module.probe_layers("attention")}
    handles = [layer.register_forward_hook(partial(keep, n)) for n, layer in layers.items()]
    try:
        with torch.no_grad():
            module.probe_forward(batch)
    finally:
        for handle in handles:
            handle.remove()
    return captured
