#!/usr/bin/env bash
# Pipeline smoke run on every visible GPU: learner on cuda:0, one worker on each other GPU (with a
# single GPU, learner and one worker share it); the same with eager decode steps (--no-cuda-graphs);
# then, with 2 GPUs or more, the learner as 2 ranks (--learner-devices 2: cuda:0 and cuda:1 over NCCL,
# workers on the rest, or sharing cuda:0 with 2 GPUs), once as DDP replicas and once sharded
# (--learner-parallel fsdp); then the decode engine's figures (launch/bench.py --gpu); last the weight
# broadcast's GPU tests and figure (CUDA IPC). Prints throughput, train time, lag (and the FSDP weight
# gather) per run; every check has its own time limit; figures and logs go to $OUT when set (else a
# temporary folder).
#   bash launch/gpu_smoke.sh [extra train.py flags]
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's nanorllm, installed or not
PY=${PYTHON:-python}
n=$($PY -c "import torch; print(torch.cuda.device_count())")
if [ "$n" -lt 1 ]; then echo "no GPU visible" >&2; exit 1; fi
devices=$(seq -s, 0 $((n - 1)) | sed 's/\([0-9]\+\)/cuda:\1/g')
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
limit=${SMOKE_LIMIT_S:-300}  # seconds per training check

smoke() {  # smoke NAME WORKERS [train.py flags]: one run, then its mean figures from TensorBoard
  local name=$1 workers=$2
  shift 2
  echo "[gpu_smoke] $name: devices $devices, $workers worker(s) $*"
  timeout "$limit" $PY launch/train.py --devices "$devices" --num-workers "$workers" --max-steps 12 --tasks-per-step 16 \
    --num-samples-per-task 8 --eval-limit 64 --output-dir "$out" --run-name "$name" --no-save-model "$@" | tee "$out/$name.txt"
  $PY - "$out/$name" <<'PY'
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1]); acc.Reload()
tags = acc.Tags()["scalars"]
for tag in ["perf/episodes_per_s", "perf/gen_tokens_per_s", "perf/rollout_s", "perf/train_tokens_per_s", "perf/step_s", "perf/train_s",
            "pipeline/policy_lag_mean", "pipeline/policy_lag_max", "pipeline/learner_wait_frac",
            "pipeline/worker_wait_frac", "pipeline/weight_publish_s", "pipeline/weight_load_s", "pipeline/stale_dropped",
            "perf/gather_s"]:
    if tag in tags:
        v = [e.value for e in acc.Scalars(tag)][1:] or [e.value for e in acc.Scalars(tag)]
        print(f"{tag:32s} mean {sum(v) / len(v):10.3f}  last {v[-1]:10.3f}")
PY
}

smoke smoke $(( n > 1 ? n - 1 : 1 )) "$@"
smoke smoke-eager $(( n > 1 ? n - 1 : 1 )) --no-cuda-graphs "$@"
if [ "$n" -ge 2 ]; then
  smoke smoke-2ranks $(( n > 2 ? n - 2 : 1 )) --learner-devices 2 "$@"
  smoke smoke-2ranks-fsdp $(( n > 2 ? n - 2 : 1 )) --learner-devices 2 --learner-parallel fsdp "$@"
fi
timeout 420 $PY launch/bench.py --gpu --json "$out/bench_gpu.json" | tee "$out/bench_gpu.txt"
# The weight broadcast on the GPU: torn reads through CUDA IPC, no GPU memory held after a killed
# worker, then publish + load ms beside one plain device copy (nanorllm/bench/gpu_weights.py).
timeout "$limit" $PY -m pytest -q tests/test_weights.py
timeout "$limit" $PY -m nanorllm.bench.gpu_weights cuda
