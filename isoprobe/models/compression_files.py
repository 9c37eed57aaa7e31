"""The files of a compressed model (:mod:`isoprobe.models.compression`).

A compressed model is saved as the model's own export with the projections' rank-r products
``up @ down`` in place of ``W`` (so the official loaders read it as the same architecture), plus
``compression.safetensors`` (the exact factors) and ``compression.json`` (which modules, which
rank); :func:`apply_saved_compression` puts the same factors back after loading, so the
reloaded model forecasts identically. A ``truncated`` layer needs nothing more: its dense
``W_r`` is in the export.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from isoprobe.models.checkpoints import CheckpointError, read_json_config, read_safetensors
from isoprobe.models.compression import FactoredLinear, ProjectionReport, set_module

COMPRESSION_JSON = "compression.json"
COMPRESSION_WEIGHTS = "compression.safetensors"


def export_compressed(
    model: nn.Module, reports: list[ProjectionReport], directory: str, dtype: str = "float32"
) -> None:
    """The model's own ``export`` with every factored projection written as its dense rank-r
    product, then the exact factors and the report (see the module docstring)."""
    factored = {r.module: model.get_submodule(r.module) for r in reports if r.status == "factored"}
    for path, module in factored.items():
        dense = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
        with torch.no_grad():
            dense.weight.copy_(module.weight)
            if module.bias is not None:
                dense.bias.copy_(module.bias)
        set_module(model, path, dense.to(module.up.weight.device))
    try:
        model.export(directory, dtype)
    finally:
        for path, module in factored.items():
            set_module(model, path, module)
    save_compression(model, reports, directory)


def save_compression(model: nn.Module, reports: list[ProjectionReport], directory: str) -> None:
    """Write the exact factors and the report beside the model's export in ``directory``."""
    factored = [r for r in reports if r.status == "factored"]
    tensors = {}
    for r in factored:
        module = model.get_submodule(r.module)
        tensors[f"{r.module}.down.weight"] = module.down.weight.detach().contiguous().cpu()
        tensors[f"{r.module}.up.weight"] = module.up.weight.detach().contiguous().cpu()
        if module.up.bias is not None:
            tensors[f"{r.module}.up.bias"] = module.up.bias.detach().contiguous().cpu()
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / COMPRESSION_WEIGHTS))
    (path / COMPRESSION_JSON).write_text(
        json.dumps({"projections": [asdict(r) for r in reports]}, indent=2)
    )


def apply_saved_compression(model: nn.Module, directory: str) -> list[ProjectionReport] | None:
    """Put back the factors :func:`save_compression` wrote in ``directory``; None when the
    directory holds no compression. A factor that does not fit the model names the module."""
    path = Path(directory)
    if not (path / COMPRESSION_JSON).is_file():
        return None
    try:
        reports = [
            ProjectionReport(**r) for r in read_json_config(path / COMPRESSION_JSON)["projections"]
        ]
    except (KeyError, TypeError) as err:
        raise CheckpointError(
            f"{path / COMPRESSION_JSON} is not what task=compress writes ({err!r}): compress "
            "the model again."
        ) from err
    tensors = read_safetensors(path / COMPRESSION_WEIGHTS)
    for r in reports:
        if r.status != "factored":
            continue
        try:
            linear = model.get_submodule(r.module)
        except AttributeError as err:
            raise ValueError(
                f"{path / COMPRESSION_JSON} names {r.module!r}, which this model does not have: "
                "the compression was saved from another architecture"
            ) from err
        shape = tuple(linear.weight.shape) if isinstance(linear, nn.Linear) else None
        if shape != (r.out_features, r.in_features):
            raise ValueError(
                f"{path / COMPRESSION_JSON}: the factors of {r.module!r} are for a "
                f"[{r.out_features}, {r.in_features}] linear projection, but this model's is "
                f"{type(linear).__name__} {list(shape or [])}: saved from another shape"
            )
        has_bias = f"{r.module}.up.bias" in tensors
        factored = FactoredLinear(r.in_features, r.out_features, r.rank, has_bias)
        factored.load_state_dict(
            {
                key.removeprefix(f"{r.module}."): value
                for key, value in tensors.items()
                if key.startswith(f"{r.module}.")
            }
        )
        set_module(model, r.module, factored.to(linear.weight.device, linear.weight.dtype))
    model.compression = reports
    return reports
