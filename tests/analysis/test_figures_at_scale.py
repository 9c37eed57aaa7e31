"""The report's figures at the size of a study (5 models × 12 data sets, and 10 × 12): one
colour per model rather than per run, legends beside the data rather than over it, every label
on the canvas, a size that fits a page."""

from __future__ import annotations

import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex
from matplotlib.lines import Line2D
from matplotlib.text import Text
from PIL import Image

from isoprobe.analysis import figures
from isoprobe.analysis.correlations import correlations
from isoprobe.analysis.study import load_study
from isoprobe.tasks.analyze import SHOWN_METRICS
from tests.analysis.probed_runs import grid_study, probed_run

#: the report's column is 1200 px wide (a wider picture is scaled down, its labels with it)
MAX_WIDTH, MAX_HEIGHT = 1250, 3600


def compression_rows(models: int, datasets: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame(
        {
            "run": f"{i}_{j}",
            "model": f"model_{i}",
            "dataset": f"dataset_{j:02d}",
            "epsilon": eps,
            "attention_size_ratio": 1 - 3 * eps - rng.uniform(0, 0.1),
            "wql_ratio": 1 + eps * rng.uniform(0, 2),
            "nmse_ratio": 1 + eps * rng.uniform(0, 3),
        }
        for i in range(models)
        for j in range(datasets)
        for eps in (0.01, 0.1, 0.2)
    )


def draw_all(root: Path, models: int, datasets: int, monkeypatch) -> dict[str, plt.Figure]:
    """Every report figure of a ``models`` × ``datasets`` study, kept open (name -> figure)."""
    study = load_study([str(grid_study(root / "sweep", models, datasets))])
    table = correlations(study, n_boot=20, n_perm=20)
    kept: list[plt.Figure] = []
    monkeypatch.setattr(figures.plt, "close", kept.append)
    forecast = "final_test_nmse"
    factor = figures.colour_factor(study, ["seed", "model", "dataset"])
    drawn = {
        "papers_form": figures.papers_form(study, forecast, "cos_inter", root / "p.png"),
        "scatter": figures.scatter(study, table, forecast, list(SHOWN_METRICS), root / "s.png"),
        "heatmap": figures.heatmap(study, table, forecast, root / "h.png"),
        "trajectories": figures.trajectories(study, ["cos_inter"], factor, root / "t.png"),
        "flow_of_ranks": figures.flow_of_ranks(study, root / "f.png"),
        "compression": figures.compression(compression_rows(models, datasets), root / "c.png"),
    }
    assert all(drawn.values()), drawn
    for path in drawn.values():
        width, height = Image.open(path).size
        assert width <= MAX_WIDTH and height <= MAX_HEIGHT, (path, width, height)
    return dict(zip(drawn, kept, strict=True))


@pytest.fixture(scope="module", params=[(5, 12), (10, 12)], ids=["60 runs", "120 runs"])
def drawn(request, tmp_path_factory):
    models, datasets = request.param
    with pytest.MonkeyPatch.context() as monkeypatch:
        made = draw_all(tmp_path_factory.mktemp("grid"), models, datasets, monkeypatch)
    yield models, made
    for fig in made.values():
        plt.close(fig)


def legends(fig: plt.Figure) -> list:
    return [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]


@pytest.mark.parametrize(
    "name", ["papers_form", "scatter", "heatmap", "trajectories", "flow_of_ranks", "compression"]
)
def test_legends_and_labels_lie_on_the_canvas_and_off_the_data(drawn, name):
    _, made = drawn
    fig = made[name]
    fig.canvas.draw()
    canvas = fig.bbox.padded(1)
    for legend in legends(fig):
        box = legend.get_window_extent()
        assert canvas.containsx(box.x0) and canvas.containsx(box.x1), (name, box, canvas)
        assert canvas.containsy(box.y0) and canvas.containsy(box.y1), (name, box, canvas)
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent()), (name, box)
    for text in fig.findobj(Text):
        if text.get_visible() and text.get_text() and text.axes is not None:
            box = text.get_window_extent()
            assert canvas.contains(box.x0, box.y0) and canvas.contains(box.x1, box.y1), (
                name,
                text.get_text(),
            )
            assert text.get_fontsize() >= 7, (name, text.get_text())


