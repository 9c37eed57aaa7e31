"""Fine-tuning throughput of isoprobe against the reference trainer, side by side in one run.

Chronos-T5: the reference is a ``transformers.Trainer`` set up as chronos-forecasting's
training script sets it up (the series tokenised by the Chronos tokenizer in the data set, so in
the data loader; AdamW, constant learning rate, fp32, no evaluation); isoprobe is
``ChronosT5Module`` in a Lightning ``Trainer`` (the default run's loop: tokenised in the step).
Same model shape (T5 d_model 256, 4 + 4 layers, 4096 tokens, from the same random init), same
KernelSynth windows (context 512, horizon 64, batch 32), same optimiser. Each trainer runs
``--warmup`` steps, then ``--steps`` timed steps; samples/s = timed steps x batch / wall time
from the end of the warm-up to the end of the last step (data loading included). The two
alternate for ``--rounds`` rounds and the best of each is reported, so that a burst of other
load on the machine does not decide the ratio.

Chronos-2: the reference is the official fine-tuning entry point, ``Chronos2Pipeline.fit``
(its ``Chronos2Dataset`` batches in the data loader, a ``transformers`` Trainer); isoprobe is
``Chronos2Module`` in Lightning. Same shape (the bundled ``mini``: d_model 128, 4 layers), same
random init, the same KernelSynth windows (each given to ``fit`` as a 576-step series with
``min_past=512``, so it cuts exactly that window), batch 32, AdamW (``optim="adamw_torch"`` for
the reference, torch's AdamW for isoprobe), learning rate 1e-3.

Chronos-2 with LoRA (``--models chronos2_lora``): the same, ``fit(finetune_mode="lora")`` with
its default adapters against ``model.adapt=lora`` (whose defaults are that fit's: r 8, alpha 16,
q/k/v/o of the self- and group attention and the head's output layer). Both start from the same
seeded random base weights; the adapters start as each library initialises them.

Precision (``--precisions``): isoprobe runs once per Lightning ``trainer.precision`` in each
round; the reference stays in float32, as chronos-forecasting's script runs on a CPU (its tf32
setting is a CUDA one). By default ``32-true`` and, where the CPU has bfloat16 instructions
(AVX512-BF16 or AMX), ``bf16-mixed`` (``torch.autocast`` on the CPU). For a precision other
than ``32-true`` the bench prints its effect on the forecast: the WQL, on the first batch of
validation windows, of the model trained in that precision against the one trained in float32
from the same init on the same batches (both forecasting in float32; the mean over
``EVAL_SEEDS`` seeds), beside float32's own seed-to-seed spread, the Monte-Carlo noise a sampled
model's difference is read against.

Compiled training (``--compile``): isoprobe also runs in float32 with ``model.compile=true``
(the loss compiled by ``torch.compile``, inductor) each round, printed twice: compile time
excluded (the timed steps after the warm-up, whose first step compiles) and included (every
step from the start of training, the first one's compilation with it).

Device (``--device cuda``): both trainers on the first GPU (isoprobe's Lightning
``accelerator="gpu"``, the reference's Trainer without ``use_cpu``), each step's clock read
after ``torch.cuda.synchronize()``; ``bf16-mixed`` is timed where the GPU supports bfloat16.

Run: ``.venv/bin/python bench/train_throughput.py [--models chronos chronos2 --steps 8
--warmup 2 --rounds 2 --precisions 32-true bf16-mixed --compile --device cpu]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from lightning.pytorch import Callback
from omegaconf import OmegaConf
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

from isoprobe.evaluation.forecast_metrics import wql
from isoprobe.models.build import build_model

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
CHRONOS2_SHAPE = ["model.checkpoint=scratch", "model.size=mini"]
SHAPE = [
    "model.checkpoint=scratch",
    "model.sizes.mini.d_model=256",
    "model.sizes.mini.d_kv=64",
    "model.sizes.mini.d_ff=1024",
    "model.sizes.mini.num_layers=4",
    "model.sizes.mini.num_decoder_layers=4",
    "model.sizes.mini.vocab_size=4096",
    "model.sizes.mini.chronos_config.n_tokens=4096",
    "model.sizes.mini.chronos_config.context_length=512",
    "model.sizes.mini.chronos_config.prediction_length=64",
]
DATA = [
    "data=kernelsynth/mixed",
    "data.context_length=512",
    "data.prediction_length=64",
    "data.batch_size=32",
    "data.dataset_kwargs.num_series=100",
]
LR = 1e-3
EXACT = "32-true"
EVAL_SEEDS = (0, 1, 2)
#: ``--device``: cpu | cuda (set by :func:`main`)
DEVICE = "cpu"


def now() -> float:
    """Wall-clock seconds, after the GPU's queued work where the bench runs on one."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


