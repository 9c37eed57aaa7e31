"""Where a model's weights come from: ``model.checkpoint`` resolution.

``checkpoint`` is one of:
  - ``auto``: the official hub id when it is in the local Hugging Face cache or the hub is
    reachable, else ``bundled`` with a loud one-line notice (never a silent substitution);
  - ``bundled``: the small checkpoint this project pretrains and ships inside the package;
  - ``scratch``: random initialisation from the model's scratch shape;
  - a local directory in Hugging Face format (``config.json`` + ``model.safetensors``);
  - any other string: a hub id, which needs the network or the local cache.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import hf_hub_download
from huggingface_hub.errors import HFValidationError
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from isoprobe.errors import IsoprobeError
from isoprobe.models.pickle_globals import refused_globals
from isoprobe.network import host_reachable

log = logging.getLogger(__name__)

BUNDLED_DIR = Path(__file__).parent / "bundled"


class CheckpointError(IsoprobeError, RuntimeError):
    """A checkpoint that cannot be resolved or does not fit the model."""


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """``kind`` is ``hub``, ``path``, ``bundled`` or ``scratch``; ``location`` the id or path."""

    kind: str
    location: str
    requested: str

    def describe(self) -> str:
        return f"{self.kind}:{self.location}" if self.location else self.kind


def hub_cached(hub_id: str) -> bool:
    """True when ``hub_id``'s config is in the local Hugging Face cache."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(hub_id, "config.json"), str)


#: the checkpoints this package ships in ``bundled/`` (a test keeps the list and folder equal)
SHIPPED = (
    "chronos-2-mini",
    "chronos-bolt-mini",
    "chronos-t5-mini",
    "lag-llama-mini",
    "llm-gpt2-mini",
    "moirai-mini",
    "moirai2-mini",
    "patchtst-mini",
    "sundial-mini",
    "time-moe-mini",
    "timesfm-mini",
    "timesfm25-mini",
    "tirex-mini",
    "toto-mini",
)


def bundled_path(name: str) -> Path:
    """The folder of the shipped checkpoint ``name``; a name isoprobe does not ship, or a
    shipped one missing from this installation, is refused with what to do instead."""
    if name not in SHIPPED:
        raise CheckpointError(
            f"isoprobe ships no checkpoint {name!r} (it ships {', '.join(SHIPPED)}). Start from "
            "random weights with model.checkpoint=scratch, or give a local checkpoint directory "
            "or a hub id as model.checkpoint."
        )
    path = BUNDLED_DIR / name
    if not (path / "config.json").is_file():
        raise CheckpointError(
            f"the bundled checkpoint {name!r} is missing at {path}: this installation of "
            "isoprobe is incomplete. Reinstall isoprobe, or recreate it with the pretraining "
            "command in docs/models.md (task=pretrain)."
        )
    return path


def resolve_checkpoint(checkpoint: str, hub_id: str, bundled_name: str) -> ResolvedCheckpoint:
    """Turn ``model.checkpoint`` into a concrete source of weights (see module docstring)."""
    if checkpoint == "scratch":
        return ResolvedCheckpoint("scratch", "", checkpoint)
    if checkpoint == "bundled":
        return ResolvedCheckpoint("bundled", str(bundled_path(bundled_name)), checkpoint)
    if checkpoint == "auto":
        if hub_cached(hub_id) or host_reachable():
            return ResolvedCheckpoint("hub", hub_id, checkpoint)
        location = str(bundled_path(bundled_name))
        log.warning(
            "model.checkpoint=auto: %s is neither cached nor reachable (offline); "
            "using the BUNDLED checkpoint %s instead.",
            hub_id,
            location,
        )
        return ResolvedCheckpoint("bundled", location, checkpoint)
    path = Path(checkpoint).expanduser()
    if not path.exists() and checkpoint.startswith(("/", "./", "../", "~", ".\\")):
        raise CheckpointError(
            f"model.checkpoint={checkpoint!r} does not exist. Give a Hugging Face model "
            "directory (config.json + model.safetensors), or bundled / scratch / a hub id."
        )
    if path.exists():
        if not (path / "config.json").is_file():
            raise CheckpointError(
                f"model.checkpoint={checkpoint!r} exists but holds no config.json: expected a "
                "Hugging Face model directory (config.json + model.safetensors). For a Lightning "
                ".ckpt to resume from, pass ckpt_path= instead."
            )
        return ResolvedCheckpoint("path", str(path.resolve()), checkpoint)
    try:
        found = hub_cached(checkpoint) or host_reachable()
    except HFValidationError as err:
        raise CheckpointError(
            f"model.checkpoint={checkpoint!r} is neither a local directory nor a valid hub id "
            f"({err}). Give a Hugging Face model directory, bundled, scratch or an id such as "
            "amazon/chronos-t5-small."
        ) from None
    if found:
        return ResolvedCheckpoint("hub", checkpoint, checkpoint)
    raise CheckpointError(
        f"model.checkpoint={checkpoint!r} is not a local directory, and as a hub id it needs the "
        "network, which is unreachable (and it is not in the Hugging Face cache). Use "
        "model.checkpoint=bundled to run offline, or a local copy: model.checkpoint=/path/to/dir."
    )


