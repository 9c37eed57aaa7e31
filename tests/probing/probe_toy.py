"""A tiny forecaster with the isoprobe probe interface, its data, and an independent token
collector, shared by the probe tests and the DDP subprocess script."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import Logger
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from isoprobe.probing import ProbeCallback

CONTEXT = 12
HORIZON = 4
WIDTH = 16


class ToyWindows(Dataset):
    """Noisy sine windows; window i observes only its last ``observed[i]`` context values
    (the earlier ones are NaN, as padding of a short series would be)."""

    def __init__(self, count: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        t = torch.arange(CONTEXT + HORIZON, dtype=torch.float32)
        phase = torch.rand(count, 1, generator=gen) * 2 * math.pi
        noise = 0.1 * torch.randn(count, CONTEXT + HORIZON, generator=gen)
        self.values = torch.sin(t / 2 + phase) + noise
        self.observed = torch.randint(CONTEXT // 2, CONTEXT + 1, (count,), generator=gen)

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        context = self.values[index, :CONTEXT].clone()
        context[: CONTEXT - int(self.observed[index])] = math.nan
        return {
            "context": context,
            "target": self.values[index, CONTEXT:].clone(),
            "window_index": torch.tensor(index),
        }


class ToyData(L.LightningDataModule):
    def __init__(self, num_train: int = 32, num_val: int = 10, batch_size: int = 8) -> None:
        super().__init__()
        self.num_train, self.num_val, self.batch_size = num_train, num_val, batch_size

    def setup(self, stage: str) -> None:
        self.train_dataset = ToyWindows(self.num_train, seed=1)
        self.val_dataset = ToyWindows(self.num_val, seed=2)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_dataset, batch_size=self.batch_size, shuffle=False)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_dataset, batch_size=self.batch_size)


class ToyForecaster(L.LightningModule):
    """Value embedding + a learned summary token + two transformer blocks + a linear head.

    Probe layers: ``embed`` ([B, C, D], one row per context value) and ``encoder.0/1``
    ([B, C + 1, D], the summary token last). Real tokens: observed context values only.
    """

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.lr = lr
        self.embed = nn.Linear(2, WIDTH)
        self.position = nn.Parameter(0.3 * torch.randn(CONTEXT + 1, WIDTH))
        self.summary = nn.Parameter(torch.randn(WIDTH))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(WIDTH, 2, 32, dropout=0.0, batch_first=True)
            for _ in range(2)
        )
        self.head = nn.Linear(WIDTH, HORIZON)
        self.probe_calls: list[bool] = []

    def probe_layers(self, site: str = "block") -> dict[str, nn.Module]:
        if site != "block":
            raise ValueError(f"the toy model has only block outputs, not {site!r}")
        return {"embed": self.embed, **{f"encoder.{i}": b for i, b in enumerate(self.blocks)}}

    def token_masks(self, batch: Mapping[str, Tensor], layers: Iterable[str]) -> dict[str, Tensor]:
        observed = torch.isfinite(batch["context"])
        blocks = torch.cat([observed, torch.zeros_like(observed[:, :1])], dim=1)
        return {name: observed if name == "embed" else blocks for name in layers}

    def attention_weights(self) -> dict[str, dict[str, Tensor]]:
        """Each block's Q, K, V (views of the fused in-projection) and O weights."""
        weights = {}
        for i, block in enumerate(self.blocks):
            q, k, v = block.self_attn.in_proj_weight.chunk(3, dim=0)
            weights[f"encoder.{i}"] = {"q": q, "k": k, "v": v, "o": block.self_attn.out_proj.weight}
        return weights

    def probe_forward(self, batch: Mapping[str, Tensor]) -> None:
        self.probe_calls.append(self._trainer is not None and self.trainer.sanity_checking)
        self.loss(batch)

    def forward(self, context: Tensor) -> Tensor:
        observed = torch.isfinite(context)
        values = torch.stack([context.nan_to_num(0.0), observed.float()], dim=-1)
        h = self.embed(values)
        h = torch.cat([h, self.summary.expand(h.shape[0], 1, WIDTH)], dim=1) + self.position
        for block in self.blocks:
            h = block(h)
        return self.head(h[:, -1])

    def loss(self, batch: Mapping[str, Tensor]) -> Tensor:
        return nn.functional.mse_loss(self(batch["context"]), batch["target"])

    def training_step(self, batch: Mapping[str, Tensor], batch_idx: int) -> Tensor:
        return self.loss(batch)

    def validation_step(self, batch: Mapping[str, Tensor], batch_idx: int) -> None:
        self.log("val/loss", self.loss(batch), batch_size=batch["context"].shape[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class RecordingLogger(Logger):
    """Keeps every ``log_metrics`` call in memory."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int | None, dict[str, Any]]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> str:
        return "0"

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        return None

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.calls.append((step, dict(metrics)))


def tokens_by_hand(
    model: ToyForecaster, dataset: Dataset, windows: list[int], batch_size: int
) -> dict[str, Tensor]:
    """Each layer's real tokens of ``windows`` in order (window, then position), computed
    without the callback: own hooks, own batching (consecutive chunks), own masking."""
    layers = model.probe_layers()
    out: dict[str, list[Tensor]] = {name: [] for name in layers}
    seen: dict[str, Tensor] = {}
    handles = [
        module.register_forward_hook(
            lambda _m, _i, o, name=name: seen.__setitem__(name, o[0] if isinstance(o, tuple) else o)
        )
        for name, module in layers.items()
    ]
    model.eval()
    with torch.no_grad():
        for start in range(0, len(windows), batch_size):
            items = [dataset[i] for i in windows[start : start + batch_size]]
            batch = {k: torch.stack([item[k] for item in items]) for k in items[0]}
            model.loss(batch)
            masks = model.token_masks(batch, layers)
            for name in layers:
                mask = masks[name]
                for row in range(mask.shape[0]):
                    out[name].append(seen[name][row][mask[row]])
    for handle in handles:
        handle.remove()
    return {name: torch.cat(rows) for name, rows in out.items()}


def seeded_subsample(X: Tensor, max_rows: int, seed: int) -> Tensor:
    """The documented token subsample: rows ``sort(randperm(N, seed)[:max_rows])``."""
    if X.shape[0] <= max_rows:
        return X
    perm = torch.randperm(X.shape[0], generator=torch.Generator().manual_seed(seed))
    return X[perm[:max_rows].sort().values]


def toy_trainer(callbacks: list, **kwargs: Any) -> L.Trainer:
    """One CPU process for the toy model: one epoch, no progress bar, model summary,
    checkpoints, sanity check nor logger, unless ``kwargs`` say otherwise."""
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        logger=False,
    )
    return L.Trainer(callbacks=callbacks, **{**options, **kwargs})


def isotropy_probe(
    metrics=None, plugins=None, pca_layers=None, similarity=None, readout=None, **probe
) -> ProbeCallback:
    """The probe with the isotropy measures (and, given their options, cka and readout)."""
    measures = (
        ["isotropy"] + ["cka"] * (similarity is not None) + ["readout"] * (readout is not None)
    )
    isotropy = {"metrics": metrics, "pca_layers": pca_layers}
    return ProbeCallback(
        measures=measures,
        isotropy=isotropy,
        cka=similarity,
        readout=readout,
        plugins=plugins or (),
        **probe,
    )


def rank_probe(epsilons=None, weights=True, **probe) -> ProbeCallback:
    """The probe with the rank measures only."""
    rank = {"weights": weights} if epsilons is None else {"epsilons": epsilons, "weights": weights}
    return ProbeCallback(measures=["rank"], rank=rank, **probe)
