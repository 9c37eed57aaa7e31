"""Model against model in task=analyze, on a constructed study whose runs' saved window means
are known: CKA 1 of a run against a copy of itself, the same CKA against an orthogonal transform
times a scale of a run as against the run (end to end through the files), windows matched by
their (series, forecast origin) whatever their order, and no value, with a note, where there is
none to give."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from isoprobe.analysis import figures
from isoprobe.analysis.model_similarity import (
    MIN_WINDOWS,
    best_match,
    model_pair_matrices,
    model_similarity,
)
from isoprobe.analysis.model_similarity_report import pair_line
from isoprobe.analysis.study import AnalysisError, load_study
from isoprobe.metrics import reference
from isoprobe.probing.window_means import DIRECTORY, FILES, write_window_means
from tests.analysis.probed_runs import analyse, probed_run

LAYERS = ("embed", "encoder.0", "encoder.1")
#: (series, forecast origin) of the 12 windows every constructed run saved
WINDOWS = [(s, o) for s in range(3) for o in (100, 110, 120, 130)]


def _means(seed: int, n: int = len(WINDOWS)) -> dict[str, torch.Tensor]:
    """Layer -> [n, width] window means: each layer a noisy map of the one before."""
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 6, generator=gen)
    means = {}
    for width, layer in zip((6, 10, 8), LAYERS, strict=True):
        X = torch.tanh(X @ torch.randn(X.shape[1], width, generator=gen)) + 0.3 * torch.randn(
            n, width, generator=gen
        )
        means[layer] = X
    return means


def _save(run: Path, means: dict, windows: list[tuple[int, int]], epochs=(0, 2)) -> None:
    series = torch.tensor([s for s, _ in windows])
    origin = torch.tensor([o for _, o in windows])
    for kind, epoch in zip(("epoch0", "last"), epochs, strict=True):
        write_window_means(run / DIRECTORY / FILES[kind], means, series, origin, epoch)


def _run(root: Path, name: str, model: str, dataset: str = "etth1", seed: int = 0) -> Path:
    return probed_run(
        root / name,
        model,
        dataset,
        blocks=2,
        epochs=2,
        rng=np.random.default_rng(seed),
        overrides=(f"model={model}",),
    )


def _rotated_and_scaled(means: dict, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for layer, X in means.items():
        Q, _ = torch.linalg.qr(torch.randn(X.shape[1], X.shape[1], generator=gen))
        out[layer] = 7.5 * X @ Q
    return out


def _matrix(table: pd.DataFrame, run_a: str, run_b: str, kind: str) -> pd.DataFrame:
    part = table[(table.run_a == run_a) & (table.run_b == run_b) & (table.epoch_kind == kind)]
    return part.pivot(index="layer_a", columns="layer_b", values="cka").loc[LAYERS, LAYERS]


def test_a_copy_gives_cka_1_and_a_rotated_scaled_copy_the_same_cka_as_the_run(tmp_path):
    root = tmp_path / "sweep"
    means = _means(0)
    _save(_run(root, "a", "alpha"), means, WINDOWS)
    shutil.copytree(root / "a" / DIRECTORY, _run(root, "b", "alpha") / DIRECTORY)
    _save(_run(root, "c", "beta"), _rotated_and_scaled(means, 1), WINDOWS)
    table = model_similarity(load_study([str(root)]))

    assert set(zip(table.run_a, table.run_b, strict=True)) == {("a", "b"), ("a", "c"), ("b", "c")}
    assert (table.n_windows == len(WINDOWS)).all() and (table.note == "").all()
    for kind in ("epoch0", "last"):
        copy = _matrix(table, "a", "b", kind)
        np.testing.assert_allclose(np.diag(copy), 1.0, rtol=0, atol=1e-12)
        # the independent Gram-matrix definition of debiased CKA, on the saved float32 means
        for la in LAYERS:
            for lb in LAYERS:
                expected = reference.linear_cka(
                    means[la].double().numpy(), means[lb].double().numpy(), debiased=True
                )
                assert copy.loc[la, lb] == pytest.approx(expected, abs=1e-9)
        # CKA is invariant to an orthogonal map and an isotropic scale: end to end through the
        # files, a run against the transformed run is the run against itself
        rotated = _matrix(table, "a", "c", kind)
        np.testing.assert_allclose(rotated.to_numpy(), copy.to_numpy(), rtol=1e-5, atol=1e-6)


def test_windows_are_matched_by_series_and_origin_whatever_their_order(tmp_path):
    root = tmp_path / "sweep"
    means = _means(3)
    _save(_run(root, "a", "alpha"), means, WINDOWS)
    # b saved 9 of a's windows, in another order, and 2 windows a did not save
    order = [11, 0, 7, 3, 5, 9, 1, 10, 4]
    b_windows = [WINDOWS[i] for i in order] + [(5, 100), (0, 105)]
    b_means = {
        layer: torch.cat([X[order], torch.randn(2, X.shape[1])]) for layer, X in means.items()
    }
    b_means = _rotated_and_scaled(b_means, 4)
    _save(_run(root, "b", "beta"), b_means, b_windows)
    table = model_similarity(load_study([str(root)]))

    assert (table.n_windows == 9).all()
    shared = sorted(order)  # a's order
    for kind in ("epoch0", "last"):
        found = _matrix(table, "a", "b", kind)
        for la in LAYERS:
            for lb in LAYERS:
                expected = reference.linear_cka(
                    means[la][shared].double().numpy(),
                    means[lb][shared].double().numpy(),
                    debiased=True,
                )
                assert found.loc[la, lb] == pytest.approx(expected, abs=1e-5)


def test_too_few_or_no_shared_windows_give_no_value_and_say_why(tmp_path):
    root = tmp_path / "sweep"
    _save(_run(root, "a", "alpha"), _means(0), WINDOWS)
    # 7 of a's windows: one fewer than the minimum
    _save(_run(root, "b", "beta"), _means(1, 7), WINDOWS[:7])
    # none of a's windows (another series)
    _save(_run(root, "c", "gamma"), _means(2), [(9 + s, o) for s, o in WINDOWS])
    # another data set: not a pair at all
    _save(_run(root, "d", "alpha", dataset="weather"), _means(0), WINDOWS)
    table = model_similarity(load_study([str(root)]))

    pairs = table.set_index(["run_a", "run_b", "epoch_kind"])
    assert sorted(set(pairs.index.droplevel(2))) == [("a", "b"), ("a", "c"), ("b", "c")]
    assert table["cka"].isna().all()
    assert len(table) == 6  # one row per pair and epoch kind, no layer rows
    assert pairs.loc[("a", "b", "last"), "note"] == (
        f"7 shared windows (series, forecast origin), fewer than {MIN_WINDOWS}"
    )
    assert pairs.loc[("a", "c", "epoch0"), "note"].startswith("0 shared windows")
    assert model_pair_matrices(table, load_study([str(root)]).runs) == []


def test_a_constant_layer_or_windows_without_tokens_give_no_value_for_those_layers(tmp_path):
    root = tmp_path / "sweep"
    means = _means(0)
    _save(_run(root, "a", "alpha"), means, WINDOWS)
    other = _means(5)
    other["encoder.0"] = torch.ones_like(other["encoder.0"])  # no spread
    other["encoder.1"][:5] = float("nan")  # 5 windows without a real token: 7 left
    _save(_run(root, "b", "beta"), other, WINDOWS)
    table = model_similarity(load_study([str(root)])).set_index(
        ["epoch_kind", "layer_a", "layer_b"]
    )
    last = table.loc["last"]

    assert last.loc[("embed", "embed"), "cka"] == pytest.approx(
        reference.linear_cka(
            means["embed"].double().numpy(), other["embed"].double().numpy(), debiased=True
        ),
        abs=1e-9,
    )
    constant = last.xs("encoder.0", level="layer_b")
    assert constant["cka"].isna().all()
    assert constant["note"].str.contains("without spread").all()
    tokenless = last.xs("encoder.1", level="layer_b")
    assert tokenless["cka"].isna().all() and (tokenless["n_windows"] == 7).all()
    assert tokenless["note"].str.startswith("7 shared windows with a real token").all()


def test_an_unreadable_file_leaves_a_note_on_that_runs_pairs_and_the_analysis_goes_on(tmp_path):
    root = tmp_path / "sweep"
    for name, model in (("a", "alpha"), ("b", "beta"), ("c", "gamma")):
        _save(_run(root, name, model), _means(ord(name)), WINDOWS)
    bad = root / "c" / DIRECTORY / FILES["last"]
    bad.write_bytes(b"\x80\x04not safetensors at all")
    out = analyse(root, tmp_path / "analysis")

    table = pd.read_csv(out / "model_similarity.csv", keep_default_na=False, na_values=[""])
    with_c = table[(table.run_b == "c") & (table.epoch_kind == "last")]
    assert len(with_c) == 2 and with_c["cka"].isna().all()
    assert with_c["note"].str.contains(f"{bad} is not a safetensors file").all()
    # everything else has its values, 3 x 3 layers a pair: a with b at both kinds, a with c and
    # b with c at epoch 0
    defined = table[table.cka.notna()]
    assert len(defined) == 9 * (2 + 1 + 1)
    # one heatmap per pair of models (three models, three pairs), and the report's section
    assert sorted(p.name for p in (out / "model_similarity").glob("*.png")) == [
        "pair0.png",
        "pair1.png",
        "pair2.png",
    ]
    page = (out / "report.html").read_text()
    assert "Model against model" in page
    assert page.count("alpha against beta (1 run pair): the layer of beta closest to alpha's") == 1
    assert "is not a safetensors file" in page


def test_a_minimum_below_what_debiased_cka_needs_is_refused(tmp_path):
    root = tmp_path / "sweep"
    _save(_run(root, "a", "alpha"), _means(0), WINDOWS)
    with pytest.raises(AnalysisError, match="min_shared_windows=3: debiased CKA needs at least 4"):
        model_similarity(load_study([str(root)]), min_windows=3)


def _independent(seed: int, n: int) -> dict[str, torch.Tensor]:
    """Layer -> [n, width] Gaussian window means, independent of every other seed's."""
    gen = torch.Generator().manual_seed(seed)
    return {
        layer: torch.randn(n, w, generator=gen) for layer, w in zip(LAYERS, (6, 10, 8), strict=True)
    }