def checkpoint_file(source: ResolvedCheckpoint, filename: str) -> Path:
    """``filename`` of a resolved checkpoint: in its local directory (``path``, ``bundled``),
    or of its hub repository (downloaded, or from the cache)."""
    if source.kind in ("path", "bundled"):
        return Path(source.location) / filename
    return Path(hf_hub_download(source.location, filename))


def pickled_weights_error(source: str, err: pickle.UnpicklingError) -> CheckpointError:
    """The refusal of pickled weights (``pytorch_model.bin``) that hold more than tensors, which
    transformers reads with ``weights_only=True``, naming the globals refused."""
    refused = refused_globals(err, Path(source) / "pytorch_model.bin")
    return CheckpointError(
        f"the pickled weights in {source} hold Python objects other than tensors "
        f"({', '.join(refused) or 'not a PyTorch file'}), which are refused because reading "
        "them could run code. Save the weights as model.safetensors."
    )


def read_json_config(path: Path) -> dict[str, Any]:
    """A checkpoint's config.json as plain data, or an error naming the file."""
    if not path.is_file():
        raise CheckpointError(
            f"{path.parent} holds no {path.name}: a checkpoint directory needs config.json "
            "beside its weights. Give the directory an export wrote (task=pretrain, "
            "task=compress or the model's save_pretrained)."
        )
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(
            f"{path} is not valid JSON ({err}): the file is corrupt or was edited. Copy or "
            "export the checkpoint again."
        ) from err
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} holds {type(config).__name__}, not a JSON object")
    return config


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, or an error naming the file (missing, truncated or
    not safetensors at all, such as a pickle saved under that name)."""
    if not path.is_file():
        raise CheckpointError(
            f"{path.parent} holds no {path.name}: the weights are missing beside config.json. "
            "Copy or export the checkpoint again."
        )
    try:
        return load_file(str(path))
    except SafetensorError as err:
        raise CheckpointError(
            f"{path} cannot be read ({err}): it is truncated, corrupt or not a safetensors "
            "file. Copy or export the checkpoint again."
        ) from err


def pretrained_config(source: str, loads: str) -> Any:
    """``AutoConfig.from_pretrained(source)`` for a model that ``loads`` such checkpoints,
    never running code shipped with them (``trust_remote_code=False``); an unreadable or
    unrecognised config.json, or one that asks for its own code, is a :class:`CheckpointError`
    naming the file and what the model loads."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source, trust_remote_code=False)
    except ValueError as err:
        if "trust_remote_code" in str(err) or "custom code" in str(err):
            raise CheckpointError(
                f"{source}/config.json asks to run Python code shipped with the checkpoint "
                "(its auto_map): isoprobe never runs a checkpoint's code (no "
                f"trust_remote_code). {loads}"
            ) from None
        raise CheckpointError(
            f"{source}/config.json is not a config transformers recognises ({err}). {loads}"
        ) from None
    except OSError as err:
        raise CheckpointError(
            f"{source}/config.json cannot be read ({err}). Copy or export the checkpoint again. "
            f"{loads}"
        ) from None


