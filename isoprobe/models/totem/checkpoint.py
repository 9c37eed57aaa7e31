"""TOTEM's published tokenizers read safely. They are whole-module pickles (the official training
script's ``torch.save(model)``): unpickling them as published would import and run TOTEM's code.
Here an allow-list unpickler (:mod:`isoprobe.models.allow_list_pickle`) rebuilds the tensors and
turns each module into an inert stand-in (TOTEM's ``lib.models.vqvae`` classes and the torch.nn
classes they hold, by exact name) that keeps its ``_parameters`` and ``_modules``; any other
global is refused by name and nothing of it runs. :func:`load_totem_tokenizer` then reads the
architecture from the tensors' shapes and maps the official parameter names onto
:class:`~isoprobe.models.totem.tokenizer.TotemTokenizer`'s."""

from __future__ import annotations

import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from isoprobe.models.allow_list_pickle import TENSOR_GLOBALS, PickledObject, allow_list_pickle
from isoprobe.models.checkpoints import CheckpointError
from isoprobe.models.config_schema import ConfigSchema, Key, check_config, positive
from isoprobe.models.totem.tokenizer import COMPRESSION_FACTORS, TotemConfig, TotemTokenizer

#: the module the official scripts' pickles name (they run from ``forecasting/``)
TOTEM_MODULE = "lib.models.vqvae"
TOTEM_CLASSES = ("vqvae", "Encoder", "Decoder", "VectorQuantizer", "ResidualStack", "Residual")
TORCH_MODULE_CLASSES = (
    ("torch.nn.modules.conv", "Conv1d"),
    ("torch.nn.modules.conv", "ConvTranspose1d"),
    ("torch.nn.modules.sparse", "Embedding"),
    ("torch.nn.modules.container", "ModuleList"),
    ("torch.nn.modules.container", "Sequential"),
    ("torch.nn.modules.activation", "ReLU"),
)
#: a module's hook registries are sets (protocol 2 writes builtins as __builtin__)
_ALLOWED = {**TENSOR_GLOBALS, ("builtins", "set"): set, ("__builtin__", "set"): set}


def _is_module_class(module: str, name: str) -> bool:
    is_totem = module == TOTEM_MODULE or module.endswith("." + TOTEM_MODULE)
    return (is_totem and name in TOTEM_CLASSES) or (module, name) in TORCH_MODULE_CLASSES


_totem_pickle = allow_list_pickle(_ALLOWED, _is_module_class, "the TOTEM tokenizer file")


