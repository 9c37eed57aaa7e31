"""The measure sets that run registered measures of the ``pair``, ``windows`` and ``weights``
kinds (:mod:`isoprobe.metrics.registry`): each hands its measures what their kind reads at one
probe time and turns what they return into rows. ``callbacks.probe.measures`` runs a
registered measure of one of these kinds by its name (:func:`registered_measure_set`); the
built-in sets (``cka``, ``readout``, ``rank``) are built on them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.utils.data import Dataset

from isoprobe.metrics.registry import (
    DRIFT,
    PAIR,
    WEIGHTS,
    WINDOWS,
    Measure,
    MetricInfo,
    describe_metric,
)
from isoprobe.models.base import ATTENTION_PROJECTIONS, cross_name
from isoprobe.probing.measure_set import MeasureSet, ProbeInputs
from isoprobe.probing.measurement import Measurement, Row

#: the metric of a row that says why a layer, a block or a projection was not measured
ERROR_METRIC = "error"
#: the metric of a row that says a weights measure does not apply to the model (no attention)
NOT_APPLICABLE = "not_applicable"
#: the layer of that row: the model's weights as a whole
WEIGHTS_LAYER = "weights"

describe_metric(NOT_APPLICABLE, MetricInfo(bookkeeping=True))


def token_groups(layers: Sequence[str]) -> dict[str, str]:
    """Layer -> the tokens it reads: its stack (``encoder``, ``decoder``), ``embed`` with the
    first stack probed after it (a stack's layers share their mask, hence their rows)."""
    stacks = [layer.split(".", 1)[0] for layer in layers]
    first = next((stack for stack in stacks if stack != "embed"), "embed")
    return {
        layer: first if stack == "embed" else stack
        for layer, stack in zip(layers, stacks, strict=True)
    }


def _output_of(measures: Sequence[tuple[Measure, Any]]) -> str:
    outputs = {measure.output for measure, _ in measures}
    if len(outputs) != 1:
        raise ValueError(f"one measure set writes to one output group, got {sorted(outputs)}")
    return outputs.pop()


class PairMeasures(MeasureSet):
    """Registered ``pair`` measures, each with its parameters: per probed layer, the layer's
    tokens paired as the measure's ``pairing`` says. ``drift`` pairs them with the same
    layer's tokens at step 0, which are kept (float32, in the checkpoint too, so a resumed run
    measures against the same reference); a run that did not probe step 0 has no drift rows.
    ``prev`` pairs them with the layer probed just before on the same tokens. A layer whose
    tokens the measure cannot prepare (too few, non-finite) has no rows here."""

    def __init__(self, measures: Sequence[tuple[Measure, Any]]) -> None:
        self.measures = list(measures)
        self.output = _output_of(self.measures)
        self._reference: dict[str, Tensor] = {}
        self._prepared_reference: dict[tuple[Callable | None, str], Any] = {}

    @property
    def keeps_reference(self) -> bool:
        return any(measure.pairing == DRIFT for measure, _ in self.measures)

    def measure(self, inputs: ProbeInputs) -> Measurement:
        return Measurement(self.rows(inputs, {}))

    def rows(self, inputs: ProbeInputs, prepared_now: dict[Callable | None, Any]) -> list[Row]:
        """The rows of one probe; ``prepared_now`` keeps the tokens as each ``prepare`` made
        them for the probe's other readers (:meth:`prepared`)."""
        tokens, when = inputs.tokens, inputs.when
        if self.keeps_reference and when.step == 0 and when.epoch == 0:
            self._reference = {
                layer: X.detach().float().cpu().clone() for layer, X in tokens.items()
            }
            self._prepared_reference = {}
        rows: list[Row] = []
        layers = list(tokens)
        groups = token_groups(layers)
        for measure, params in self.measures:
            prepared = self.prepared(measure, tokens, prepared_now)
            for i, layer in enumerate(layers):
                if layer not in prepared:
                    continue
                if measure.pairing == DRIFT:
                    partner = self._reference_of(measure, layer, tokens[layer])
                else:
                    before = layers[i - 1] if i else None
                    same = before is not None and groups[before] == groups[layer]
                    partner = prepared.get(before) if same else None
                if partner is not None:
                    values = measure(prepared[layer], partner, params=params)
                    rows += [Row(layer, key, value) for key, value in values.items()]
        return rows

    @staticmethod
    def prepared(
        measure: Measure, tokens: dict[str, Tensor], prepared_now: dict[Callable | None, Any]
    ) -> dict[str, Any]:
        """Layer -> its tokens as ``measure`` reads them, for the layers it can prepare, made
        once per probe (kept in ``prepared_now``) for all the measures that prepare them alike."""
        if measure.prepare not in prepared_now:
            out = prepared_now[measure.prepare] = {}
            for layer, X in tokens.items():
                try:
                    out[layer] = measure.prepared(X)
                except ValueError:
                    continue
        return prepared_now[measure.prepare]

    def _reference_of(self, measure: Measure, layer: str, X: Tensor) -> Any:
        """The layer's step-0 tokens prepared for ``measure`` (once per run), or None where
        there are none of the same shape."""
        reference = self._reference.get(layer)
        if reference is None or reference.shape != X.shape:
            return None
        key = (measure.prepare, layer)
        if key not in self._prepared_reference:
            try:
                self._prepared_reference[key] = measure.prepared(reference.to(X.device))
            except ValueError:
                self._prepared_reference[key] = None
        return self._prepared_reference[key]

    def state_dict(self) -> dict[str, Any]:
        return {"reference": dict(self._reference)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reference = dict(state.get("reference", {}))
        self._prepared_reference = {}


def scaled_horizon(context: Tensor, target: Tensor) -> Tensor:
    """``target`` [H] divided by the mean absolute observed value of ``context`` [C] (1 where
    that is 0 or nothing is observed), float64."""
    observed = context[torch.isfinite(context)].abs()
    scale = float(observed.mean()) if observed.numel() else 0.0
    return target.double() / (scale if scale > 0 else 1.0)


class WindowsMeasures(MeasureSet):
    """Registered ``windows`` measures, each with its parameters: per probed layer, each probe
    window's mean real token [W, D] and the window's horizon scaled by the mean absolute
    observed value of its context [W, H] (the mean scaling of Chronos, so that windows of
    different levels are comparable), float64 in probe-set order. A measure that raises a
    ValueError (too few usable windows) gives NaN rows for its keys with the reason."""

    pools_windows = True

    def __init__(self, measures: Sequence[tuple[Measure, Any]]) -> None:
        self.measures = list(measures)
        self.output = _output_of(self.measures)
        self._targets: tuple[tuple[int, ...], Tensor] | None = None

    def targets(self, dataset: Dataset, windows: Sequence[int]) -> Tensor:
        """[windows, H] scaled horizons of the probe set (read once: the set is fixed)."""
        key = tuple(windows)
        if self._targets is None or self._targets[0] != key:
            items = [dataset[i] for i in key]
            horizons = [scaled_horizon(item["context"], item["target"]) for item in items]
            self._targets = (key, torch.stack(horizons))
        return self._targets[1]

    def measure(self, inputs: ProbeInputs) -> Measurement:
        return Measurement(
            self.rows(inputs.window_means, self.targets(inputs.dataset, inputs.windows))
        )

    def rows(self, window_means: dict[str, Tensor], targets: Tensor) -> list[Row]:
        """The rows of every layer of ``window_means`` against ``targets``."""
        rows: list[Row] = []
        for layer, pooled in window_means.items():
            features = pooled.double().cpu()
            for measure, params in self.measures:
                try:
                    values = measure(features, targets, params=params)
                except ValueError as err:
                    rows += [Row(layer, key, math.nan, str(err)) for key in measure.keys]
                    continue
                rows += [Row(layer, key, value) for key, value in values.items()]
        return rows


class WeightsMeasures(MeasureSet):
    """Registered ``weights`` measures, each with its parameters: per attention block, its
    projections q, k, v, o (the model's ``attention_weights()``; a decoder block's
    cross-attention, ``cross_attention_weights()``, as block ``<block>.cross``). A projection
    the measure cannot prepare (non-finite entries, an SVD that does not converge) gets an
    ``error`` row naming it and is left out; a probe never stops a run. A model without
    attention (``attends`` false: recurrent blocks) gets one ``not_applicable`` row per measure
    and probe, its note naming the measure and the model."""

    reads_tokens = False

    def __init__(self, measures: Sequence[tuple[Measure, Any]]) -> None:
        self.measures = list(measures)
        self.output = _output_of(self.measures)

    def measure(self, inputs: ProbeInputs) -> Measurement:
        rows: list[Row] = []
        for measure, params in self.measures:
            if not getattr(inputs.model, "attends", True):
                rows.append(not_applicable(measure, inputs.model))
                continue
            prepared = prepared_projections(measure, inputs.model, inputs.when.title, rows)
            for block, projections in prepared.items():
                values = measure(projections, params=params)
                rows += [Row(block, key, value) for key, value in values.items()]
        return Measurement(rows)


def not_applicable(measure: Measure, model: LightningModule) -> Row:
    """The row that says ``measure`` of attention weights does not apply to ``model``."""
    note = (
        f"{measure.name} does not apply to {type(model).__name__}: its blocks are recurrent, "
        "with no attention projections"
    )
    return Row(WEIGHTS_LAYER, NOT_APPLICABLE, math.nan, note)


def prepared_projections(
    measure: Measure, model: LightningModule, when: str, rows: list[Row]
) -> dict[str, dict[str, Any]]:
    """Block -> projection -> its matrix as ``measure`` reads it, self-attention then
    cross-attention (``<block>.cross``); a matrix it cannot prepare gets an ``error`` row in
    ``rows`` (layer ``<block>.<p>``) and is left out."""
    self_attention = model.attention_weights()
    # a module written before cross_attention_weights() joined the contract has none
    cross = getattr(model, "cross_attention_weights", dict)()
    named = list(self_attention.items())
    named += [(cross_name(block), projections) for block, projections in cross.items()]
    out: dict[str, dict[str, Any]] = {}
    with torch.no_grad():
        for block, projections in named:
            out[block] = {}
            for p in ATTENTION_PROJECTIONS:
                matrix = projections[p].detach()
                reason = _unpreparable(measure, matrix, f"{block}'s {p} projection")
                if isinstance(reason, str):
                    rank_zero_warn(f"{measure.name}: {block}.{p} at {when} not measured: {reason}")
                    rows.append(Row(f"{block}.{p}", ERROR_METRIC, math.nan, reason))
                else:
                    out[block][p] = reason[0]
    return out


def _unpreparable(measure: Measure, matrix: Tensor, what: str) -> str | tuple[Any]:
    """Why ``matrix`` cannot be prepared (a sentence), else a 1-tuple of it prepared."""
    non_finite = int((~torch.isfinite(matrix)).sum())
    if non_finite:
        return f"{non_finite} of {matrix.numel()} entries of {what} are NaN or inf"
    try:
        return (measure.prepared(matrix),)
    except (torch.linalg.LinAlgError, ValueError) as err:
        return f"preparing {what} failed: {err}"


#: kind -> the measure set that runs a registered measure of that kind by its name
RUNNERS: dict[str, type[MeasureSet]] = {
    PAIR: PairMeasures,
    WINDOWS: WindowsMeasures,
    WEIGHTS: WeightsMeasures,
}


def registered_measure_set(measure: Measure, params: Any) -> MeasureSet:
    """The measure set that runs the registered ``measure`` with ``params`` on its own."""
    if measure.kind not in RUNNERS:
        raise ValueError(
            f"callbacks.probe.measures: {measure.name!r} is a {measure.kind} measure, which "
            "runs in the isotropy measures: choose it with "
            "callbacks.probe.isotropy.metrics.metrics"
        )
    return RUNNERS[measure.kind]([(measure, params)])
