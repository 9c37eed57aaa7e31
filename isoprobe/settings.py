"""The numeric and enumerated settings a user overrides, checked in one place before anything
loads (no data generated, no weights read, no memory allocated).

Each config group that holds such settings has a pydantic model below: its fields give each
setting's type and range. :func:`check_settings` validates the resolved config against every
model at once and raises :class:`SettingsError` with one line per violation, each naming the
setting's key, what it must be and what it got ("model.lora.r must be a whole number in
[1, 4096], got 2.5"). Integers are strict (2.5 is refused, not truncated), numbers must be
finite, and the upper bounds keep a typo from asking for more than a machine holds. Settings
that are not listed here are left to the modules that read them; a key the config does not
hold (a model without LoRA, a run without an analysis) is not checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from omegaconf import MISSING, DictConfig, OmegaConf
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from isoprobe.errors import IsoprobeError


class SettingsError(IsoprobeError, ValueError):
    """Settings out of their range: every violation, one line each."""


@dataclass(frozen=True)
class Range:
    """A setting's type (whole number or finite number) and interval; ``nullable`` admits
    ``null`` (the setting's "no limit" or "as the other setting")."""

    whole: bool
    low: float
    high: float
    open_low: bool = False
    open_high: bool = False
    nullable: bool = False

    def annotation(self) -> Any:
        bounds = {
            "gt" if self.open_low else "ge": self.low,
            "lt" if self.open_high else "le": self.high,
        }
        kind = (
            Annotated[int, Field(strict=True, **bounds)]
            if self.whole
            else Annotated[float, Field(allow_inf_nan=False, **bounds)]
        )
        return (kind | None) if self.nullable else kind

    def words(self) -> str:
        kind = "a whole number" if self.whole else "a finite number"
        left, right = "(" if self.open_low else "[", ")" if self.open_high else "]"
        text = f"{kind} in {left}{self.low:g}, {self.high:g}{right}"
        return text + " or null" if self.nullable else text


def whole(low: int, high: int, nullable: bool = False) -> Range:
    return Range(True, low, high, nullable=nullable)


def number(low: float, high: float, open_low: bool = False, open_high: bool = False) -> Range:
    return Range(False, low, high, open_low, open_high)


#: a count of windows, tokens or resamples: the bound keeps a typo from exhausting memory
MAX_COUNT = 1_000_000
#: a batch: past what fits, the memory check (tasks/memory.py) refuses it with the estimate
BATCH = whole(1, 10_000_000)
PROBE = {
    "every_n_epochs": whole(1, MAX_COUNT),
    "every_n_steps": whole(1, MAX_COUNT, nullable=True),
    "log_spaced_steps": whole(2, MAX_COUNT, nullable=True),
    "num_windows": whole(1, MAX_COUNT),
    "max_tokens": whole(2, MAX_COUNT),
    "batch_size": BATCH,
    "figures_every_n_epochs": whole(-1, MAX_COUNT),
}
#: config path -> setting -> its range
SCHEMA: Mapping[str, Mapping[str, Range]] = {
    # the sample paths of the models that sample (Chronos-T5, Lag-Llama, Moirai, Sundial, Toto, ...)
    "model": {"num_samples": whole(1, MAX_COUNT)},
    "model.lora": {
        "r": whole(1, 4096),
        "alpha": number(0, 1e6, open_low=True),
        "dropout": number(0, 1, open_high=True),
    },
    "model.optimizer": {"lr": number(0, 10, open_low=True), "weight_decay": number(0, 1e3)},
    "data": {
        # null: the data set's own lengths (data=chronos_benchmark)
        "context_length": whole(2, 100_000, nullable=True),
        "prediction_length": whole(1, 100_000, nullable=True),
        "noise_std": number(0, 1e6),
        "train_stride": whole(1, MAX_COUNT),
        "eval_stride": whole(1, MAX_COUNT, nullable=True),
        "max_train_windows": whole(1, 100 * MAX_COUNT, nullable=True),
        "max_eval_windows": whole(1, 100 * MAX_COUNT, nullable=True),
        "batch_size": BATCH,
        "eval_batch_size": BATCH,
        "num_workers": whole(0, 256),
    },
    "callbacks.probe": PROBE,
    "regularizer": {"weight": number(0, 1e6)},
    "embedding_spectra": {
        "per_family": whole(1, MAX_COUNT),
        "context_length": whole(2, 100_000),
        "prediction_length": whole(1, 100_000),
        "batch_size": BATCH,
        "max_tokens": whole(2, 10 * MAX_COUNT),
        "seed": whole(0, 2**32 - 1),
    },
    "analyze": {
        "n_boot": whole(0, 100_000),
        "n_perm": whole(0, 100_000),
        "seed": whole(0, 2**32 - 1),
    },
    "trainer": {
        "max_epochs": whole(-1, MAX_COUNT, nullable=True),
        "gradient_clip_val": Range(False, 0, 1e9, nullable=True),
    },
}


def _model(path: str, ranges: Mapping[str, Range]) -> type[BaseModel]:
    fields = {name: (r.annotation(), ...) for name, r in ranges.items()}
    return create_model(path.replace(".", "_"), __config__=ConfigDict(extra="ignore"), **fields)


_MODELS = {path: _model(path, ranges) for path, ranges in SCHEMA.items()}


def check_settings(cfg: DictConfig) -> None:
    """Raise :class:`SettingsError` naming every setting of ``cfg`` outside its range (module
    docstring); the ``regularizer`` group is checked only when a regulariser is on."""
    problems = []
    for path, ranges in SCHEMA.items():
        node = OmegaConf.select(cfg, path, default=None)
        if not isinstance(node, DictConfig) or (path == "regularizer" and _is_off(node)):
            continue
        values = OmegaConf.to_container(node, resolve=True)
        present = [name for name in ranges if name in values and values[name] != MISSING]
        try:
            _MODELS[path].model_validate({name: values[name] for name in present})
        except ValidationError as err:
            problems += [
                f"{path}.{e['loc'][0]} must be {ranges[e['loc'][0]].words()}, got {e['input']!r}"
                for e in err.errors()
                if e["type"] != "missing"
            ]
    if problems:
        raise SettingsError(
            "settings out of range (nothing was loaded or written):\n  " + "\n  ".join(problems)
        )


def _is_off(regularizer: DictConfig) -> bool:
    return regularizer.get("name") in (None, "none")
