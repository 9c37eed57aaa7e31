"""Loading Moirai 1.x for :mod:`isoprobe.models.moirai.module`: uni2ts imported on demand (an extra,
:data:`INSTALL`), a scratch ``MoiraiModule`` or a checkpoint directory / hub id whose config.json
is read field by field (its distribution built from an allow-list, nothing instantiated from the
file) and whose weights are checked against it."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import Tensor

from isoprobe.models.checkpoints import (
    CheckpointError,
    ResolvedCheckpoint,
    checkpoint_file,
    read_json_config,
    read_safetensors,
    scratch_shape,
)
from isoprobe.models.config_schema import (
    ConfigSchema,
    Key,
    check_config,
    fraction,
    repeats,
    size,
)

if TYPE_CHECKING:
    from uni2ts.model.moirai import MoiraiModule

#: the command that installs uni2ts and what its import needs, leaving torch/numpy alone (the
#: pins of scripts/moirai-requirements.txt, which scripts/setup.sh installs)
INSTALL = (
    "python -m pip install --no-deps uni2ts==2.0.0 jaxtyping==0.3.11 wadler_lindig==0.1.8 "
    "jax==0.10.2 jaxlib==0.10.2 ml_dtypes==0.6.0 opt_einsum==3.4.0"
)
CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"


def import_uni2ts() -> tuple[type, type]:
    """uni2ts' ``MoiraiModule`` and ``PackedNLLLoss``, or an error naming the install command."""
    try:
        from uni2ts.loss.packed import PackedNLLLoss
        from uni2ts.model.moirai.module import MoiraiModule
    except ImportError as err:
        raise ImportError(
            f"model=moirai needs uni2ts (Salesforce's Moirai), which cannot be imported ({err}). "
            "It pins old torch/numpy releases, so install it without its dependencies: "
            f"{INSTALL}"
        ) from err
    return MoiraiModule, PackedNLLLoss


def official_mixture():
    """The mixture every Moirai 1.x checkpoint predicts: Student-t, normal of fixed scale,
    negative binomial and log-normal."""
    from uni2ts.distribution import (
        LogNormalOutput,
        MixtureOutput,
        NegativeBinomialOutput,
        NormalFixedScaleOutput,
        StudentTOutput,
    )

    components = [StudentTOutput(), NormalFixedScaleOutput(), NegativeBinomialOutput()]
    return MixtureOutput([*components, LogNormalOutput()])


def _fetch(source: ResolvedCheckpoint, filename: str) -> str:
    """A file of a local directory, or of a hub repository (downloaded or from the cache)."""
    if source.kind in ("path", "bundled"):
        path = Path(source.location) / filename
        if not path.is_file():
            raise CheckpointError(
                f"{source.location} holds no {filename}: a Moirai checkpoint is a directory "
                "written by MoiraiModule.save_pretrained (config.json + model.safetensors)."
            )
        return str(path)
    return str(checkpoint_file(source, filename))


def parameter_count(config: Mapping[str, Any]) -> int:
    """uni2ts' encoder (attention and a gated feed-forward 4 widths wide per layer) with the
    input and distribution projections of every patch size (at most 12 arguments a step)."""
    width, patches = config["d_model"], config["patch_sizes"]
    layer = 16 * width * width + 4 * width
    projections = len(patches) * max(patches) * width * (1 + 12)
    return config["num_layers"] * layer + projections


#: the ``MoiraiModule`` arguments a config.json gives (``scaling`` has uni2ts' default)
SCHEMA = ConfigSchema(
    model="Moirai",
    keys=(
        size("d_model"),
        repeats("num_layers"),
        Key("patch_sizes", list, low=1),
        size("max_seq_len"),
        fraction("attn_dropout_p", required=True),
        fraction("dropout_p", required=True),
        Key("scaling", bool, required=False),
    ),
    # uni2ts gives the encoder d_model // 64 heads of 64 channels
    multiples=(("d_model", 64),),
    parameters=parameter_count,
)


