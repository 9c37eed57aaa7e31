#!/usr/bin/env bash
# The GPU checks in one command, for when a machine with NVIDIA GPUs is at hand:
#   1. the default run (README command 1) on one GPU, timed;
#   2. the probe of the bundled Chronos-T5 under DDP on two GPUs against one process
#      (bench/probe_tables_agree.py); with one GPU, the probe on it against the CPU's instead;
#   3. bench/forecast_throughput.py and bench/train_throughput.py (compiled training too) on
#      the GPU.
# It prints one line per figure, ready for docs/benchmarks.md with the card's name. About five
# minutes on one H100-class GPU.
#
#   bash bench/gpu.sh            # on the GPU machine, after bash scripts/setup.sh
#   bash bench/gpu.sh --dry-run  # the same steps on the CPU (two gloo processes for DDP, fewer
#                                # bench models and steps): checks the script without a GPU
#
# PYTHON (default .venv/bin/python) names the interpreter; GPU_CHECK_DIR (default a new
# temporary directory) keeps each step's output and log.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${GPU_CHECK_DIR:-$(mktemp -d)}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"

if [ "${1:-}" = "--dry-run" ]; then
  device=cpu one=(trainer=cpu) two=(trainer=ddp_sim) nproc=2 card="CPU (dry run)"
  bench_rounds=1 forecast_models=(patchtst chronos_bolt) train=(--models chronos2 --steps 2
    --rounds 1)
else
  gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())") || exit 1
  if [ "$gpus" -lt 1 ]; then
    echo "bench/gpu.sh: $PY sees no CUDA device (torch.cuda.device_count() is 0)." \
      "Run it on a GPU machine, or with --dry-run to check the script on the CPU." >&2
    exit 1
  fi
  device=cuda one=(trainer=gpu) two=(trainer=ddp trainer.devices=2) nproc=$gpus
  card=$("$PY" -c "import torch; print(torch.cuda.get_device_name())")
  bench_rounds=3 forecast_models=(chronos chronos_bolt chronos2 patchtst timesfm moirai)
  train=(--models chronos chronos2 --steps 8 --rounds 1 --compile)
fi
echo "bench/gpu.sh on $card, $(date -u +%Y-%m-%d), outputs in $OUT"
failed=0

# step NAME COMMAND...: run COMMAND with its output in $OUT/NAME.log; print its exit and time
step() {
  local name=$1 start end rc
  shift
  start=$(date +%s.%N)
  "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  printf '%s: exit %d in %.1f s (log %s)\n' "$name" "$rc" "$(awk "BEGIN {print $end - $start}")" \
    "$OUT/$name.log"
  [ "$rc" -eq 0 ] || { failed=1; tail -n 20 "$OUT/$name.log"; }
  return "$rc"
}

# 1. README command 1 on one device
if step default_run "$PY" run.py model=chronos data=energy "${one[@]}" logger=csv \
  "hydra.run.dir=$OUT/default_run"; then
  grep -A 3 "^forecast (test)" "$OUT/default_run.log"
fi

# 2. the probe under DDP on two devices equals one process's on the same weights
probe=(task=probe model=chronos model.checkpoint=bundled data=energy task.evaluate_before=false
  logger=csv)
if [ "$nproc" -ge 2 ]; then
  step probe_one "$PY" run.py "${probe[@]}" "${one[@]}" "hydra.run.dir=$OUT/probe_one" &&
    step probe_ddp "$PY" -m torch.distributed.run --standalone --nproc-per-node=2 run.py \
      "${probe[@]}" "${two[@]}" "hydra.run.dir=$OUT/probe_ddp" &&
    step probe_agree "$PY" bench/probe_tables_agree.py "$OUT/probe_one" "$OUT/probe_ddp" &&
    cat "$OUT/probe_agree.log"
else
  echo "probe under DDP: skipped, $nproc GPU (two are needed; NCCL gives each process its own)"
  step probe_gpu "$PY" run.py "${probe[@]}" "${one[@]}" "hydra.run.dir=$OUT/probe_gpu" &&
    step probe_cpu "$PY" run.py "${probe[@]}" trainer=cpu "hydra.run.dir=$OUT/probe_cpu" &&
    step probe_gpu_cpu "$PY" bench/probe_tables_agree.py "$OUT/probe_gpu" "$OUT/probe_cpu" &&
    cat "$OUT/probe_gpu_cpu.log"
fi

# 3. the benches, each against its reference in the same run
step forecast_bench "$PY" bench/forecast_throughput.py --device "$device" \
  --rounds "$bench_rounds" --models "${forecast_models[@]}" &&
  grep -E "x  |^model|load average" "$OUT/forecast_bench.log"
step train_bench "$PY" bench/train_throughput.py --device "$device" --warmup 2 "${train[@]}" &&
  grep -E "reference|isoprobe" "$OUT/train_bench.log"

exit "$failed"