def test_a_rotated_copy_names_the_matching_layer_above_the_noise_floor(tmp_path):
    root = tmp_path / "sweep"
    means = _means(0)
    _save(_run(root, "a", "alpha"), means, WINDOWS)
    _save(_run(root, "b", "beta"), _rotated_and_scaled(means, 1), WINDOWS)
    study = load_study([str(root)])
    table = model_similarity(study)
    (pair,) = model_pair_matrices(table, study.runs)

    assert table["noise_floor"].notna().all() and (table["noise_floor"] < 0.5).all()
    for kind in ("epoch0", "last"):
        last, closest, value = best_match(pair, kind)
        assert (last, closest) == ("encoder.1", "encoder.1") and value == pytest.approx(1.0)
        assert pair.floors[kind] == pytest.approx(table["noise_floor"].iloc[0])


@pytest.mark.parametrize("seed", range(3))
def test_independent_representations_name_no_closest_layer(tmp_path, seed):
    root = tmp_path / "sweep"
    windows = [(s, o) for s in range(6) for o in (100, 110, 120, 130, 140, 150)]
    _save(_run(root, "a", "alpha"), _independent(2 * seed, len(windows)), windows)
    _save(_run(root, "b", "beta"), _independent(2 * seed + 1, len(windows)), windows)
    study = load_study([str(root)])
    (pair,) = model_pair_matrices(model_similarity(study), study.runs)

    for kind in ("epoch0", "last"):
        assert np.isfinite(pair.floors[kind]) and pair.matrices[kind].notna().all().all()
        assert best_match(pair, kind) is None


