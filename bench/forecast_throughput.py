"""Forecast time of isoprobe against each model's official pipeline, side by side in one run.

For every model with an official inference path, both sides load the same bundled checkpoint
(``isoprobe/models/bundled/<name>``, official formats, float16 on disk, float32 in memory) and
forecast the same 64 test windows of ``data=energy`` (vic_elec) as one batch, on the CPU:

- Chronos-T5: ``ChronosPipeline.predict_quantiles``; windows 128 / 32 (the checkpoint's own
  lengths: the pipeline cuts longer contexts and decodes longer horizons in chunks), 20 samples.
  Two isoprobe rows: the default ``model.sampler=fast`` (the same distribution, other random
  draws: :mod:`isoprobe.models.chronos.t5_sampling`) and ``generate`` (the pipeline's own samples).
- Chronos-Bolt: ``ChronosBoltPipeline.predict_quantiles``; 144 / 48 (energy's windows).
- Chronos-2: ``Chronos2Pipeline.predict_quantiles`` on a [64, 1, 144] tensor; 144 / 48.
- Moirai: uni2ts ``MoiraiForecast`` (gluonts' fields built from the window as in
  tests/models/test_moirai.py), then ``torch.quantile`` of its samples; 144 / 48, patch 32,
  100 samples (isoprobe's default).
- TimesFM: ``TimesFmModelForPrediction`` called directly (a list of series, one frequency
  category each), its quantile heads; 144 / 48.
- PatchTST: ``PatchTSTForPrediction.generate``; 512 / 64 (the bundled model's lengths); its
  MSE head gives one point, which is every quantile on both sides.
- VisionTS: the ``visionts`` package's ``VisionTS`` (its MAE swapped for one of isoprobe's
  ``mini`` shape with the same random weights: isoprobe ships no VisionTS checkpoint, so both
  sides use ``model.checkpoint=scratch``); 144 / 48 at the data's season length (48, half-hourly);
  one point, every quantile.
  The package needs torchvision, whose wheel does not load beside isoprobe's CPU torch: where
  ``visionts`` does not import, the row times isoprobe alone (official columns ``nan``).
- Time-MoE: isoprobe alone (144 / 48, its point forecast at every quantile). The official code
  needs transformers 4.40 (it breaks on 5.x), so it cannot run beside isoprobe; its parity on
  the same weights is tests/models/test_time_moe.py's (fixture made in a side environment).

Models whose official package cannot be installed beside isoprobe (its pins clash) run their
official side in a side environment in the same run (:class:`Side`): the bench writes the
windows to an npz and starts the side environment's python on ``bench/official/serve.py``,
which loads the same checkpoint through the package's own loader
(``bench/official/<name>_pipeline.py``) and then forecasts once per line the bench sends it,
seeded and timed in the side process (the call alone), while isoprobe's calls wait; the rounds
alternate as for the others. The side python is ``--side-python NAME=PATH`` or
``$ISOPROBE_SIDE_PYTHON_<NAME>``; without one, or where it does not load, the row times isoprobe
alone (official columns ``nan``) and says why in one line. The side environments are those the
parity fixtures were made in (each ``tests/fixtures/<name>/make_fixture.py`` says how to build
it); all 144 / 48:

- TimesFM 2.5: the ``timesfm`` package 3.0.2's ``TimesFM_2p5_200M_torch.forecast`` after
  ``compile`` with the ``ForecastConfig`` defaults (flip invariance, the clip at 0 of
  non-negative windows) and one batch of all windows (``per_core_batch_size=64``; the default,
  1, forecasts one window at a time), sized by the checkpoint's config.json, weights through
  ``load_checkpoint``; no torch.compile.
- Moirai 2.0: uni2ts 2.0.0's ``Moirai2Forecast.forward`` on ``Moirai2Module.from_pretrained``.
- TiRex: the ``tirex-ts`` package 1.4.2's ``TiRexZero.forecast``, pure-torch sLSTM (its
  bfloat16 recurrence). Its loader reads only a Lightning ``model.ckpt``, not isoprobe's
  config.json + model.safetensors (the bundled mini is isoprobe's own, trained by isoprobe), so
  the side process writes the same tensors and shape as such a checkpoint and loads that with
  the package's ``TiRexZero.from_pretrained``.
- Toto: the ``toto-ts`` package 0.2.0's ``TotoForecaster.forecast`` (its KV cache, the
  default) on ``Toto.load_from_checkpoint``, 100 samples drawn in one batch
  (``samples_per_batch=100``, as isoprobe draws them), ``torch.quantile`` of the paths.
  isoprobe's default ``standardise`` divides each window by its scale first (row ``Toto``);
  row ``Toto raw`` (``model.standardise=false``) forecasts the raw values as the package does,
  the same distribution, whose dWQL is read against the official seed spread.
- Sundial: the published remote code's ``SundialForPrediction.generate`` (``revin=True``) on
  ``from_pretrained``, 100 paths per window in one batch, ``torch.quantile`` of the paths
  (``bench/official/sundial_pipeline.py``; the code's package named by
  ``$ISOPROBE_SUNDIAL_CODE``). Its sampled paths are the same distribution as isoprobe's (the
  fixture test draws them equal under one seed), read against the official seed spread.

TimesFM 2.5, Moirai 2.0 and TiRex sort each step's quantiles in isoprobe, where their heads
cross, and the packages return them as the heads give them: their agreement is read against the
official quantiles sorted likewise (``SORTS_QUANTILES``; unsorted, the crossings alone make it
20 to 190 on these windows). TiRex's official recurrence runs in bfloat16, isoprobe's in
float32, which its agreement shows.

A later model adds its side the same way: a ``bench/official/<name>_pipeline.py`` with
``load(checkpoint, task) -> predict``, and ``"<name>": (title, Side("<name>"))`` in ``CASES``
with its ``LENGTHS`` and ``NETWORK``.

isoprobe's side is ``ForecastModule.forecast`` of the model ``isoprobe.models.build.build_model``
builds from the composed Hydra config (``model.checkpoint=bundled``). The official side runs
under ``torch.no_grad``. Each side is called once to warm up, then the two alternate for
``--rounds`` rounds and the fastest call of each is reported; torch keeps its default threads.
Round r seeds both sides with ``SEED + r``, so sampled outputs can be compared call by call.

Agreement: the largest |isoprobe - official| over the nine quantiles (0.1 ... 0.9) of every
window and step (warm-up calls, same seed). WQL: each side's weighted quantile loss on the
windows' targets, the mean over the timed rounds' seeds; ``dWQL`` is isoprobe's relative to the
official's and ``seed spread`` the official's own (max - min) / mean over those seeds, the
Monte-Carlo noise against which a sampled model's dWQL is read. In forward: the share of one
more isoprobe forecast spent inside the network's forward passes (forward hooks on the modules
named in ``NETWORK``, and for the fast T5 sampler its ``decode_step``; only the outermost call
counts), the rest being preprocessing, sampling and quantiles.

On a GPU (``--device cuda``) both sides forecast on the first GPU (the official pipelines loaded
with ``device_map``, or moved there), each call timed between ``torch.cuda.synchronize()``; the
in-forward share reads nan there (the hooks' clocks do not see the GPU's queued work), and the
side environments' pipelines stay on the CPU.

Run: ``.venv/bin/python bench/forecast_throughput.py [--models chronos moirai --rounds 3
--device cpu]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from torch import Tensor, nn
from transformers.utils import logging as transformers_logging

from isoprobe.evaluation.forecast_metrics import wql
from isoprobe.models.build import build_model
from isoprobe.models.checkpoints import bundled_path
from isoprobe.models.chronos import t5_sampling

os.environ.setdefault("HF_HUB_OFFLINE", "1")
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
LEVELS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
WINDOWS = 64
#: per model: (context, horizon) of its windows
LENGTHS = {
    "chronos": (128, 32),
    "chronos_generate": (128, 32),
    "chronos_bolt": (144, 48),
    "chronos2": (144, 48),
    "moirai": (144, 48),
    "timesfm": (144, 48),
    "patchtst": (512, 64),
    "visionts": (144, 48),
    "time_moe": (144, 48),
    "timesfm25": (144, 48),
    "moirai2": (144, 48),
    "tirex": (144, 48),
    "toto": (144, 48),
    "toto_raw": (144, 48),
    "sundial": (144, 48),
}
#: per model: the modules whose forward calls are "the network" in isoprobe's forecast
NETWORK: dict[str, Callable[[nn.Module], list[nn.Module]]] = {
    "chronos": lambda m: [m.t5.encoder],  # and t5_sampling.decode_step, see FUNCTIONS
    "chronos_generate": lambda m: [m.t5, m.t5.encoder],  # generate runs the encoder apart
    "chronos_bolt": lambda m: [m.model],
    "chronos2": lambda m: [m.model],
    # sampler=official calls the module; sampler=horizon (the default) its parts in turn
    "moirai": lambda m: [
        m.module,
        m.module.scaler,
        m.module.in_proj,
        m.module.encoder,
        m.module.param_proj,
    ],
    "timesfm": lambda m: [m.model.decoder, m.model.horizon_ff_layer],
    "patchtst": lambda m: [m.model],
    "visionts": lambda m: [m.mae],
    "time_moe": lambda m: [m.network.model, *m.network.lm_heads],
    "timesfm25": lambda m: [m.network],
    "moirai2": lambda m: [m.network],
    "tirex": lambda m: [m.network],
    "toto": lambda m: [m.network],
    "toto_raw": lambda m: [m.network],
    # sampling calls the flow head's parts, not its forward: every module of the head counts
    "sundial": lambda m: [m.network, *m.network.head.modules()],
}
#: cases that are not a model config of their own: their model overrides
MODEL = {
    "chronos_generate": ["model=chronos", "model.sampler=generate"],
    "toto_raw": ["model=toto", "model.standardise=false"],
}
#: models whose isoprobe forecast sorts each step's quantiles (crossing ones ordered) where
#: the official pipeline returns them as its heads give them: agreement is read against the
#: official's quantiles sorted likewise (WQL is each side's own)
SORTS_QUANTILES = {"timesfm25", "moirai2", "tirex"}
#: models without a bundled checkpoint: the weights both sides use
CHECKPOINT = {"visionts": "scratch"}
#: per model: functions (module, name) that are network steps called outside a module forward
FUNCTIONS = {"chronos": [(t5_sampling, "decode_step")]}
SEED = 0
Official = Callable[[Tensor], Tensor]  # context [B, L] -> quantiles [B, 9, H]
#: the official builder of a model isoprobe is timed alone against (no official path here)
NO_OFFICIAL = None
OFFICIAL_DIR = Path(__file__).resolve().parent / "official"
#: where the side environments' pythons are given: ``--side-python NAME=PATH`` or this + NAME
SIDE_PYTHON_VARIABLE = "ISOPROBE_SIDE_PYTHON_"
#: ``--device``: cpu | cuda (set by :func:`main`)
DEVICE = "cpu"


def synchronize() -> None:
    """Wait for the GPU's queued work where the bench runs on one."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()