def test_the_flow_of_ranks_draws_one_line_per_stack_and_one_colour_per_model(drawn):
    """model_0 is an encoder-decoder: its two stacks are two lines of its colour (the switch
    of stack is no dip of one line), every other model one line."""
    models, made = drawn
    fig = made["flow_of_ranks"]
    for ax in fig.axes:
        assert len(ax.lines) == models + 1  # the median of each stack, not a line per run
        assert len(ax.collections) == models + 1  # each stack's range over its data sets
        assert len({to_hex(line.get_color()) for line in ax.lines}) == models
        encoder, decoder = ax.lines[:2]
        assert to_hex(encoder.get_color()) == to_hex(decoder.get_color())
        assert encoder.get_linestyle() != decoder.get_linestyle()
        assert len(encoder.get_xdata()) == 4 and len(decoder.get_xdata()) == 2
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [
        "model_0 · encoder (12 runs)",
        "model_0 · decoder (12 runs)",
        *(f"model_{i} (12 runs)" for i in range(1, models)),
    ]


def test_the_flow_of_ranks_plots_rank_over_width_so_models_of_any_width_compare(drawn):
    """Widths 32 to 128 in the grid: every value divided by its width lies in (0, 1], and the
    narrow and wide models share the axis."""
    _, made = drawn
    for ax in made["flow_of_ranks"].axes:
        values = np.concatenate([line.get_ydata() for line in ax.lines])
        assert values.min() > 0 and values.max() <= 1
        assert ax.get_ylim()[1] <= 1.1
        assert ax.get_ylabel() in ("", "ε-rank / width")
    assert made["flow_of_ranks"].axes[0].get_ylabel() == "ε-rank / width"


def test_scatter_and_compression_colour_by_model_beyond_ten_runs(drawn):
    models, made = drawn
    for name in ("scatter", "compression"):
        (legend,) = made[name].legends
        handles = legend.legend_handles
        assert [t.get_text() for t in legend.get_texts()] == [f"model_{i}" for i in range(models)]
        colours = {
            to_hex(h.get_color() if isinstance(h, Line2D) else h.get_facecolor()[0])
            for h in handles
        }
        assert len(colours) == models, name


def test_the_flow_of_ranks_median_and_range_are_the_runs_own(tmp_path, monkeypatch):
    """Three runs of one model: the line is the blockwise median, the band min to max."""
    rng = np.random.default_rng(1)
    for i in range(3):
        probed_run(tmp_path / "sweep" / str(i), "m", f"d{i}", blocks=4, epochs=1, rng=rng)
    study = load_study([str(tmp_path / "sweep")])
    kept: list[plt.Figure] = []
    monkeypatch.setattr(figures.plt, "close", kept.append)
    figures.flow_of_ranks(study, tmp_path / "f.png")
    ranks = study.table[study.table["metric"] == "rank_uncentred_eps0.01"]
    wide = ranks.pivot_table(index="layer", columns="run", values="value").loc[
        [f"encoder.{b}" for b in range(4)]
    ]
    wide = wide / 512  # the runs' width
    ax = kept[0].axes[1]  # eps 0.001, 0.01, 0.1
    (line,) = ax.lines
    np.testing.assert_allclose(line.get_xdata(), np.linspace(0, 1, 4))
    np.testing.assert_allclose(line.get_ydata(), wide.median(axis=1))
    (band,) = ax.collections
    edges = band.get_paths()[0].vertices[:, 1]
    assert edges.min() == pytest.approx(wide.min(axis=1).min())
    assert edges.max() == pytest.approx(wide.max(axis=1).max())