def test_a_zero_shot_pair_is_one_panel_and_one_reading(tmp_path, monkeypatch):
    root = tmp_path / "sweep"
    means = _means(0)
    _save(_run(root, "a", "alpha"), means, WINDOWS, epochs=(0, 0))
    _save(_run(root, "b", "beta"), _rotated_and_scaled(means, 1), WINDOWS, epochs=(0, 0))
    _save(_run(root, "c", "gamma"), _means(2), WINDOWS, epochs=(0, 3))
    study = load_study([str(root)])
    pairs = {
        (p.model_a, p.model_b): p for p in model_pair_matrices(model_similarity(study), study.runs)
    }
    kept: list = []
    monkeypatch.setattr(figures.plt, "close", kept.append)

    zero_shot, trained = pairs[("alpha", "beta")], pairs[("alpha", "gamma")]
    assert zero_shot.zero_shot and zero_shot.distinct_kinds() == ["epoch0"]
    assert not trained.zero_shot and trained.distinct_kinds() == ["epoch0", "last"]
    figures.model_pair(zero_shot, tmp_path / "zero.png")
    figures.model_pair(trained, tmp_path / "trained.png")
    panels = [[ax for ax in fig.axes if ax.images] for fig in kept]
    assert [len(p) for p in panels] == [1, 2]
    assert panels[0][0].get_title().startswith(figures.ZERO_SHOT_TITLE)
    line = str(pair_line(zero_shot))
    assert line.count("zero-shot: encoder.1 (CKA 1.000") == 1 and "last probe" not in line