class StepClock:
    """Wall-clock time at the end of every optimiser step."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def samples_per_second(self, warmup: int, batch: int) -> float:
        timed = self.ends[warmup:]
        return (len(timed) - 1) * batch / (timed[-1] - timed[0])


class LightningClock(Callback, StepClock):
    def __init__(self) -> None:
        StepClock.__init__(self)
        self.start = 0.0

    def on_train_start(self, trainer, pl_module) -> None:
        self.start = now()

    def samples_per_second_from_start(self, batch: int) -> float:
        """Every step from the start of training, the first one's compilation included."""
        return len(self.ends) * batch / (self.ends[-1] - self.start)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.ends.append(now())


class HFClock(TrainerCallback, StepClock):
    def __init__(self) -> None:
        StepClock.__init__(self)

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(now())


class TokenisedWindows(Dataset):
    """The data module's windows, tokenised per item by the Chronos tokenizer (as
    chronos-forecasting's training data set does), in the fields T5 takes."""

    def __init__(self, windows: Dataset, tokenizer) -> None:
        self.windows, self.tokenizer = windows, tokenizer

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        item = self.windows[index]
        ids, mask, scale = self.tokenizer.context_input_transform(item["context"][None])
        labels, label_mask = self.tokenizer.label_input_transform(item["target"][None], scale)
        labels[~label_mask] = -100
        return {"input_ids": ids[0], "attention_mask": mask[0], "labels": labels[0]}


def build(out: str, model: str = "chronos", shape: list[str] = SHAPE):
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                f"model={model}",
                *shape,
                *DATA,
                f"model.optimizer.lr={LR}",
                "model.optimizer.weight_decay=0.0",
                f"paths.output_dir={out}",
            ],
        )
    L.seed_everything(cfg.seed)
    datamodule = instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    return cfg, datamodule


def bf16_supported(device: str) -> bool:
    """Whether ``device`` has bfloat16 matrix instructions (on a CPU: AVX512-BF16 or AMX)."""
    if device == "cuda":
        return torch.cuda.is_bf16_supported()
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def isoprobe_throughput(
    model, datamodule, steps: int, warmup: int, precision: str = EXACT
) -> float:
    return isoprobe_clock(model, datamodule, steps, warmup, precision).samples_per_second(
        warmup, datamodule.batch_size
    )


