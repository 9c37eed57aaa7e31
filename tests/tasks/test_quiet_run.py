"""A run prints none of Lightning's noise: its cloud-logger tip, the ``_pytree`` deprecation
warning, and a model summary with ``Total FLOPs: 0`` (isoprobe/tasks/quiet.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT, TINY

pytestmark = pytest.mark.slow


def test_a_run_prints_no_tip_no_pytree_warning_and_no_flops(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *TINY, "model.checkpoint=scratch",
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert "parameters trainable" in output  # the run's own summary of its parameters
    for noise in ("Tip:", "litlogger", "LeafSpec", "FLOPs"):
        assert noise not in output, noise
