#!/usr/bin/env bash
# Pipeline smoke run on every visible GPU: learner on cuda:0, one worker on each other GPU (with a
# single GPU, learner and one worker share it). Prints throughput and lag; finishes in minutes.
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
$PY launch/train.py --devices "$devices" --num-workers "$workers" --max-steps 12 --tasks-per-step 16 \
  --num-samples-per-task 8 --eval-limit 64 --output-dir "$out" --run-name smoke --no-save-model "$@" | tee "$out/log.txt"
$PY - "$out/smoke" <<'PY'
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1]); acc.Reload()
tags = acc.Tags()["scalars"]
for tag in ["perf/episodes_per_s", "perf/gen_tokens_per_s", "perf/train_tokens_per_s", "perf/step_s",
            "pipeline/policy_lag_mean", "pipeline/policy_lag_max", "pipeline/learner_wait_frac",
            "pipeline/worker_wait_frac", "pipeline/weight_publish_s", "pipeline/weight_load_s", "pipeline/stale_dropped"]:
    if tag in tags:
        v = [e.value for e in acc.Scalars(tag)][1:] or [e.value for e in acc.Scalars(tag)]
        print(f"{tag:32s} mean {sum(v) / len(v):10.3f}  last {v[-1]:10.3f}")
PY
