"""Serve one model's official forecast to ``bench/forecast_throughput.py``, in a side
environment that holds the official package (with numpy and torch; nothing of isoprobe).

    <side python> bench/official/serve.py MODEL CHECKPOINT TASK

``bench/official/MODEL_pipeline.py`` defines ``load(checkpoint, task)``: it builds the official
pipeline on the checkpoint directory ``CHECKPOINT`` through the package's own loader and returns
``predict(context) -> quantiles``, ``context`` [B, L] float32 (NaN = missing) to quantiles
[B, len(levels), H]. ``TASK`` is an npz of the windows (``context``), ``prediction_length``,
``num_samples`` and ``levels``; ``load`` reads what it needs. A new model's official side is one
more such file (and its row in the bench's ``CASES``).

The protocol, one line each way per call: once loaded, the server prints ``ready``; then for
every line ``SEED PATH`` it reads it seeds torch with ``SEED``, forecasts the windows under
``torch.no_grad`` (timed: the predict call alone), saves the quantiles to ``PATH`` (.npy) and
prints the call's seconds. End of input ends it. Where the package does not import or the
checkpoint does not load, it prints ``error: <one line>`` and exits 1. Whatever the package
prints goes to stderr, so that stdout carries the protocol alone.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
import torch


def pipeline(model: str):
    """The module ``MODEL_pipeline.py`` beside this file."""
    path = Path(__file__).resolve().parent / f"{model}_pipeline.py"
    spec = importlib.util.spec_from_file_location(f"{model}_pipeline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(model: str, checkpoint: str, task_file: str) -> None:
    task = dict(np.load(task_file))
    context = task["context"]
    protocol = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        try:
            predict = pipeline(model).load(Path(checkpoint), task)
        except Exception as err:  # noqa: BLE001 - the bench prints why and times isoprobe alone
            print(f"error: {type(err).__name__}: {err}".splitlines()[0], file=protocol, flush=True)
            sys.exit(1)
        print("ready", file=protocol, flush=True)
        for line in sys.stdin:
            seed, path = line.split(maxsplit=1)
            torch.manual_seed(int(seed))
            with torch.no_grad():
                start = time.perf_counter()
                quantiles = predict(context)
                seconds = time.perf_counter() - start
            np.save(path.strip(), np.asarray(quantiles, dtype=np.float32))
            print(repr(seconds), file=protocol, flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