def _module_fields(source: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``MoiraiModule`` arguments of a checkpoint's config.json, refusing the other Moirai
    generations (2.0's quantile decoder, Moirai-MoE) by name."""
    MoiraiModule, _ = import_uni2ts()
    accepted = set(inspect.signature(MoiraiModule.__init__).parameters) - {"self"}
    if "num_predict_token" in config or "quantile_levels" in config:
        raise CheckpointError(
            f"{source} is a Moirai 2.0 checkpoint (a quantile decoder): load it with "
            "model=moirai2; model=moirai loads Moirai 1.0-R / 1.1-R checkpoints such as "
            "Salesforce/moirai-1.1-R-small."
        )
    unknown = sorted(set(config) - accepted)
    if unknown or "distr_output" not in config:
        raise CheckpointError(
            f"{source} is not a Moirai 1.x checkpoint (config.json fields {unknown} unknown to "
            "MoiraiModule, distr_output "
            f"{'present' if 'distr_output' in config else 'missing'}; Moirai-MoE has d_ff). "
            "model=moirai loads checkpoints such as Salesforce/moirai-1.1-R-small."
        )
    check_config(config, SCHEMA, f"{source}/config.json")
    fields = {name: _plain_field(source, name, value) for name, value in config.items()}
    fields["distr_output"] = distribution_output(source, config["distr_output"])
    fields["patch_sizes"] = tuple(config["patch_sizes"])
    return fields


def _plain_field(source: str, name: str, value: Any) -> Any:
    """A config.json architecture field: a number, a bool or a list of ints (the
    distribution is read apart, by :func:`distribution_output`)."""
    plain = isinstance(value, (bool, int, float)) or (
        isinstance(value, list)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )
    if name != "distr_output" and not plain:
        raise CheckpointError(
            f"{source}/config.json field {name!r} is {value!r}: Moirai's architecture fields are "
            "numbers, booleans or lists of integers. Re-export the checkpoint."
        )
    return value


#: the uni2ts distribution outputs a Moirai config.json may name (its ``_target_``, as uni2ts'
#: ``encode_distr_output`` writes it) -> their arguments, all plain numbers except a mixture's
#: ``components``
DISTRIBUTION_OUTPUTS: dict[str, tuple[str, ...]] = {
    "uni2ts.distribution.mixture.MixtureOutput": ("components",),
    "uni2ts.distribution.student_t.StudentTOutput": (),
    "uni2ts.distribution.normal.NormalOutput": (),
    "uni2ts.distribution.normal.NormalFixedScaleOutput": ("scale",),
    "uni2ts.distribution.negative_binomial.NegativeBinomialOutput": (),
    "uni2ts.distribution.log_normal.LogNormalOutput": (),
    "uni2ts.distribution.laplace.LaplaceOutput": (),
    "uni2ts.distribution.laplace.LaplaceFixedScaleOutput": ("scale",),
    "uni2ts.distribution.pareto.ParetoOutput": (),
    "uni2ts.distribution.pareto.ParetoFixedAlphaOutput": ("alpha",),
}


def distribution_output(source: str, spec: Any):
    """The uni2ts ``DistributionOutput`` a config.json's ``distr_output`` describes, built from
    :data:`DISTRIBUTION_OUTPUTS` by name with plain-number arguments.

    uni2ts' own decoder hands the spec to Hydra's ``instantiate``, which calls any
    ``uni2ts.*`` target with any arguments, nested calls included: a shared checkpoint could run
    code through it. Here nothing is instantiated from the file; an unknown target or argument
    is refused by name."""
    import uni2ts.distribution as outputs

    if not isinstance(spec, Mapping) or spec.get("_target_") not in DISTRIBUTION_OUTPUTS:
        target = spec.get("_target_") if isinstance(spec, Mapping) else spec
        raise CheckpointError(
            f"{source}/config.json names distr_output {target!r}, which isoprobe does not "
            f"build: a Moirai distribution is one of {sorted(DISTRIBUTION_OUTPUTS)}. Nothing "
            "else is instantiated from a checkpoint's config."
        )
    target = spec["_target_"]
    arguments = {key: value for key, value in spec.items() if key != "_target_"}
    unknown = sorted(set(arguments) - set(DISTRIBUTION_OUTPUTS[target]))
    if unknown:
        raise CheckpointError(
            f"{source}/config.json gives {target} the arguments {unknown}, which it does not "
            f"take (it takes {list(DISTRIBUTION_OUTPUTS[target]) or 'none'})."
        )
    output_class = getattr(outputs, target.rsplit(".", 1)[1])
    if "components" in arguments:
        components = arguments["components"]
        if not isinstance(components, list) or not components:
            raise CheckpointError(
                f"{source}/config.json: {target}'s components must be a non-empty list"
            )
        return output_class([distribution_output(source, c) for c in components])
    for key, value in arguments.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CheckpointError(
                f"{source}/config.json gives {target} {key}={value!r}: it must be a number."
            )
    return output_class(**arguments)


def load_moirai(resolved: ResolvedCheckpoint, scratch: Mapping[str, Any] | None) -> MoiraiModule:
    MoiraiModule, _ = import_uni2ts()
    if resolved.kind == "scratch":
        shape = scratch_shape(scratch)
        fields = {**shape, "patch_sizes": tuple(shape["patch_sizes"])}
        return MoiraiModule(distr_output=official_mixture(), **fields)
    source = resolved.location
    config = read_json_config(Path(_fetch(resolved, CONFIG_NAME)))
    module = MoiraiModule(**_module_fields(source, config))
    weights = read_safetensors(Path(_fetch(resolved, WEIGHTS_NAME)))
    _check_weights(source, module.state_dict(), weights)
    module.load_state_dict({name: tensor.float() for name, tensor in weights.items()})
    return module.train()


def _check_weights(source: str, expected: Mapping[str, Tensor], found: Mapping[str, Tensor]):
    """Refuse weights that do not fit the config, naming the first tensor that differs."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"the weights in {source} do not match its config.json: {len(missing)} tensors "
            f"missing (e.g. {missing[:3]}), {len(unexpected)} unexpected (e.g. "
            f"{unexpected[:3]}). The config was edited or belongs to another checkpoint; "
            "re-export the model."
        )
    for name, tensor in expected.items():
        if tuple(found[name].shape) != tuple(tensor.shape):
            raise CheckpointError(
                f"the weights in {source} do not fit its config.json: {name} has shape "
                f"{tuple(found[name].shape)} in the checkpoint but {tuple(tensor.shape)} in the "
                "model. The config was edited or belongs to another checkpoint; re-export it."
            )