@dataclass(frozen=True)
class Side:
    """An official pipeline that runs in a side environment of its own, in the same bench run:
    ``bench/official/<name>_pipeline.py`` served by ``bench/official/serve.py`` (its docstring
    has the protocol) under the side environment's python, on the checkpoint isoprobe loaded."""

    name: str


class SidePipeline:
    """The served official pipeline of one model: the windows handed over once (an npz), then
    one seeded, timed call per request, while the server waits between calls; ``reason`` is
    set (one line) and nothing runs where no side python is given or it fails to load."""

    def __init__(self, side: Side, python: str | None, module, context: Tensor, out: str):
        self.process, self.reason, self.calls = None, None, 0
        self.folder = Path(out) / f"side-{side.name}"
        variable = SIDE_PYTHON_VARIABLE + side.name.upper()
        if python is None:
            self.reason = f"no side python given (--side-python {side.name}=PATH or ${variable})"
            return
        checkpoint = module.resolved_checkpoint
        if checkpoint.kind not in ("bundled", "path"):
            self.reason = f"the checkpoint is {checkpoint.describe()}, not a local directory"
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        task = self.folder / "task.npz"
        np.savez(
            task,
            context=context.cpu().numpy(),
            prediction_length=np.array(module.prediction_length),
            num_samples=np.array(getattr(module, "num_samples", 1)),
            levels=np.array(LEVELS),
        )
        self.errors = open(self.folder / "stderr.txt", "w")  # noqa: SIM115 - closed in close()
        serve = [python, str(OFFICIAL_DIR / "serve.py"), side.name, checkpoint.location, str(task)]
        self.process = subprocess.Popen(
            serve, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors, text=True
        )
        line = self.process.stdout.readline().strip()
        if line != "ready":
            self.close()
            self.reason = line.removeprefix("error: ") or f"{python} ended before it was ready"

    def __call__(self, seed: int) -> tuple[float, Tensor]:
        """Seconds of the official call seeded with ``seed`` (timed in the side process) and its
        quantiles."""
        path = self.folder / f"call-{self.calls}.npy"
        self.calls += 1
        self.process.stdin.write(f"{seed} {path}\n")
        self.process.stdin.flush()
        seconds = float(self.process.stdout.readline())
        return seconds, torch.from_numpy(np.load(path))

    def close(self) -> None:
        if self.process is not None:
            self.process.stdin.close()
            self.process.wait()
            self.errors.close()
            self.process = None