def _named_tensors(module: PickledObject, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
    """``named_parameters`` of a stand-in module tree: its ``_parameters`` then its children's."""
    state = getattr(module, "state", None)
    if not isinstance(state, dict):
        raise CheckpointError(f"the pickled module {prefix or '<root>'} holds no module state")
    for name, value in (state.get("_parameters") or {}).items():
        if isinstance(value, Tensor):
            yield prefix + name, value
    for name, child in (state.get("_modules") or {}).items():
        if isinstance(child, PickledObject):
            yield from _named_tensors(child, f"{prefix}{name}.")


def _official_renames(halvings: int) -> list[tuple[str, str]]:
    """(official name pattern, isoprobe's) for a tokenizer with ``halvings`` stride-2 layers."""
    down = ["_conv_1", "_conv_2", "_conv_A", "_conv_B"][:halvings]
    up = ["_conv_trans_A", "_conv_trans_B"][: halvings - 2] + ["_conv_trans_1", "_conv_trans_2"]
    renames = [(rf"encoder\.{name}\.", f"encoder.downsample.{i}.") for i, name in enumerate(down)]
    renames += [(rf"decoder\.{name}\.", f"decoder.upsample.{i}.") for i, name in enumerate(up)]
    return renames + [
        (r"encoder\._conv_3\.", "encoder.mix."),
        (r"encoder\._pre_vq_conv\.", "encoder.to_code."),
        (r"decoder\._conv_1\.", "decoder.from_code."),
        (r"_residual_stack\._layers\.(\d+)\._block\.1\.", r"residual.units.\1.conv_in."),
        (r"_residual_stack\._layers\.(\d+)\._block\.3\.", r"residual.units.\1.conv_out."),
        (r"^vq\._embedding\.", "quantizer.codebook."),
    ]


def _isoprobe_names(state: dict[str, Tensor], halvings: int) -> dict[str, Tensor]:
    renamed = {}
    for key, value in state.items():
        for pattern, replacement in _official_renames(halvings):
            key = re.sub(pattern, replacement, key)
        renamed[key] = value
    return renamed


#: the values a TOTEM file gives as numbers rather than tensor shapes; the file's tensors are
#: already read (the architecture's sizes are theirs), so there is nothing left to estimate
SCHEMA = ConfigSchema(
    model="TOTEM tokenizer",
    keys=(Key("compression_factor", int, low=1), positive("commitment_cost")),
    parameters=lambda _config: 0,
)


def _config(root: PickledObject, state: dict[str, Tensor], path: Path) -> TotemConfig:
    """The architecture from the root's ``compression_factor`` and the tensors' shapes."""
    factor = root.state.get("compression_factor")
    quantizer = root.state["_modules"]["vq"].state
    commitment = quantizer.get("_commitment_cost", 0.25)
    check_config({"compression_factor": factor, "commitment_cost": commitment}, SCHEMA, str(path))
    if factor not in COMPRESSION_FACTORS:
        raise CheckpointError(
            f"{path}: compression_factor={factor!r}; isoprobe builds TOTEM tokenizers with "
            f"compression factor {sorted(COMPRESSION_FACTORS)}"
        )
    try:
        codebook = state["vq._embedding.weight"]
        hidden = state["encoder._conv_3.weight"].shape[0]
        residual = state["encoder._residual_stack._layers.0._block.1.weight"].shape[0]
    except KeyError as err:
        raise CheckpointError(f"{path} is not a TOTEM VQ-VAE: it has no {err.args[0]}") from None
    layers = {k.split("._layers.")[1].split(".")[0] for k in state if "encoder._residual" in k}
    return TotemConfig(
        block_hidden_size=int(hidden),
        num_residual_layers=len(layers),
        res_hidden_size=int(residual),
        embedding_dim=int(codebook.shape[1]),
        num_embeddings=int(codebook.shape[0]),
        commitment_cost=float(commitment),
        compression_factor=int(factor),
    )


def load_totem_tokenizer(path: str | Path) -> TotemTokenizer:
    """The tokenizer in an official TOTEM file (a ``torch.save(model)`` of its ``vqvae``), read
    without running any of its code (module docstring); refused with a
    :class:`CheckpointError` naming the file and what was wrong."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"TOTEM tokenizer file {path} does not exist: give the path of a published "
            "tokenizer (a .pth from TOTEM's model zoo) or use checkpoint=scratch"
        )
    try:
        root: Any = torch.load(
            path, map_location="cpu", pickle_module=_totem_pickle, weights_only=False
        )
    except (pickle.UnpicklingError, AttributeError, TypeError, EOFError, RuntimeError) as err:
        raise CheckpointError(
            f"{path} cannot be loaded safely ({err}). A TOTEM tokenizer file may hold only "
            f"TOTEM's {TOTEM_MODULE} modules, torch.nn layers and tensors; other pickled "
            "objects are refused on purpose."
        ) from err
    qualified = getattr(root, "qualified_name", type(root).__name__)
    if not qualified.endswith(f"{TOTEM_MODULE}.vqvae"):
        raise CheckpointError(
            f"{path} holds {qualified}, not TOTEM's {TOTEM_MODULE}.vqvae: give a TOTEM "
            "tokenizer file (torch.save of the official vqvae)"
        )
    official = dict(_named_tensors(root))
    config = _config(root, official, path)
    tokenizer = TotemTokenizer(config)
    state = _isoprobe_names(official, config.halvings)
    expected = tokenizer.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    misshapen = sorted(k for k in set(expected) & set(state) if expected[k].shape != state[k].shape)
    if missing or unexpected or misshapen:
        raise CheckpointError(
            f"{path} does not fit a TOTEM tokenizer of {config}: missing {missing}, "
            f"unexpected {unexpected}, misshapen {misshapen}"
        )
    tokenizer.load_state_dict({k: v.float() for k, v in state.items()})
    return tokenizer.eval()