def load_pretrained(model_class: Any, source: str, **kwargs: Any) -> tuple[Any, Mapping[str, Any]]:
    """``model_class.from_pretrained(source)`` in float32, in train mode, with transformers'
    loading report (``missing_keys``, ``unexpected_keys``, ``mismatched_keys``), which
    :func:`check_weights_fit` reads: transformers itself only warns about them and initialises
    what is missing or misshapen at random. A weights file that cannot be read is a
    :class:`CheckpointError`."""
    try:
        model, info = model_class.from_pretrained(
            source,
            dtype=torch.float32,
            output_loading_info=True,
            ignore_mismatched_sizes=True,
            **kwargs,
        )
    except SafetensorError as err:
        raise CheckpointError(
            f"the weights file in {source} cannot be read ({err}): it is truncated or corrupt. "
            "Copy or export the checkpoint again."
        ) from err
    except pickle.UnpicklingError as err:
        raise pickled_weights_error(source, err) from None
    # from_pretrained returns eval mode; Lightning keeps submodule modes, so fine-tuning would
    # otherwise run without dropout
    return model.train(), info


#: what to do about weights that do not fit the config.json beside them
REEXPORT = "The config was edited or belongs to another checkpoint; re-export the model."


def refuse_misfit(
    source: str,
    described: str,
    fix: str,
    mismatched: Sequence[tuple[str, Sequence[int], Sequence[int]]],
    missing: Sequence[str],
    unexpected: Sequence[str],
) -> None:
    """Refuse, in one message ending with ``fix``, the weights in ``source`` that do not fit
    ``described`` (the architecture they were to load into, "its config.json"): the first of
    ``mismatched`` (name, its shape, the model's) named with both shapes, else the missing and
    unexpected ones."""
    if mismatched:
        name, found, expected = mismatched[0]
        raise CheckpointError(
            f"the weights in {source} do not fit {described}: {name} has shape "
            f"{tuple(found)} in the checkpoint but {tuple(expected)} in the model "
            f"({len(mismatched)} tensors differ). {fix}"
        )
    missing, unexpected = sorted(missing), sorted(unexpected)
    if missing or unexpected:
        raise CheckpointError(
            f"the weights in {source} do not match {described}: {len(missing)} weights "
            f"missing (e.g. {missing[:3]}), {len(unexpected)} unexpected (e.g. {unexpected[:3]}). "
            f"{fix}"
        )


def check_weights_fit(
    info: Mapping[str, Any],
    source: str,
    missing: Sequence[str] | None = None,
    unexpected: Sequence[str] | None = None,
) -> None:
    """Refuse a checkpoint whose tensors do not fit the architecture its config.json builds
    (:func:`refuse_misfit`; ``missing``/``unexpected`` where a model counts them itself, else
    the loading report's)."""
    refuse_misfit(
        source,
        "its config.json",
        REEXPORT,
        sorted(info["mismatched_keys"]),
        info["missing_keys"] if missing is None else missing,
        info["unexpected_keys"] if unexpected is None else unexpected,
    )


def load_float_weights(
    network: torch.nn.Module,
    weights: Mapping[str, Any],
    source: str,
    described: str,
    loads: str,
    fix: str | None = None,
) -> torch.nn.Module:
    """``network`` in train mode with ``weights`` (name -> tensor, as read from ``source``)
    loaded as float32, after refusing, one message each, weights that are not exactly its
    tensors (:func:`refuse_misfit`, ending with ``fix``, default ``loads``: what the model
    loads) and values that are not floating-point tensors (ending with ``loads``)."""
    expected = network.state_dict()
    mismatched = [
        (name, tuple(weights[name].shape), tuple(tensor.shape))
        for name, tensor in expected.items()
        if name in weights
        and torch.is_tensor(weights[name])
        and weights[name].shape != tensor.shape
    ]
    missing, unexpected = set(expected) - set(weights), set(weights) - set(expected)
    refuse_misfit(source, described, fix or loads, mismatched, missing, unexpected)
    not_floats = sorted(
        name for name, t in weights.items() if not (torch.is_tensor(t) and t.is_floating_point())
    )
    if not_floats:
        raise CheckpointError(
            f"the weights in {source} hold values that are not floating-point tensors "
            f"({not_floats[:3]}). {loads}"
        )
    network.load_state_dict({name: tensor.float() for name, tensor in weights.items()})
    return network.train()