def isoprobe_clock(
    model, datamodule, steps: int, warmup: int, precision: str = EXACT
) -> LightningClock:
    """The step clock of ``steps + warmup`` training steps of ``model`` in Lightning."""
    clock = LightningClock()
    trainer = L.Trainer(
        accelerator="gpu" if DEVICE == "cuda" else "cpu",
        devices=1,
        precision=precision,
        max_steps=steps + warmup,
        callbacks=[clock],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    trainer.fit(model, train_dataloaders=datamodule.train_dataloader())
    return clock


def chronos_reference_throughput(model, datamodule, steps: int, warmup: int, out: str):
    """A ``transformers.Trainer`` on the T5 inside ``model``, set up as chronos' script."""
    clock = HFClock()
    args = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=datamodule.batch_size,
        learning_rate=LR,
        lr_scheduler_type="constant",
        optim="adamw_torch",
        weight_decay=0.0,
        max_steps=steps + warmup,
        logging_strategy="no",
        save_strategy="no",
        report_to=[],
        use_cpu=DEVICE == "cpu",
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    data = TokenisedWindows(datamodule.train_dataset, model.tokenizer)
    Trainer(model=model.t5.train(), args=args, train_dataset=data, callbacks=[clock]).train()
    return clock.samples_per_second(warmup, datamodule.batch_size)


def chronos2_reference_throughput(
    model, datamodule, steps: int, warmup: int, out: str, finetune_mode: str = "full"
):
    """``Chronos2Pipeline.fit`` on the data module's training windows, each a whole series."""
    from chronos.chronos2 import Chronos2Pipeline

    windows = datamodule.train_dataset
    series = [
        torch.cat([windows[i]["context"], windows[i]["target"]])
        for i in range(min(len(windows), 1024))
    ]
    clock = HFClock()
    Chronos2Pipeline(model.model).fit(
        series,
        prediction_length=datamodule.prediction_length,
        context_length=datamodule.context_length,
        min_past=datamodule.context_length,
        learning_rate=LR,
        num_steps=steps + warmup,
        batch_size=datamodule.batch_size,
        output_dir=out,
        callbacks=[clock],
        remove_printer_callback=True,
        optim="adamw_torch",
        disable_tqdm=True,
        logging_strategy="no",
        finetune_mode=finetune_mode,
    )
    return clock.samples_per_second(warmup, datamodule.batch_size)


def chronos2_lora_reference_throughput(model, datamodule, steps: int, warmup: int, out: str):
    """``Chronos2Pipeline.fit(finetune_mode="lora")`` with its default adapters."""
    return chronos2_reference_throughput(model, datamodule, steps, warmup, out, "lora")


def compare(name, shape, reference, weights, args, out, adapt: str = "full") -> None:
    """Alternate the reference and isoprobe ``args.rounds`` times from one random init; with
    ``adapt`` other than full, isoprobe's model is adapted so (the reference adapts its own).
    Targets: 1.2x for full fine-tuning, 1.0x with LoRA."""
    target = "1.2" if adapt == "full" else "1.0"
    cfg, datamodule = build(out, name, shape)
    init = {
        k: v.clone() for k, v in weights(build_model(cfg.model, datamodule)).state_dict().items()
    }

    def fresh(adapt: str = "full"):
        if adapt != "full":
            L.seed_everything(cfg.seed)  # the same base weights as the reference's init
            return build_model(OmegaConf.merge(cfg.model, {"adapt": adapt}), datamodule)
        model = build_model(cfg.model, datamodule)
        weights(model).load_state_dict(init)
        return model

    ref_runs, our_runs = [], {precision: [] for precision in args.precisions}
    compiled_runs: list[tuple[float, float]] = []
    trained = {}
    for _ in range(args.rounds):
        if args.compile:
            L.seed_everything(cfg.seed)
            model = fresh(adapt)
            model.compile_training = True
            clock = isoprobe_clock(model, datamodule, args.steps, args.warmup)
            batch = datamodule.batch_size
            compiled_runs.append(
                (
                    clock.samples_per_second(args.warmup, batch),
                    clock.samples_per_second_from_start(batch),
                )
            )
        ref_runs.append(reference(fresh(), datamodule, args.steps, args.warmup, out))
        for precision, runs in our_runs.items():
            L.seed_everything(cfg.seed)  # the same batches and dropout draws for each precision
            trained[precision] = fresh(adapt)
            runs.append(
                isoprobe_throughput(
                    trained[precision], datamodule, args.steps, args.warmup, precision
                )
            )
    ref = max(ref_runs)
    print(f"  reference: {ref:8.2f} samples/s (float32)")
    for precision, runs in our_runs.items():
        ours = max(runs)
        print(
            f"  isoprobe {precision}: {ours:8.2f} samples/s, {ours / ref:.2f}x the reference "
            f"(target >= {target}x); rounds {[round(r, 2) for r in runs]}"
        )
    if compiled_runs:
        excluded, included = (max(runs) for runs in zip(*compiled_runs, strict=True))
        print(
            f"  isoprobe {EXACT} compiled: {excluded:8.2f} samples/s compile excluded, "
            f"{excluded / ref:.2f}x the reference; {included:8.2f} samples/s compile included "
            f"({args.steps + args.warmup} steps), {included / ref:.2f}x; rounds (excluded, "
            f"included) {[(round(e, 2), round(i, 2)) for e, i in compiled_runs]} (a later round "
            "may find the first one's compiled code in the inductor cache)"
        )
    print(
        f"  reference rounds {[round(r, 2) for r in ref_runs]}; best of {args.rounds} "
        f"alternating rounds; load average {os.getloadavg()[0]:.2f}"
    )
    if EXACT in trained:
        print_wql_effect(trained, datamodule)


def validation_wql(model, batch, seed: int) -> float:
    """WQL of ``model``'s float32 forecast of ``batch``, seeded."""
    torch.manual_seed(seed)
    device = next(model.parameters()).device
    forecast = model.eval().forecast({k: v.to(device) for k, v in batch.items()})
    return wql(forecast.quantiles.cpu(), batch["target"], model.quantile_levels).item()


def print_wql_effect(trained: dict, datamodule) -> None:
    """Each precision's validation WQL against the float32-trained model's (:data:`EVAL_SEEDS`
    mean), and float32's own seed spread ((max - min) / mean over the seeds)."""
    batch = next(iter(datamodule.val_dataloader()))
    losses = {p: [validation_wql(m, batch, s) for s in EVAL_SEEDS] for p, m in trained.items()}
    exact = sum(losses[EXACT]) / len(EVAL_SEEDS)
    spread = (max(losses[EXACT]) - min(losses[EXACT])) / exact
    for precision, values in losses.items():
        if precision != EXACT:
            mean = sum(values) / len(values)
            print(
                f"  WQL after training, {precision}: {mean:.4f} against {exact:.4f} in "
                f"{EXACT} ({mean / exact - 1:+.2%}; {EXACT}'s seed spread {spread:.2%}; "
                f"{len(batch['target'])} validation windows)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=["chronos", "chronos2", "chronos2_lora"],
        choices=["chronos", "chronos2", "chronos2_lora"],
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per trainer")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs of each")
    parser.add_argument(
        "--precisions",
        nargs="+",
        help="isoprobe's trainer.precision values, each timed every round (default: 32-true, "
        "and bf16-mixed where the device has bfloat16 instructions)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also time isoprobe in float32 with model.compile=true (inductor)",
    )
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    if args.precisions is None:
        args.precisions = [EXACT, "bf16-mixed"] if bf16_supported(DEVICE) else [EXACT]
    where = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU"
    print(
        f"torch {torch.__version__} on {where}, {torch.get_num_threads()} threads, load "
        f"average {os.getloadavg()[0]:.2f}"
    )
    with tempfile.TemporaryDirectory() as out:
        if "chronos" in args.models:
            print(
                "Chronos-T5 (d_model 256, 4+4 layers, 4096 tokens, context 512, horizon 64, "
                "batch 32); reference: transformers.Trainer in the chronos training set-up"
            )
            compare("chronos", SHAPE, chronos_reference_throughput, lambda m: m.t5, args, out)
        if "chronos2" in args.models:
            print(
                "Chronos-2 (mini: d_model 128, 4 layers, context 512, horizon 64, batch 32); "
                "reference: Chronos2Pipeline.fit"
            )
            compare(
                "chronos2",
                CHRONOS2_SHAPE,
                chronos2_reference_throughput,
                lambda m: m.model,
                args,
                out,
            )
        if "chronos2_lora" in args.models:
            print(
                "Chronos-2 LoRA (the same; r 8, alpha 16); "
                'reference: Chronos2Pipeline.fit(finetune_mode="lora")'
            )
            compare(
                "chronos2",
                CHRONOS2_SHAPE,
                chronos2_lora_reference_throughput,
                lambda m: m.model,
                args,
                out,
                adapt="lora",
            )


if __name__ == "__main__":
    main()
