"""VisionTS's weights: the published MAE files, read without running code, and isoprobe's export.

The MAE authors publish ``mae_visualize_vit_{base,large,huge}.pth`` (the weights the
``visionts`` package downloads from :data:`DOWNLOAD_URL`): a ``torch.save`` of
``{"model": state_dict}``. They are read with ``torch.load(weights_only=True)``, which refuses
any pickled global but tensors and containers, and every tensor the architecture expects must be
there with its shape: a file that lacks one, holds one misshapen or holds extra ones is refused
naming them (the official package prints a line and carries on with random weights).

An export (:func:`export_directory`) is a directory with ``config.json`` (the architecture,
:class:`~isoprobe.models.visionts.mae.MAEShape`'s fields, read back as data and checked key by
key) and ``model.pth`` in the published layout, which the official code also loads.
"""

from __future__ import annotations

import json
import logging
import pickle
import shutil
import tempfile
import urllib.request
import zipfile
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from isoprobe.models.checkpoints import CheckpointError, read_json_config
from isoprobe.models.config_schema import ConfigSchema, check_config, positive, repeats, size
from isoprobe.models.pickle_globals import refused_globals
from isoprobe.models.visionts.mae import MAEShape, expected_tensors, from_published, to_published
from isoprobe.network import host_reachable

log = logging.getLogger(__name__)

DOWNLOAD_HOST = "dl.fbaipublicfiles.com"
DOWNLOAD_URL = f"https://{DOWNLOAD_HOST}/mae/visualize/"
#: model.size -> the published file of that size
OFFICIAL_FILES = {
    "base": "mae_visualize_vit_base.pth",
    "large": "mae_visualize_vit_large.pth",
    "huge": "mae_visualize_vit_huge.pth",
}
#: where ``model.checkpoint=official`` keeps what it downloads
CACHE_DIR = Path.home() / ".cache" / "isoprobe" / "visionts"
EXPORT_CONFIG = "config.json"
EXPORT_WEIGHTS = "model.pth"
MODEL_TYPE = "visionts_mae"