def official_chronos(module) -> Official:
    from chronos import ChronosPipeline

    pipeline = ChronosPipeline.from_pretrained(
        bundled_path("chronos-t5-mini"), dtype=torch.float32, device_map=DEVICE
    )
    samples = module.chronos_config.num_samples

    def predict(context: Tensor) -> Tensor:
        # the pipeline tokenises on the CPU (its bin edges stay there) and moves the tokens
        quantiles, _ = pipeline.predict_quantiles(
            context.cpu(), module.prediction_length, LEVELS, num_samples=samples
        )
        return quantiles.transpose(1, 2)

    return predict


def official_chronos_bolt(module) -> Official:
    from chronos import ChronosBoltPipeline

    path = bundled_path("chronos-bolt-mini")
    pipeline = ChronosBoltPipeline.from_pretrained(path, dtype=torch.float32, device_map=DEVICE)

    def predict(context: Tensor) -> Tensor:
        quantiles, _ = pipeline.predict_quantiles(context.cpu(), module.prediction_length, LEVELS)
        return quantiles.transpose(1, 2)

    return predict


def official_chronos2(module) -> Official:
    from chronos.chronos2 import Chronos2Pipeline

    path = bundled_path("chronos-2-mini")
    pipeline = Chronos2Pipeline.from_pretrained(path, dtype=torch.float32, device_map=DEVICE)

    def predict(context: Tensor) -> Tensor:
        quantiles, _ = pipeline.predict_quantiles(
            context[:, None].cpu(), module.prediction_length, LEVELS
        )
        return torch.stack([q[0] for q in quantiles]).transpose(1, 2)

    return predict


