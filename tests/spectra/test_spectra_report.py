"""Figure 2 and its page at the size of the experiment (twelve systems): a colour per system,
the legend off the panels, weights drawn at random said so, panels b and c on symmetric log axes,
and the page saying whether the numbers reproduce the paper's claim."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import torch
from matplotlib.colors import to_hex

from isoprobe.spectra import report
from isoprobe.spectra.claim import claim_statement
from isoprobe.spectra.spectrum import embedding_spectrum

TIME_SERIES = ["chronos", "chronos_bolt", "chronos2", "timesfm", "moirai", "patchtst"]
TIME_SERIES += ["lag_llama", "time_moe", "visionts", "totem"]


def _system(rank: int, width: int = 64, seed: int = 0):
    """An embedded-input matrix of ``rank`` strong directions and a faint rest, a few rows
    far out (as white noise's are)."""
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(400, rank, generator=gen) @ torch.randn(rank, width, generator=gen)
    X += 1e-4 * torch.randn(400, width, generator=gen)
    X[:10] *= 200
    return embedding_spectrum(X)


def _full_rank(seed: int, width: int = 64):
    """Gaussian tokens: every direction as strong as the others (ε-rank = width at ε ≤ 0.1)."""
    return embedding_spectrum(
        torch.randn(400, width, generator=torch.Generator().manual_seed(seed))
    )


@pytest.fixture
def systems():
    spectra = {name: _system(8 + i, seed=i) for i, name in enumerate(TIME_SERIES)}
    spectra["t5"], spectra["vit"] = _full_rank(20), _full_rank(21)
    modalities = {name: "time series" for name in TIME_SERIES} | {"t5": "text", "vit": "image"}
    sources = {name: "bundled:x" for name in TIME_SERIES} | {"t5": "scratch", "vit": "scratch"}
    sources["totem"] = "scratch"
    labels = {"chronos": ["white noise" if i < 10 else "sine" for i in range(400)]}
    return spectra, modalities, sources, labels


def test_every_system_has_its_own_colour_and_the_legend_lies_off_the_panels(
    systems, tmp_path, monkeypatch
):
    spectra, modalities, sources, labels = systems
    kept: list = []
    monkeypatch.setattr(report.plt, "close", kept.append)
    report.draw_figure(spectra, modalities, sources, ["chronos", "t5"], labels, tmp_path / "f.png")
    (fig,) = kept
    panel_a, panel_b, panel_c = fig.axes
    colours = [to_hex(line.get_color()) for line in panel_a.lines]
    assert len(set(colours)) == len(spectra) == 12
    (legend,) = fig.legends
    fig.canvas.draw()
    box = legend.get_window_extent()
    assert not any(box.overlaps(ax.get_window_extent()) for ax in fig.axes)
    texts = [t.get_text() for t in legend.get_texts()]
    assert "t5 (text, random init)" in texts and "vit (image, random init)" in texts
    assert "totem (time series, random init)" in texts and "chronos (time series)" in texts
    for panel in (panel_b, panel_c):
        assert panel.get_xscale() == panel.get_yscale() == "symlog"
    plt.close(fig)


def test_the_page_says_when_the_models_do_not_reproduce_the_claim(systems, tmp_path):
    spectra, modalities, sources, labels = systems
    spectra["chronos"] = _full_rank(30)  # as the bundled Chronos-T5 is
    notes = ["signals"]
    paths = report.write_outputs(
        tmp_path, spectra, modalities, sources, [0.001, 0.01, 0.1], ["chronos"], labels, notes
    )
    page = paths["report"].read_text()
    assert "These models do not reproduce the claim (1 of 10 time-series models)" in page
    assert "Not below every baseline: chronos 1.00" in page
    assert "Random init, not trained" in page and "t5, vit, totem" in page.replace(
        "totem, t5, vit", "t5, vit, totem"
    )
    ranks = pd.read_csv(paths["epsilon_ranks"])
    assert list(ranks.loc[ranks.model.isin(["t5", "vit"]), "random_init"]) == [True, True]


def test_the_claim_holds_when_every_time_series_model_is_below_the_baselines():
    ranks = pd.DataFrame(
        {
            "model": ["chronos", "moirai", "t5"],
            "modality": ["time series", "time series", "text"],
            "weights": ["bundled:x", "bundled:y", "hub:google-t5/t5-small"],
            "width": [128, 256, 512],
            "rank_eps0.01": [16, 40, 500],
        }
    )
    text = claim_statement(ranks)
    assert "every time-series model is below them: chronos 0.12, moirai 0.16. It holds" in text
    assert "random init" not in text
    assert claim_statement(ranks[ranks.modality == "text"]) is None
