#!/usr/bin/env bash
# Every GPU check, in one command that fits a 10-minute slot on one GPU; each check has its own time
# limit and a check that fails or runs out does not stop the next. In order:
#   tests    the tests that only run on a GPU: CUDA-graph replay after a reload (slot engine), torn reads
#            and GPU memory released through CUDA IPC (weights), device-sized micro-batches, TF32/fused AdamW
#   bench    launch/bench.py --gpu: decode ms/step vs rows (eager vs graphs), rollout tokens/s for the
#            default model (when installed) and the presets, the transformers reference, the replayed-step
#            upper bound, GPU busy fraction, capture time, greedy agreement, the update (fp32/TF32/bf16,
#            MFU) and the weight publish + load beside one copy
#   steps    serial vs pipeline step time on the GPUs (learner and one worker sharing cuda:0 on one GPU)
#   ranks    with 2 GPUs or more: the learner as 2 ranks, DDP and FSDP
# Figures and logs go to $OUT when set (else a temporary folder).
#   bash launch/gpu_smoke.sh                      # everything
#   CHECKS="bench" bash launch/gpu_smoke.sh       # some of it (tests bench steps ranks)
#   SMOKE_MODEL=preset:qwen2.5-0.5b bash launch/gpu_smoke.sh [extra train.py flags]
#   WHEELS=dir bash launch/gpu_smoke.sh           # offline machine: install the wheels in dir first (into
#                                                 # a temporary folder put on PYTHONPATH, nothing system-wide)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
if [ -n "${WHEELS:-}" ]; then
  site=$(mktemp -d)
  trap 'rm -rf "$site"' EXIT
  $PY -m pip install -q --no-index --no-deps --no-compile --target "$site" "$WHEELS"/*.whl || exit 1
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's nanorllm, installed or not
n=$($PY -c "import torch; print(torch.cuda.device_count())")
if [ "$n" -lt 1 ]; then echo "no GPU visible" >&2; exit 1; fi
devices=$(seq -s, 0 $((n - 1)) | sed 's/\([0-9]\+\)/cuda:\1/g')
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
checks=${CHECKS:-tests bench steps ranks}
limit=${SMOKE_LIMIT_S:-75}  # seconds per training run
# The default model when its package is installed, else a random-weight model of its shapes (speed only).
model=${SMOKE_MODEL:-$($PY -c "from nanorllm.policy.models import smollm2_gguf_dir as d
try: d(); print('smollm2-135m-instruct')
except Exception: print('preset:smollm2-135m')" 2>/dev/null || echo preset:smollm2-135m)}
failed=()

check() {  # check NAME SECONDS COMMAND...: run it under its limit, log it, remember a failure
  local name=$1 seconds=$2
  shift 2
  echo "[gpu_smoke] $name (limit ${seconds}s): $*"
  local t0=$SECONDS
  timeout "$seconds" "$@" 2>&1 | tee "$out/$name.txt"
  local rc=${PIPESTATUS[0]}
  echo "[gpu_smoke] $name: exit $rc in $((SECONDS - t0)) s"
  [ "$rc" -eq 0 ] || failed+=("$name:$rc")
}

run_figures() {  # the run's mean figures from its TensorBoard events
  $PY - "$out/$1" <<'PY'
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1]); acc.Reload()
tags = acc.Tags()["scalars"]
for tag in ["perf/step_s", "perf/rollout_s", "perf/train_s", "perf/gen_tokens_per_s", "perf/train_tokens_per_s",
            "perf/graphs", "perf/pad_frac", "pipeline/policy_lag_mean", "pipeline/learner_wait_frac",
            "pipeline/weight_publish_s", "pipeline/weight_load_s", "perf/gather_s"]:
    if tag in tags:
        v = [e.value for e in acc.Scalars(tag)][1:] or [e.value for e in acc.Scalars(tag)]
        print(f"{tag:32s} mean {sum(v) / len(v):10.4f}  last {v[-1]:10.4f}")
PY
}

train() {  # train NAME [train.py flags]: 6 steps of 32 tasks x 8 samples, then its figures
  local name=$1
  shift
  check "$name" "$limit" $PY launch/train.py --model "$model" --devices "$devices" --max-steps 6 \
    --tasks-per-step 32 --num-samples-per-task 8 --max-batch-episodes 256 --eval-limit 16 --output-dir "$out" \
    --run-name "$name" --no-save-model "$@"
  [ -d "$out/$name" ] && run_figures "$name" | tee -a "$out/$name.txt"
}

for c in $checks; do
  case $c in
    tests) check tests 100 $PY -m pytest -q -p no:cacheprovider tests/test_slot_batch.py tests/test_weights.py \
             tests/test_micro_batches.py tests/test_precision.py ;;
    bench) check bench 330 $PY launch/bench.py --gpu --json "$out/bench_gpu.json" ;;
    steps) train steps-serial --serial --dtype bf16 "$@"
           train steps-pipeline --num-workers $(( n > 1 ? n - 1 : 1 )) --dtype bf16 "$@" ;;
    ranks) if [ "$n" -ge 2 ]; then
             train ranks-ddp --num-workers $(( n > 2 ? n - 2 : 1 )) --learner-devices 2 "$@"
             train ranks-fsdp --num-workers $(( n > 2 ? n - 2 : 1 )) --learner-devices 2 --learner-parallel fsdp "$@"
           fi ;;
    *) echo "unknown check $c (tests bench steps ranks)" >&2; exit 2 ;;
  esac
done
echo "[gpu_smoke] figures and logs in $out"
if [ ${#failed[@]} -gt 0 ]; then echo "[gpu_smoke] failed: ${failed[*]}" >&2; exit 1; fi