def official_moirai(module) -> Official:
    from uni2ts.model.moirai import MoiraiForecast, MoiraiModule

    forecaster = (
        MoiraiForecast(
            prediction_length=module.prediction_length,
            target_dim=1,
            feat_dynamic_real_dim=0,
            past_feat_dynamic_real_dim=0,
            context_length=module.context_length,
            module=MoiraiModule.from_pretrained(bundled_path("moirai-mini")),
            patch_size=module.patch_size,
            num_samples=module.num_samples,
        )
        .to(DEVICE)
        .eval()
    )

    def predict(context: Tensor) -> Tensor:
        nan = context.isnan()
        is_pad = nan.long().cumprod(dim=1).bool()  # the leading missing values
        samples = forecaster(context.nan_to_num(0.0)[..., None], ~nan[..., None], is_pad)
        levels = torch.tensor(LEVELS, device=samples.device)
        return torch.quantile(samples, levels, dim=1).transpose(0, 1)

    return predict


def official_timesfm(module) -> Official:
    from transformers import TimesFmModelForPrediction

    path = bundled_path("timesfm-mini")
    model = TimesFmModelForPrediction.from_pretrained(path, dtype=torch.float32).to(DEVICE).eval()

    def predict(context: Tensor) -> Tensor:
        series = [row[~row.isnan()] for row in context]
        out = model(past_values=series, freq=[module.freq_category] * len(series))
        return out.full_predictions[:, : module.prediction_length, 1:].transpose(1, 2)

    return predict


