"""What fine-tuning trains: ``model.adapt`` (:data:`ADAPT_CHOICES`).

- ``full``: every parameter (the default; the model as it was built).
- ``lora``: low-rank adapters (``peft``'s LoRA) on the layers the model's
  :meth:`~isoprobe.models.base.ForecastModule.lora_target_modules` names (the self-attention
  projections of ``model.lora.projections``; with ``model.lora.mlp`` also the feed-forward
  layers); only the adapters train, every weight of the model stays as it was.
- ``frozen_backbone``: the input layers (:meth:`input_modules`) and the head
  (:meth:`head_modules`) train; every block stays as it was.
- ``head_only``: only the head trains.

What a strategy freezes (:func:`frozen_module_paths`: every largest submodule that holds
parameters, none of which trains) stays in eval mode for the whole fit, whatever
``model.train()`` is called with (:meth:`~isoprobe.models.base.ForecastModule.train`): its
buffers (BatchNorm's running statistics) stay as they were and its dropout is off, so a frozen
layer computes in training exactly what it computes when probed.

An adapted projection's ``weight`` is what it applies, ``W + (alpha / r) B A`` (the adapters
merged on the fly, :class:`EffectiveLoraLinear`), so ``attention_weights()`` and the rank
probes read the matrices the model computes with; the forward pass keeps LoRA's own
``x W^T + (alpha / r) x A^T B^T``. :func:`merged_export` writes the official format with the
adapters merged into the weights. Checkpoints hold the adapters as ordinary tensors
(``...lora_A.default.weight``), read with ``weights_only=True`` like every other.
"""

from __future__ import annotations

import copy
import hashlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from peft import LoraConfig, inject_adapter_in_model
from peft.tuners.lora import Linear as LoraLinear
from torch import Tensor, nn

from isoprobe.models.base import ATTENTION_PROJECTIONS, ForecastModule
from isoprobe.models.compression import set_module

ADAPT_CHOICES = ("full", "lora", "frozen_backbone", "head_only")


class EffectiveLoraLinear(LoraLinear):
    """peft's LoRA linear layer whose ``weight`` is the matrix it applies: the base weight plus
    the active adapters' ``(alpha / r) B A`` (the base weight alone when they are merged or
    disabled). A computed tensor, not a parameter: readers (rank probes) see the adapted
    projection; the parameters stay ``base_layer.weight`` and ``lora_A``/``lora_B``."""

    @property
    def weight(self) -> Tensor:
        base = self.get_base_layer().weight
        if self.merged or self.disable_adapters:
            return base
        active = [a for a in self.active_adapters if a in self.lora_A]
        return base + sum(self.get_delta_weight(a) for a in active) if active else base


def check_adapt(adapt: str, lora: dict | None = None) -> None:
    """Refuse an unknown strategy or LoRA projection, naming the choices."""
    if adapt not in ADAPT_CHOICES:
        raise ValueError(f"model.adapt must be one of {list(ADAPT_CHOICES)}, got {adapt!r}")
    projections = (lora or {}).get("projections")
    if adapt == "lora" and (not projections or set(projections) - set(ATTENTION_PROJECTIONS)):
        raise ValueError(
            f"model.lora.projections must be a non-empty subset of "
            f"{list(ATTENTION_PROJECTIONS)}, got {projections!r}"
        )


def check_adapt_needs_weights(
    task: str, training: bool, model: Mapping[str, Any], ckpt_path: str | None
) -> None:
    """Refuse to adapt (``model.adapt`` other than full in a training ``task``) or to compress
    (``task=compress``) weights that are random: ``model.checkpoint=scratch`` with no
    ``ckpt_path`` to load trained ones from (compression reads the model as built, so a
    ``ckpt_path`` does not help it), unless ``model.allow_random_weights`` says it is meant (a
    random-features baseline, a test of the mechanics). Reads the settings only, so it runs
    before any weights load."""
    if model.get("checkpoint") != "scratch" or model.get("allow_random_weights"):
        return
    adapt = model.get("adapt", "full")
    load = "load trained weights with model.checkpoint=bundled (or auto, a directory or a hub id)"
    if task == "compress":
        raise ValueError(
            "task=compress with model.checkpoint=scratch would compress randomly initialised "
            f"weights: {load}, or add model.allow_random_weights=true to compress random "
            "weights on purpose"
        )
    if training and adapt != "full" and not ckpt_path:
        raise ValueError(
            f"model.adapt={adapt} with model.checkpoint=scratch would train "
            f"{_TRAINS[adapt]} of a randomly initialised model and keep the rest random: {load}, "
            "train every weight with model.adapt=full, or add model.allow_random_weights=true "
            "to adapt random weights on purpose (a random-features baseline)"
        )


#: what each strategy but ``full`` trains, as the refusal of random weights words it
_TRAINS = {
    "lora": "low-rank adapters",
    "frozen_backbone": "the input layers and the head",
    "head_only": "the head",
}


def module_paths(model: nn.Module, modules: Sequence[nn.Module]) -> list[str]:
    """The paths in ``model`` of ``modules`` (each once, in the model's order)."""
    wanted = {id(m) for m in modules}
    return [name for name, m in model.named_modules() if id(m) in wanted]


