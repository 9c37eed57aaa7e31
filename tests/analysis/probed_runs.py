"""Run directories with probe records, as ``task=probe`` leaves them, written without running a
model: for analyses of studies too big (60 runs) or too hostile (markup in every name) to run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from isoprobe.tasks.analyze import run_analyze
from tests.analysis.test_analyze import fake_run
from tests.conftest import compose_config

#: isotropy metrics each run records per block (the report's scatter and trajectories)
ISOTROPY_METRICS = ("cos_inter", "cos_inter_centered", "cos_cluster_excess", "eff_dim", "isoscore")
EPSILONS = ("0.001", "0.01", "0.1")


def probed_run(
    directory: Path,
    model: str | None,
    dataset: str,
    *,
    blocks: int,
    epochs: int,
    rng: np.random.Generator,
    overrides: tuple[str, ...] = (),
    extra_metric: str | None = None,
    rank_level: float = 64.0,
    width: int = 512,
    decoder_blocks: int = 0,
) -> Path:
    """A run of ``model`` on ``dataset`` probed at ``epochs`` epochs (one: zero-shot; more:
    fine-tuned, with a forecast after) over ``blocks`` encoder blocks and ``decoder_blocks``
    decoder blocks, tokens ``width`` wide, with random values (the ε-ranks around
    ``rank_level``, falling with depth in each stack, at most ``width``)."""
    summary = {"before": {"test/nmse": float(rng.uniform(0.1, 1.0))}}
    if epochs > 1:
        summary["after"] = {"test/nmse": float(rng.uniform(0.1, 1.0))}
    fake_run(directory, list(overrides), summary)
    config_path = directory / ".hydra" / "config.yaml"
    config = yaml.safe_load(config_path.read_text())
    config["task"]["name"] = "probe"
    config["model"]["name"] = model
    config["data"]["dataset"] = dataset
    config_path.write_text(yaml.safe_dump(config))
    isotropy, rank = [], []
    metrics = [*ISOTROPY_METRICS, *([extra_metric] if extra_metric else [])]
    stacks = [("encoder", blocks), ("decoder", decoder_blocks)]
    layers = [(f"{stack}.{b}", b / count) for stack, count in stacks for b in range(count)]
    for epoch in range(epochs):
        for layer, depth in layers:
            for metric in metrics:
                isotropy.append(("isotropy", epoch, epoch, layer, metric, rng.uniform(), ""))
            rank.append(("rank", epoch, epoch, layer, "width", float(width), ""))
            for eps in EPSILONS:
                level = rank_level * float(eps) ** -0.2 * (1 - 0.5 * depth)
                value = float(np.clip(np.round(level * rng.uniform(0.7, 1.3)), 1, width))
                rank.append(("rank", epoch, epoch, layer, f"rank_uncentred_eps{eps}", value, ""))
    columns = ["probe", "epoch", "global_step", "layer", "metric", "value", "note"]
    pd.DataFrame(isotropy, columns=columns).to_csv(directory / "probe_metrics.csv", index=False)
    pd.DataFrame(rank, columns=columns).to_csv(directory / "rank_metrics.csv", index=False)
    return directory


def grid_study(root: Path, models: int, datasets: int, seed: int = 0) -> Path:
    """``models`` × ``datasets`` runs under ``root`` (a sweep): model ``i`` has ``4 + 2 i``
    blocks ``32 · 2^(i mod 3)`` wide; the first is an encoder-decoder (two decoder blocks, as
    Chronos-T5); the last model is fine-tuned over three epochs (as PatchTST in the real
    grid)."""
    rng = np.random.default_rng(seed)
    for i in range(models):
        for j in range(datasets):
            probed_run(
                root / f"{i * datasets + j}",
                f"model_{i}",
                f"dataset_{j:02d}",
                blocks=4 + 2 * i,
                epochs=3 if i == models - 1 else 1,
                rng=rng,
                overrides=(f"model=model_{i}", f"data=dataset_{j:02d}"),
                rank_level=16.0 * (i + 1),
                width=32 * 2 ** (i % 3),
                decoder_blocks=2 if i == 0 else 0,
            )
    return root


#: markup that runs script where a page takes it for markup: it renames the page, or marks
#: ``<html>`` (the third has no ``=``, so that it can be an override's key)
IMG_PAYLOAD = "<img src=x onerror=document.title='PWNED'>"
SVG_PAYLOAD = "<svg onload=document.documentElement.setAttribute('data-pwned','1')>"
KEY_PAYLOAD = "<script>document.documentElement.setAttribute('data-pwned','key')</script>"


def hostile_study(root: Path) -> Path:
    """Sixteen fine-tuned runs (four models on four data sets, so that the groups of a model
    and of a data set have enough runs for an answer) whose model name, data set, an
    override's value, a swept key and a metric name are markup, one run without probe records
    (its directory's name markup) and one run without forecast metrics (likewise): every place
    a run's words reach the report."""
    rng = np.random.default_rng(0)
    for i, model in enumerate((IMG_PAYLOAD, "chronos", "moirai", "timesfm")):
        for j, dataset in enumerate((SVG_PAYLOAD, "etth1", "weather", "exchange")):
            probed_run(
                root / f"{i}_{j}",
                model,
                dataset,
                blocks=2,
                epochs=2,
                rng=rng,
                overrides=(
                    f"{KEY_PAYLOAD}={'a' if i else 'b'}",
                    f"data.note={IMG_PAYLOAD if j == 0 else 'plain'}",
                ),
                extra_metric=SVG_PAYLOAD,
            )
    fake_run(root / SVG_PAYLOAD, [], {"before": {"test/nmse": 0.5}})
    (root / IMG_PAYLOAD / ".hydra").mkdir(parents=True)
    (root / IMG_PAYLOAD / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"seed": 0}))
    return root


def analyse(runs: Path, output: Path) -> Path:
    """``task=analyze`` on ``runs`` in this process (few resamples), written to ``output``."""
    cfg = compose_config(
        output,
        [
            "task=analyze",
            f"analyze.runs={runs}",
            "analyze.n_boot=50",
            "analyze.n_perm=50",
            "logger=none",
        ],
    )
    run_analyze(cfg)
    return output