def load_published_network(
    resolved: ResolvedCheckpoint,
    scratch: Mapping[str, Any] | None,
    network: Callable[[Any], torch.nn.Module],
    shape_from_fields: Callable[[Mapping[str, Any], str], Any],
    *,
    described: str,
    loads: str,
    shape_from_config: Callable[[Mapping[str, Any], str], Any] | None = None,
    rename: Callable[[dict[str, torch.Tensor], Any], Mapping[str, Any]] | None = None,
    fix: str | None = None,
) -> torch.nn.Module:
    """The network of ``model.checkpoint`` in train mode, for a model published as config.json
    beside model.safetensors: from ``checkpoint=scratch``, ``network(shape_from_fields(scratch,
    "model.sizes"))``; from a checkpoint, the shape of its config.json (read as data:
    ``shape_from_config(config, source)``, by default ``shape_from_fields`` of the config) and
    its safetensors weights, named as the network names them by ``rename(weights, shape)``,
    loaded by :func:`load_float_weights` (``described``, ``loads`` and ``fix`` its messages')."""
    if resolved.kind == "scratch":
        return network(shape_from_fields(scratch_shape(scratch), "model.sizes"))
    source = resolved.location
    config = read_json_config(checkpoint_file(resolved, "config.json"))
    if shape_from_config is None:
        shape = shape_from_fields(config, f"{source}/config.json")
    else:
        shape = shape_from_config(config, source)
    weights: Mapping[str, Any] = read_safetensors(checkpoint_file(resolved, "model.safetensors"))
    if rename is not None:
        weights = rename(weights, shape)
    return load_float_weights(network(shape), weights, source, described, loads, fix)


def export_published_network(
    network: torch.nn.Module,
    directory: str,
    dtype: str,
    config: Mapping[str, Any],
    rename: Callable[[str], str] | None = None,
) -> None:
    """Write ``network`` in the layout :func:`load_published_network` reads: its weights as
    model.safetensors (floating-point tensors in ``dtype``, each name through ``rename``) beside
    ``config`` as config.json."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    to = getattr(torch, dtype)
    weights = {
        (rename(name) if rename else name): (
            tensor.to(to) if tensor.is_floating_point() else tensor
        ).contiguous()
        for name, tensor in network.state_dict().items()
    }
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def scratch_fields(
    size: str, sizes: Mapping[str, Mapping[str, Any]] | None
) -> Mapping[str, Any] | None:
    """The architecture fields of ``model.size`` among ``model.sizes`` (None when the model
    has no sizes); a size that is not listed is refused with the ones that are."""
    if sizes is None:
        return None
    if size not in sizes:
        raise ValueError(f"model.size={size!r} is not one of model.sizes: {sorted(sizes)}")
    return sizes[size]


def scratch_shape(
    fields: Mapping[str, Any] | None, settings: str = "model.sizes and model.size"
) -> Mapping[str, Any]:
    """The fields :func:`scratch_fields` found, which ``checkpoint=scratch`` builds a model
    from; where there are none, a :class:`CheckpointError` naming the ``settings`` that give
    them."""
    if fields is None:
        raise CheckpointError(f"model.checkpoint=scratch needs {settings}")
    return fields


def check_config_keys(fields: Any, declared: type, source: str, model: str) -> None:
    """Refuse a ``chronos_config`` (``fields``, from ``source``/config.json) that is not an
    object with the keys of the dataclass ``declared``: it is not a mapping, has keys
    ``declared`` does not, or lacks one without a default; ``model`` names whose it is."""
    known = [f.name for f in dataclasses.fields(declared)]
    if not isinstance(fields, Mapping):
        raise CheckpointError(
            f"chronos_config in {source}/config.json is a {type(fields).__name__}, not an object "
            f"with the keys {known}. Export the checkpoint again."
        )
    unexpected = sorted(set(fields) - set(known))
    missing = [
        f.name
        for f in dataclasses.fields(declared)
        if f.name not in fields
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if unexpected or missing:
        raise CheckpointError(
            f"chronos_config in {source}/config.json has unexpected keys {unexpected} and lacks "
            f"{missing}; a {model} chronos_config has the keys {known}. The file was edited or "
            "belongs to another model: export the checkpoint again."
        )
