#!/usr/bin/env bash
# Pipeline smoke run on every visible GPU: learner on cuda:0, one worker on each other GPU (with a
# single GPU, learner and one worker share it), once with the eager decode and once with
# --compile-decode (static KV cache, compiled decode step, CUDA graphs); then the compiled-decode
# figure of launch/bench.py. Prints throughput and lag of both runs; finishes in minutes.
#   bash launch/gpu_smoke.sh [extra train.py flags]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
n=$($PY -c "import torch; print(torch.cuda.device_count())")
if [ "$n" -lt 1 ]; then echo "no GPU visible" >&2; exit 1; fi
devices=$(seq -s, 0 $((n - 1)) | sed 's/\([0-9]\+\)/cuda:\1/g')
workers=$(( n > 1 ? n - 1 : 1 ))
out=$(mktemp -d)
echo "[gpu_smoke] $n GPU(s): devices $devices, $workers worker(s)"
for run in eager compiled; do
  flags=()
  if [ "$run" = compiled ]; then flags=(--compile-decode); fi
  echo "[gpu_smoke] $run decode"
  $PY launch/train.py --devices "$devices" --num-workers "$workers" --max-steps 12 --tasks-per-step 16 \
    --num-samples-per-task 8 --eval-limit 64 --output-dir "$out" --run-name "$run" --no-save-model \
    "${flags[@]}" "$@" | tee "$out/$run.txt"
done
$PY - "$out/eager" "$out/compiled" <<'PY'
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
runs = []
for path in sys.argv[1:]:
    acc = EventAccumulator(path); acc.Reload()
    runs.append(acc)
print(f"{'(mean after the first step)':32s} {'eager':>10s} {'compiled':>10s}")
for tag in ["perf/episodes_per_s", "perf/gen_tokens_per_s", "perf/rollout_s", "perf/train_tokens_per_s", "perf/step_s",
            "pipeline/policy_lag_mean", "pipeline/policy_lag_max", "pipeline/learner_wait_frac",
            "pipeline/worker_wait_frac", "pipeline/weight_publish_s", "pipeline/weight_load_s", "pipeline/stale_dropped"]:
    means = []
    for acc in runs:
        v = [e.value for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []
        v = v[1:] or v
        means.append(f"{sum(v) / len(v):10.3f}" if v else f"{'-':>10s}")
    print(f"{tag:32s} {means[0]} {means[1]}")
PY
$PY launch/bench.py --compile-decode --json "$out/compile_decode.json"
