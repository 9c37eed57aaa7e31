"""Sundial's official forecast: the published remote code of ``thuml/sundial-base-128m``
(``SundialForPrediction.generate``, normalising each window itself, ``revin=True``) on
``from_pretrained`` of the checkpoint directory, ``num_samples`` paths per window in one batch;
the quantiles are ``torch.quantile`` of the paths.

Sundial has no package: the side environment holds the four published files as a package, as
``tests/fixtures/sundial/make_fixture.py`` sets them up (transformers 4.40.1), and
``$ISOPROBE_SUNDIAL_CODE`` names that package's directory (e.g. /tmp/sundial-side/official). Its
``generate`` overrides ``_sample``, the loop transformers 4.40.1 calls ``_greedy_search``, so
that name is pointed at it. The official code reads no missing value but its left padding: the
bench's energy windows have none.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import numpy as np
import torch


def official_class():
    """``SundialForPrediction`` from the package ``$ISOPROBE_SUNDIAL_CODE`` names."""
    code = Path(os.environ["ISOPROBE_SUNDIAL_CODE"]).resolve()
    sys.path.insert(0, str(code.parent))
    cls = importlib.import_module(f"{code.name}.modeling_sundial").SundialForPrediction
    cls._greedy_search = cls._sample
    return cls


def load(checkpoint: Path, task: dict):
    model = official_class().from_pretrained(str(checkpoint), torch_dtype=torch.float32).eval()
    horizon, samples = int(task["prediction_length"]), int(task["num_samples"])
    levels = torch.tensor(task["levels"], dtype=torch.float32)

    def predict(context: np.ndarray) -> np.ndarray:
        paths = model.generate(
            torch.from_numpy(context), max_new_tokens=horizon, num_samples=samples, revin=True
        )  # [B, S, H]
        return torch.quantile(paths, levels, dim=1).permute(1, 0, 2).numpy()

    return predict