def official_patchtst(module) -> Official:
    from transformers import PatchTSTForPrediction

    path = bundled_path("patchtst-mini")
    model = PatchTSTForPrediction.from_pretrained(path, dtype=torch.float32).to(DEVICE).eval()

    def predict(context: Tensor) -> Tensor:
        point = model.generate(past_values=context[..., None]).sequences[:, :, :, 0]
        return point.expand(-1, len(LEVELS), -1)

    return predict


def official_visionts(module) -> Official | None:
    """The ``visionts`` package's forecast with ``module``'s MAE weights (published layout), or
    None where the package (and so torchvision) does not import."""
    try:
        from visionts import VisionTS, models_mae
    except (ImportError, RuntimeError):
        return None
    from functools import partial

    from isoprobe.models.visionts.mae import to_published

    shape = module.mae.shape
    model = VisionTS(load_ckpt=False)
    model.vision_model = models_mae.MaskedAutoencoderViT(
        img_size=shape.image_size,
        patch_size=shape.patch_size,
        embed_dim=shape.width,
        depth=shape.depth,
        num_heads=shape.heads,
        decoder_embed_dim=shape.decoder_width,
        decoder_depth=shape.decoder_depth,
        decoder_num_heads=shape.decoder_heads,
        mlp_ratio=shape.mlp_ratio,
        norm_layer=partial(nn.LayerNorm, eps=1e-6),
    )
    model.vision_model.load_state_dict(to_published(module.mae.state_dict()))
    model.update_config(module.context_length, module.prediction_length, module.periodicity)
    model.to(DEVICE).eval()

    def predict(context: Tensor) -> Tensor:
        return model(context[..., None])[..., 0][:, None].expand(-1, len(LEVELS), -1)

    return predict


#: per model: its name in the table and the builder of its official forecast
CASES: dict[str, tuple[str, Callable[..., Official]]] = {
    "chronos": ("Chronos-T5", official_chronos),
    "chronos_generate": ("T5 generate", official_chronos),
    "chronos_bolt": ("Chronos-Bolt", official_chronos_bolt),
    "chronos2": ("Chronos-2", official_chronos2),
    "moirai": ("Moirai", official_moirai),
    "timesfm": ("TimesFM", official_timesfm),
    "patchtst": ("PatchTST", official_patchtst),
    "visionts": ("VisionTS", official_visionts),
    "time_moe": ("Time-MoE", NO_OFFICIAL),
    "timesfm25": ("TimesFM 2.5", Side("timesfm25")),
    "moirai2": ("Moirai 2.0", Side("moirai2")),
    "tirex": ("TiRex", Side("tirex")),
    "toto": ("Toto", Side("toto")),
    "toto_raw": ("Toto raw", Side("toto")),
    "sundial": ("Sundial", Side("sundial")),
}


def build(name: str, out: str):
    """isoprobe's model of ``model=<name>`` in eval mode and one batch of the energy windows."""
    context, horizon = LENGTHS[name]
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=MODEL.get(name, [f"model={name}"])
            + [
                f"model.checkpoint={CHECKPOINT.get(name, 'bundled')}",
                "data=energy",
                f"data.context_length={context}",
                f"data.prediction_length={horizon}",
                f"data.max_eval_windows={WINDOWS}",
                f"data.eval_batch_size={WINDOWS}",
                f"paths.output_dir={out}",
            ],
        )
    datamodule = instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("test")
    batch = next(iter(datamodule.test_dataloader()))
    batch = {key: value.to(DEVICE) for key, value in batch.items()}
    return build_model(cfg.model, datamodule).to(DEVICE).eval(), batch


