"""The official Lag-Llama Lightning ``.ckpt`` read safely: an allow-list unpickler (tensors,
containers, primitives and inert stand-ins for gluonts classes; any other global is refused by
name before anything of it runs) and :func:`load_official_checkpoint`."""

from __future__ import annotations

import functools
import pickle
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from isoprobe.models.allow_list_pickle import TENSOR_GLOBALS, allow_list_pickle
from isoprobe.models.checkpoints import CheckpointError
from isoprobe.models.lag_llama.network import SCALINGS


def _object_new_only(owner: Any, attribute: str) -> Any:
    """The one ``getattr`` gluonts' pickles use (``object.__new__``); any other is refused."""
    if owner is object and attribute == "__new__":
        return object.__new__
    raise pickle.UnpicklingError(f"getattr({owner!r}, {attribute!r}) is not allowed")


#: (module, name) -> what it unpickles as; pickle protocol 2 writes builtins as __builtin__
_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    **TENSOR_GLOBALS,
    ("functools", "partial"): functools.partial,
    ("pathlib", "PosixPath"): PurePosixPath,
    **{
        (module, name): value
        for module in ("builtins", "__builtin__")
        for name, value in (("object", object), ("getattr", _object_new_only), ("set", set))
    },
}


def _is_gluonts(module: str, name: str) -> bool:
    return module == "gluonts" or module.startswith("gluonts.")


#: what ``torch.load`` takes as its ``pickle_module``: every read goes through the allow-list
checkpoint_pickle = allow_list_pickle(_ALLOWED_GLOBALS, _is_gluonts, "the checkpoint")


def load_official_checkpoint(path: str | Path) -> tuple[dict, dict]:
    """Architecture and weights from an official Lightning ``.ckpt``: its
    ``hyper_parameters["model_kwargs"]`` and its ``state_dict`` without the ``model.`` prefix.

    ``torch.load(weights_only=True)`` cannot read it: gluonts pickles its ``StudentTOutput`` as a
    call of ``functools.partial(getattr(object, "__new__"), ...)``, which that loader refuses.
    So it is read by an allow-list unpickler (:data:`checkpoint_pickle`, the standard library's
    "restricting globals" recipe): tensors, containers, primitives and inert stand-ins for the
    gluonts classes; any other global is refused by name and nothing of it runs."""
    try:
        ckpt = torch.load(
            path, map_location="cpu", pickle_module=checkpoint_pickle, weights_only=False
        )
    except (pickle.UnpicklingError, AttributeError, TypeError, EOFError, RuntimeError) as err:
        raise CheckpointError(
            f"{path} cannot be loaded safely ({err}). model.checkpoint=<file>.ckpt takes the "
            "official lag-llama.ckpt; other pickled classes are refused on purpose."
        ) from err
    kwargs = ckpt.get("hyper_parameters", {}).get("model_kwargs")
    if kwargs is None or "state_dict" not in ckpt:
        raise CheckpointError(
            f"{path} is not a Lag-Llama Lightning checkpoint: it needs hyper_parameters."
            "model_kwargs and a state_dict"
        )
    distribution = kwargs.get("distr_output")
    if distribution is not None and type(distribution).__name__ != "StudentTOutput":
        raise CheckpointError(f"{path} uses {type(distribution).__name__}; only Student-t is built")
    if kwargs.get("rope_scaling"):
        raise CheckpointError(f"{path} uses rope_scaling={kwargs['rope_scaling']}: not supported")
    config = {
        "n_layer": int(kwargs["n_layer"]),
        "n_head": int(kwargs["n_head"]),
        "n_embd_per_head": int(kwargs["n_embd_per_head"]),
        "max_context_length": int(kwargs.get("max_context_length", 2048)),
        "lags_seq": [int(lag) for lag in kwargs["lags_seq"]],
        "scaling": kwargs.get("scaling", "robust"),
        "time_feat": bool(kwargs.get("time_feat", True)),
        "scale_features": True,
        "rope_base": 10000.0,
    }
    if int(kwargs.get("input_size", 1)) != 1:
        raise CheckpointError(f"{path} has input_size={kwargs['input_size']}; only 1 is built")
    if config["scaling"] not in SCALINGS:
        raise CheckpointError(f"{path} uses scaling={config['scaling']!r}; built: {SCALINGS}")
    state = {
        key.removeprefix("model."): value
        for key, value in ckpt["state_dict"].items()
        if key.startswith("model.")
    }
    return config, state