def test_a_run_without_window_means_gets_rows_without_value_and_a_report_line(tmp_path):
    root = tmp_path / "sweep"
    _save(_run(root, "a", "alpha"), _means(0), WINDOWS)
    _save(_run(root, "b", "beta"), _means(1), WINDOWS)
    _run(root, "c", "gamma")  # probed, but saved no window means
    out = analyse(root, tmp_path / "analysis")

    table = pd.read_csv(out / "model_similarity.csv", keep_default_na=False, na_values=[""])
    with_c = table[(table.run_a == "c") | (table.run_b == "c")]
    assert len(with_c) == 4  # against a and b, at both epoch kinds
    assert with_c["cka"].isna().all()
    assert with_c["note"].str.contains("the run saved no window means").all()
    assert "the run saved no window means" in (out / "report.html").read_text()


def test_windows_holding_nan_or_inf_are_left_out_with_a_note(tmp_path):
    root = tmp_path / "sweep"
    means, other = _means(0), _means(5)
    other["encoder.0"][[1, 4]] = float("inf")
    other["encoder.0"][7, 0] = float("nan")
    _save(_run(root, "a", "alpha"), means, WINDOWS)
    _save(_run(root, "b", "beta"), other, WINDOWS)
    out = analyse(root, tmp_path / "analysis")

    table = pd.read_csv(out / "model_similarity.csv", keep_default_na=False, na_values=[""])
    hit = table[table.layer_b == "encoder.0"]
    assert hit["cka"].notna().all() and (hit["n_windows"] == 9).all()
    note = "3 of 12 shared windows left out: their mean holds NaN or inf (3 in run b)"
    assert (hit["note"] == note).all()
    assert table.loc[table.layer_b != "encoder.0", "note"].isna().all()  # empty in the CSV
    page = (out / "report.html").read_text()
    assert f"{note}: {len(hit)} rows" in page