def official_file(size: str) -> Path:
    """The published weights of ``model.size``, from the cache or downloaded into it; offline
    (or a size the authors did not publish) is a :class:`CheckpointError` saying what to do."""
    if size not in OFFICIAL_FILES:
        raise CheckpointError(
            f"model.checkpoint=official loads the published MAE of model.size "
            f"{sorted(OFFICIAL_FILES)}, not model.size={size!r}."
        )
    path = CACHE_DIR / OFFICIAL_FILES[size]
    if path.is_file():
        return path
    url = DOWNLOAD_URL + OFFICIAL_FILES[size]
    if not host_reachable(DOWNLOAD_HOST):
        raise CheckpointError(
            f"model.checkpoint=official needs {url}, and {DOWNLOAD_HOST} is unreachable "
            f"(offline) and the file is not in {CACHE_DIR}. Copy it there, give its path as "
            "model.checkpoint=/path/to/file.pth, or use model.checkpoint=scratch."
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    log.info("VisionTS: downloading %s to %s", url, path)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as partial:
        with urllib.request.urlopen(url, timeout=60) as response:
            shutil.copyfileobj(response, partial)
    Path(partial.name).replace(path)
    return path


def read_state_dict(path: Path, shape: MAEShape) -> dict[str, Tensor]:
    """The tensors of a published-layout ``.pth`` at ``path``, checked against ``shape``, with
    the query, key and value split (:func:`~isoprobe.models.visionts.mae.from_published`)."""
    if not path.is_file():
        raise CheckpointError(
            f"{path} does not exist: an export directory holds {EXPORT_WEIGHTS} beside "
            f"{EXPORT_CONFIG}. Export the model again."
        )
    try:
        content = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        refused = refused_globals(err, path)
        raise CheckpointError(
            f"{path} pickles {', '.join(refused) or 'objects other than tensors'}, which is "
            "refused because reading it could run code: VisionTS loads a plain "
            "{'model': state_dict} of tensors (mae_visualize_vit_*.pth). Save the weights as "
            "such a file."
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as err:
        raise CheckpointError(
            f"{path} cannot be read ({err}): it is truncated or not a PyTorch file. Copy or "
            "download it again."
        ) from None
    state = content.get("model") if isinstance(content, dict) else None
    if not isinstance(state, Mapping) or not all(torch.is_tensor(v) for v in state.values()):
        raise CheckpointError(
            f"{path} is not a published MAE file: it must hold {{'model': state_dict}} with "
            "tensors only, as mae_visualize_vit_*.pth do."
        )
    check_tensors(state, shape, path)
    return from_published({k: v.float() for k, v in state.items()})


def check_tensors(state: Mapping[str, Tensor], shape: MAEShape, path: Path) -> None:
    """Refuse ``state`` unless it holds exactly the tensors of ``shape``, each of its shape,
    naming the missing, misshapen and unexpected ones."""
    expected = expected_tensors(shape)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    misshapen = [
        f"{key} {tuple(state[key].shape)} (expected {expected[key]})"
        for key in sorted(set(expected) & set(state))
        if tuple(state[key].shape) != expected[key]
    ]
    if missing or unexpected or misshapen:
        problems = []
        if missing:
            problems.append(f"{len(missing)} missing: {', '.join(missing[:5])}")
        if misshapen:
            problems.append(f"{len(misshapen)} misshapen: {'; '.join(misshapen[:5])}")
        if unexpected:
            problems.append(f"{len(unexpected)} unexpected: {', '.join(unexpected[:5])}")
        raise CheckpointError(
            f"{path} does not fit the VisionTS MAE {shape.as_dict()}: "
            f"{' / '.join(problems)}. Give the file of this architecture (model.size, or the "
            "config.json beside an export), or download it again."
        )


def parameter_count(config: Mapping[str, Any]) -> float:
    """The parameters (and fixed position embeddings) of the MAE a config describes: patch
    embedding, encoder and decoder blocks, and the decoder's pixel head."""
    patch, grid = config["patch_size"], config["image_size"] // config["patch_size"]
    tokens, ratio = grid * grid + 1, config["mlp_ratio"]
    width, decoder = config["width"], config["decoder_width"]

    def blocks(depth: int, width: int) -> float:
        return depth * (4 * width * width + 2 * ratio * width * width + 9 * width)

    return (
        (3 * patch * patch + tokens + 2) * width
        + blocks(config["depth"], width)
        + (width + tokens + 3) * decoder
        + blocks(config["decoder_depth"], decoder)
        + 3 * patch * patch * decoder
    )


SCHEMA = ConfigSchema(
    model="VisionTS MAE",
    keys=(
        size("image_size"),
        size("patch_size"),
        size("width"),
        repeats("depth"),
        repeats("heads"),
        size("decoder_width"),
        repeats("decoder_depth"),
        repeats("decoder_heads"),
        positive("mlp_ratio"),
    ),
    multiples=(
        ("image_size", "patch_size"),
        ("width", "heads"),
        ("decoder_width", "decoder_heads"),
        # the 2-D sine-cosine position embedding splits the width in four
        ("width", 4),
        ("decoder_width", 4),
    ),
    parameters=parameter_count,
)


def read_export_shape(directory: Path) -> MAEShape:
    """The architecture in an export's ``config.json``, read as data: ``model_type`` and
    :class:`MAEShape`'s fields and no other key, each value as :data:`SCHEMA` declares it."""
    path = directory / EXPORT_CONFIG
    config = read_json_config(path)
    names = [f.name for f in fields(MAEShape)]
    unexpected = sorted(set(config) - {"model_type", *names})
    if config.get("model_type") != MODEL_TYPE or unexpected:
        raise CheckpointError(
            f"{path} is not a VisionTS export: it needs exactly the keys "
            f"{sorted(['model_type', *names])} with model_type {MODEL_TYPE!r}, and has "
            f"{sorted(config)}. model=visionts loads a directory its export wrote, or a "
            "mae_visualize_vit_*.pth file."
        )
    check_config(config, SCHEMA, str(path))
    return MAEShape(**{name: config[name] for name in names})


def export_directory(state: Mapping[str, Tensor], shape: MAEShape, directory: str) -> None:
    """``config.json`` and ``model.pth`` (``{'model': state_dict}``, qkv fused) in
    ``directory``."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / EXPORT_CONFIG).write_text(
        json.dumps({"model_type": MODEL_TYPE, **shape.as_dict()}, indent=2)
    )
    tensors = {k: v.detach().contiguous().cpu() for k, v in to_published(state).items()}
    torch.save({"model": tensors}, path / EXPORT_WEIGHTS)