def timed(call: Callable[[], Tensor], seed: int = SEED) -> tuple[float, Tensor]:
    """Seconds of one call, seeded, and its output brought to the CPU (within the time: the
    official pipelines return CPU tensors)."""
    torch.manual_seed(seed)
    synchronize()
    start = time.perf_counter()
    out = call().cpu()
    synchronize()
    return time.perf_counter() - start, out


def share_in_forward(
    forecast: Callable[[], Tensor], modules: list[nn.Module], functions: list[tuple] = ()
) -> float:
    """The fraction of one ``forecast()`` spent inside the outermost forward of ``modules`` or
    call of ``functions`` ((owner, name) pairs, wrapped for the call); nan on a GPU, whose
    queued work the hooks' clocks do not see."""
    if DEVICE == "cuda":
        return float("nan")
    depth, inside, entered = [0], [0.0], [0.0]

    def pre(_module, _args):
        if depth[0] == 0:
            entered[0] = time.perf_counter()
        depth[0] += 1

    def post(_module, _args, _out):
        depth[0] -= 1
        if depth[0] == 0:
            inside[0] += time.perf_counter() - entered[0]

    def wrapped(function):
        def call(*args, **kwargs):
            pre(None, args)
            try:
                return function(*args, **kwargs)
            finally:
                post(None, args, None)

        return call

    handles = [m.register_forward_pre_hook(pre) for m in modules]
    handles += [m.register_forward_hook(post) for m in modules]
    originals = [(owner, name, getattr(owner, name)) for owner, name in functions]
    for owner, name, function in originals:
        setattr(owner, name, wrapped(function))
    try:
        total, _ = timed(forecast)
    finally:
        for handle in handles:
            handle.remove()
        for owner, name, function in originals:
            setattr(owner, name, function)
    return inside[0] / total


def official_calls(
    name: str, module, context: Tensor, out: str, side_python: dict[str, str]
) -> tuple[Callable[[int], tuple[float, Tensor]] | None, str | None, Callable[[], None]]:
    """The official side of ``name``: a seeded, timed call (None where it cannot run here),
    why it cannot (one line, or None), and what ends it."""
    make_official = CASES[name][1]
    if isinstance(make_official, Side):
        variable = SIDE_PYTHON_VARIABLE + make_official.name.upper()
        python = side_python.get(make_official.name, os.environ.get(variable))
        side = SidePipeline(make_official, python, module, context, out)
        return (side if side.reason is None else None), side.reason, side.close
    official = make_official(module)
    if official is None:
        return None, "the official package does not import beside isoprobe", lambda: None

    def theirs() -> Tensor:
        with torch.no_grad():
            return official(context)

    return (lambda seed: timed(theirs, seed)), None, lambda: None


def compare(name: str, rounds: int, out: str, side_python: dict[str, str]) -> dict:
    title, make_official = CASES[name]
    module, batch = build(name, out)
    if make_official is NO_OFFICIAL:
        return timed_alone(title, module, batch, rounds, NETWORK[name](module))
    context, target = batch["context"], batch["target"].cpu()

    def ours() -> Tensor:
        return module.forecast(batch).quantiles

    theirs, reason, close = official_calls(name, module, context, out, side_python)
    our_times, their_times, our_wql, their_wql = [], [], [], []
    try:
        _, our_out = timed(ours)
        their_out = torch.full_like(our_out, float("nan"))
        if theirs is not None:
            _, their_out = theirs(SEED)
            if name in SORTS_QUANTILES:
                their_out = their_out.sort(dim=1).values
        for round_ in range(rounds):
            if theirs is not None:
                seconds, quantiles = theirs(SEED + round_)
                their_times.append(seconds)
                their_wql.append(wql(quantiles, target, LEVELS).item())
            seconds, quantiles = timed(ours, SEED + round_)
            our_times.append(seconds)
            our_wql.append(wql(quantiles, target, LEVELS).item())
    finally:
        close()
    nan = float("nan")
    their_mean = sum(their_wql) / rounds if theirs is not None else nan
    return {
        "model": title,
        "windows": f"{len(context)} x {context.shape[1]}/{module.prediction_length}",
        "isoprobe": min(our_times),
        "official": min(their_times) if theirs is not None else nan,
        "agreement": (our_out - their_out).abs().max().item(),
        "wql": (sum(our_wql) / rounds, their_mean),
        "seed_spread": (max(their_wql) - min(their_wql)) / their_mean if their_wql else nan,
        "forward": share_in_forward(ours, NETWORK[name](module), FUNCTIONS.get(name, [])),
        "rounds": (our_times, their_times),
        "reason": reason,
    }