def frozen_module_paths(model: nn.Module) -> list[str]:
    """The paths of the largest submodules of ``model`` that hold parameters, none of which
    requires a gradient (a module without parameters, such as a dropout, belongs to the module
    it sits in)."""
    paths: list[str] = []

    def visit(path: str, module: nn.Module) -> None:
        parameters = list(module.parameters())
        if parameters and not any(p.requires_grad for p in parameters):
            paths.append(path)
            return
        for name, child in module.named_children():
            visit(f"{path}.{name}" if path else name, child)

    visit("", model)
    return paths


def adapt_model(model: ForecastModule, adapt: str, lora: dict | None = None) -> None:
    """Make only what ``adapt`` trains trainable, in place (``lora``: ``model.lora``, with
    ``r``, ``alpha``, ``dropout``, ``projections`` and ``mlp``), and keep what it freezes in
    eval mode (module docstring)."""
    check_adapt(adapt, lora)
    if adapt == "full":
        return
    _freeze(model, adapt, lora or {})
    model.frozen_modules = tuple(model.get_submodule(p) for p in frozen_module_paths(model))
    model.train(model.training)


@contextmanager
def frozen_modules_expected(model: ForecastModule) -> Iterator[None]:
    """Within the block (a fit), Lightning's warning that modules are in eval mode at the start
    of training is not shown for a model whose ``model.adapt`` froze modules: those are in eval
    mode on purpose (module docstring)."""
    with warnings.catch_warnings():
        if model.frozen_modules:
            warnings.filterwarnings("ignore", r"Found \d+ module\(s\) in eval mode at the start")
        yield


def _freeze(model: ForecastModule, adapt: str, lora: dict) -> None:
    if adapt == "lora":
        if model.compression:
            raise ValueError(
                "model.adapt=lora puts adapters on dense attention projections, but this "
                "model's are factored (model.low_rank.enabled or a compressed checkpoint): "
                "fine-tune it with model.adapt=full, frozen_backbone or head_only"
            )
        _inject_lora(model, lora)
        return
    modules = model.head_modules()
    if adapt == "frozen_backbone":
        modules = [*model.input_modules(), *modules]
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    for module in modules:
        for parameter in module.parameters():
            parameter.requires_grad_(True)


def lora_config(model: ForecastModule, lora: dict) -> LoraConfig:
    """The ``peft`` LoRA configuration of ``model.lora`` for ``model``: its target layers by
    their full paths, rank ``r``, ``lora_alpha`` = ``alpha``, ``lora_dropout`` = ``dropout``."""
    targets = model.lora_target_modules(tuple(lora["projections"]), bool(lora.get("mlp")))
    return LoraConfig(
        r=int(lora["r"]),
        lora_alpha=float(lora["alpha"]),
        lora_dropout=float(lora["dropout"]),
        target_modules=module_paths(model, targets),
    )


def lora_seed(run_seed: int) -> int:
    """The seed of the adapters' initialisation: derived from the run's, and a stream apart from
    it (a hash, so that no run seed's own stream is another's adapter stream)."""
    digest = hashlib.blake2b(f"isoprobe lora {run_seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _inject_lora(model: ForecastModule, lora: dict) -> None:
    """peft's adapters on the target layers. peft draws each ``A`` at random (Kaiming-uniform):
    here from a generator forked off the global one and seeded by :func:`lora_seed` of the seed
    the run gave torch (``torch.initial_seed()``: ``seed_everything(cfg.seed)``), so the adapters
    depend on the run seed alone, and the global stream, which the zero-shot forecast samples
    next, is left where the other strategies leave it: a strategy does not change its baseline."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(lora_seed(torch.initial_seed()))
        inject_adapter_in_model(lora_config(model, lora), model)
    model.__dict__.pop("peft_config", None)  # peft's record of the config; the run's config has it
    for module in model.modules():
        if type(module) is LoraLinear:
            module.__class__ = EffectiveLoraLinear
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(".lora_" in name)


def lora_layers(model: nn.Module) -> dict[str, EffectiveLoraLinear]:
    """Path -> every LoRA-adapted layer of ``model``."""
    return {n: m for n, m in model.named_modules() if isinstance(m, EffectiveLoraLinear)}


def parameter_counts(model: nn.Module) -> dict[str, int]:
    """``trainable_parameters`` (those that require gradients) and ``total_parameters`` (every
    parameter, adapters included, a tied one once)."""
    parameters = list(model.parameters())
    return {
        "trainable_parameters": sum(p.numel() for p in parameters if p.requires_grad),
        "total_parameters": sum(p.numel() for p in parameters),
    }


@contextmanager
def adapters_merged(model: nn.Module) -> Iterator[None]:
    """Within the block every LoRA layer of ``model`` is replaced by its base layer holding the
    merged weight ``W + (alpha / r) B A``; afterwards the LoRA layers are back, untouched."""
    layers = lora_layers(model)
    for path, layer in layers.items():
        set_module(model, path, _merged_base(layer))
    try:
        yield
    finally:
        for path, layer in layers.items():
            set_module(model, path, layer)


def _merged_base(layer: EffectiveLoraLinear) -> nn.Module:
    base = copy.deepcopy(layer.get_base_layer())
    with torch.no_grad():
        base.weight.copy_(layer.weight)
    return base


def merged_export(model: ForecastModule, directory: str, dtype: str = "float32") -> None:
    """``model.export`` with the LoRA adapters merged into the weights (the official format,
    which loads without ``peft``); a model without adapters exports as it is."""
    with adapters_merged(model):
        model.export(directory, dtype)