def test_names_with_dollar_signs_are_drawn_as_written(tmp_path, monkeypatch):
    """A data set or model named like mathtext (``$\\bad$``) is text, not a parse error."""
    rng = np.random.default_rng(2)
    for i in range(4):
        probed_run(
            tmp_path / "sweep" / str(i), f"m$\\bad{i % 2}$", f"d${i}$", blocks=2, epochs=2, rng=rng
        )
    study = load_study([str(tmp_path / "sweep")])
    table = correlations(study, n_boot=20, n_perm=20)
    kept: list[plt.Figure] = []
    monkeypatch.setattr(figures.plt, "close", kept.append)
    assert figures.papers_form(study, "after_test_nmse", "cos_inter", tmp_path / "p.png")
    assert figures.scatter(study, table, "after_test_nmse", ["cos_inter"], tmp_path / "s.png")
    assert figures.trajectories(study, ["cos_inter"], "model", tmp_path / "t.png")
    assert figures.flow_of_ranks(study, tmp_path / "f.png")
    labels = [t.get_text() for t in kept[-1].legends[0].get_texts()]
    assert labels == ["m$\\bad0$ (2 runs)", "m$\\bad1$ (2 runs)"]


def test_trajectories_colour_by_what_tells_the_trained_runs_apart(drawn):
    """In the grid only the last model trains: its twelve runs differ by data set (more levels
    than tab10 has colours), so the lines are coloured by data set, each its own tab10 colour
    and line style (not tab20's pale twins), and the title says which runs these are."""
    models, made = drawn
    fig = made["trajectories"]
    (legend,) = fig.legends
    assert legend.get_title().get_text() == "dataset"
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == [f"dataset_{j:02d}" for j in range(12)]
    styles = {(to_hex(h.get_color()), h.get_linestyle()) for h in legend.legend_handles}
    assert len(styles) == 12
    assert {colour for colour, _ in styles} <= {to_hex(c) for c in plt.cm.tab10.colors}
    title = fig.get_suptitle()
    assert f"The 12 of {12 * models} runs probed more than once" in title
    assert f"model_{models - 1}" in title


def test_the_colour_factor_is_one_that_varies_among_the_trained_runs(tmp_path):
    study = load_study([str(grid_study(tmp_path / "sweep", 2, 3))])
    assert figures.colour_factor(study, ["seed", "model", "dataset"]) == "dataset"
    assert figures.colour_factor(study, ["seed"]) == "seed"


def test_the_pooled_heatmap_shows_the_layers_every_model_has_with_their_runs(drawn):
    """Models of 4 to 22 blocks pooled: their blocks are different layers, so the columns are
    the architecture-free choices, each with its number of runs."""
    models, made = drawn
    (ax, _colourbar) = made["heatmap"].axes
    layers = [t.get_text() for t in ax.get_xticklabels()]
    # several models: layers by depth, never by a name that means another layer in another model
    assert layers == [f"{c} (n={12 * models})" for c in ("first", "middle", "last", "mean")]
    assert f"{models} models pooled" in ax.get_title()


def one_model_study(root: Path, blocks: int):
    rng = np.random.default_rng(5)
    for i in range(8):
        probed_run(root / "one" / str(i), "m", f"d{i}", blocks=blocks, epochs=1, rng=rng)
    return load_study([str(root / "one")])


def test_one_models_heatmap_orders_its_layers_as_its_probe_recorded_them(tmp_path, monkeypatch):
    """Twelve blocks: encoder.10 after encoder.9 (not after encoder.1, as sorted names are),
    then the last and mean choices, each column with its runs."""
    study = one_model_study(tmp_path, blocks=12)
    table = correlations(study, n_boot=20, n_perm=20)
    kept: list[plt.Figure] = []
    monkeypatch.setattr(figures.plt, "close", kept.append)
    figures.heatmap(study, table, "before_test_nmse", tmp_path / "h.png")
    ax = kept[0].axes[0]
    layers = [t.get_text() for t in ax.get_xticklabels()]
    assert layers == [f"encoder.{b} (n=8)" for b in range(12)] + ["last (n=8)", "mean (n=8)"]
    assert "pooled" not in ax.get_title()