def timed_alone(title: str, module, batch, rounds: int, network: list[nn.Module]) -> dict:
    """isoprobe's row for a model whose official code cannot run here: its times and WQL."""

    def ours() -> Tensor:
        return module.forecast(batch).quantiles

    timed(ours)
    runs = [timed(ours, SEED + round_) for round_ in range(rounds)]
    losses = [wql(quantiles, batch["target"].cpu(), LEVELS).item() for _, quantiles in runs]
    context = batch["context"]
    return {
        "model": title,
        "windows": f"{len(context)} x {context.shape[1]}/{module.prediction_length}",
        "isoprobe": min(seconds for seconds, _ in runs),
        "official": None,
        "wql": (sum(losses) / rounds, None),
        "forward": share_in_forward(ours, network),
        "rounds": ([seconds for seconds, _ in runs], []),
    }


def print_table(rows: list[dict]) -> None:
    header = (
        f"{'model':<13}{'windows':>15}{'isoprobe s':>12}{'official s':>12}{'ratio':>8}"
        f"{'agreement':>11}{'WQL':>8}{'off. WQL':>10}{'dWQL':>8}{'seed spread':>13}"
        f"{'in forward':>12}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        ours, theirs = r["wql"]
        if r["official"] is None:
            print(
                f"{r['model']:<13}{r['windows']:>15}{r['isoprobe']:>12.4f}{'n/a':>12}{'':>8}"
                f"{'':>11}{ours:>8.4f}{'n/a':>10}{'':>8}{'':>13}{r['forward']:>11.0%}"
            )
            continue
        print(
            f"{r['model']:<13}{r['windows']:>15}{r['isoprobe']:>12.4f}{r['official']:>12.4f}"
            f"{r['official'] / r['isoprobe']:>7.2f}x{r['agreement']:>11.2g}"
            f"{ours:>8.4f}{theirs:>10.4f}{ours / theirs - 1:>+8.2%}{r['seed_spread']:>13.2%}"
            f"{r['forward']:>11.0%}"
        )
    print(
        "ratio = official s / isoprobe s (target >= 1.2x); in forward: target >= 80%; "
        "dWQL: isoprobe's WQL relative to the official's, mean over the rounds' seeds"
    )
    for r in rows:
        ours, theirs = ([f"{t:.4f}" for t in ts] for ts in r["rounds"])
        print(f"  {r['model']}: isoprobe {ours}, official {theirs}")
    for r in rows:
        if r.get("reason"):
            print(f"  {r['model']}: official nan: {r['reason']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--rounds", type=int, default=3, help="alternating timed calls of each")
    parser.add_argument(
        "--side-python",
        nargs="+",
        default=[],
        metavar="NAME=PATH",
        help=f"the python of a side environment with a model's official package (else "
        f"${SIDE_PYTHON_VARIABLE}<NAME>), e.g. toto=/tmp/toto-side/bin/python",
    )
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where both sides forecast (cuda: the first GPU; the side environments' pipelines "
        "stay on the CPU)",
    )
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    side_python = dict(pair.split("=", 1) for pair in args.side_python)
    if not set(side_python) <= set(CASES):
        parser.error(f"--side-python names no model of {sorted(CASES)}")
    transformers_logging.disable_progress_bar()
    where = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU"
    print(
        f"torch {torch.__version__} on {where}, {torch.get_num_threads()} threads, load average "
        f"{os.getloadavg()[0]:.2f}; best of {args.rounds} alternating calls after one warm-up"
    )
    with tempfile.TemporaryDirectory() as out:
        rows = [compare(name, args.rounds, out, side_python) for name in args.models]
    print_table(rows)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