def test_a_long_metric_name_leaves_the_heatmap_its_cells(tmp_path, monkeypatch):
    """A 75-character name is cut to 40 in the ticks, and the panel keeps its width (it
    collapsed to nothing, with constrained layout giving up)."""
    long = "rank_uncentred_" * 5
    table = pd.DataFrame(
        {
            "forecast_metric": "f",
            "group": "all",
            "metric": [long, "cos_inter"] * 2,
            "layer": ["encoder.0"] * 2 + ["encoder.1"] * 2,
            "spearman": [0.5, -0.5, 0.1, 0.2],
            "n": 8,
        }
    )
    study = one_model_study(tmp_path, blocks=2)
    kept: list[plt.Figure] = []
    monkeypatch.setattr(figures.plt, "close", kept.append)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        figures.heatmap(study, table, "f", tmp_path / "h.png")
    ax = kept[0].axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["cos_inter", long[:39] + "…"]
    assert ax.get_window_extent().width > 0.25 * kept[0].bbox.width


def test_models_without_a_recorded_width_are_named_not_drawn(tmp_path, monkeypatch):
    rng = np.random.default_rng(4)
    for i in range(2):
        probed_run(tmp_path / "sweep" / str(i), f"m{i}", "d", blocks=3, epochs=1, rng=rng)
    ranks = tmp_path / "sweep" / "1" / "rank_metrics.csv"
    rows = pd.read_csv(ranks)
    rows[rows["metric"] != "width"].to_csv(ranks, index=False)  # recorded before widths were
    kept: list[plt.Figure] = []
    monkeypatch.setattr(figures.plt, "close", kept.append)
    assert figures.flow_of_ranks(load_study([str(tmp_path / "sweep")]), tmp_path / "f.png")
    (legend,) = kept[0].legends
    assert [t.get_text() for t in legend.get_texts()] == ["m0 (1 run)"]
    assert legend.get_title().get_text().endswith("not drawn, no width recorded: m1")


def test_runs_without_a_model_name_are_one_model_in_the_flow_of_ranks(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    for i in range(2):
        probed_run(tmp_path / "sweep" / str(i), None, f"d{i}", blocks=3, epochs=1, rng=rng)
    kept: list[plt.Figure] = []
    monkeypatch.setattr(figures.plt, "close", kept.append)
    assert figures.flow_of_ranks(load_study([str(tmp_path / "sweep")]), tmp_path / "f.png")
    assert [t.get_text() for t in kept[0].legends[0].get_texts()] == ["None (2 runs)"]
    assert all(len(line.get_ydata()) == 3 for ax in kept[0].axes for line in ax.lines)


def test_errors_are_drawn_on_a_log_axis(drawn):
    """Errors spanning decades: the scatter's and the papers'-form panels' error axes are
    logarithmic, labelled as plain numbers."""
    _, made = drawn
    for name in ("scatter", "papers_form"):
        for ax in made[name].axes:
            if ax.has_data():
                assert ax.get_yscale() == "log", name
                assert "(log)" in ax.get_ylabel(), name


def test_the_papers_form_is_one_panel_per_model_with_its_rho_and_n(drawn):
    models, made = drawn
    panels = [ax for ax in made["papers_form"].axes if ax.has_data()]
    assert len(panels) == models
    for i, ax in enumerate(panels):
        title = ax.get_title()
        assert title.startswith(f"model_{i}\nρ=") and title.endswith("n=12")
        assert len(ax.collections) == 1 and len(ax.collections[0].get_offsets()) == 12
