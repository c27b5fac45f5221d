"""Speed benchmarks: each figure is a ratio of two things measured side by side in this one run
(`python launch/bench.py`).

--quick checks that every measurement runs; its figures are not the reference (0.36 MB of weights
make broadcast_vs_copy a measure of per-call overhead, and tiny-model steps are sub-second).

Figures (targets in TARGETS):
  pipeline_speedup          serial wall time / pipeline wall time, same updates, tasks and seeds
  overlap_efficiency        pipeline_speedup / ideal, ideal = (rollout + train) / max(rollout, train) (serial)
  broadcast_vs_copy         weight publish + one worker load / one plain copy_ of the same bytes
  worker_blocked_frac       share of worker time waiting for weights or queue space
  learner_wait_frac         share of learner time waiting for data
  policy_lag_mean/max, stale_dropped
  rollout_batching_speedup  tokens/s of one batched engine call / one episode at a time with `generate`
  decode_useful_frac        decode rows whose sampled token is kept / rows computed in decode steps, in one
                            default training step (8 tasks x 4 samples, 2 turns); a finished row still computed
                            counts against it
  gen_vs_forward            kept tokens/s of that step / the model's bare batched decode forwards at the step's
                            mean batch and context (what sampling, prefills, the env and small tail batches cost)
  learner_efficiency        train tokens/s of train_step / a bare fwd+bwd+step on the same batch
  worker_scaling            throughput with 2 workers / (2 x 1 worker), same job per worker, tiny model
                            (learner not the bottleneck)
"""

import os
import time
from dataclasses import replace

import torch

from nanorllm.bench.config import BenchConfig, train_config
from nanorllm.bench.decode import bench_decode, bench_rollout_batching
from nanorllm.bench.learner import bench_learner
from nanorllm.bench.pipeline import bench_broadcast, bench_pipeline, bench_worker_scaling
from nanorllm.bench.record import record_run
from nanorllm.config import TrainConfig
from nanorllm.datasets.tasks import load_tasks
from nanorllm.config.specs import task_specs
from nanorllm.policy.hf_causal import HFCausalPolicy

TARGETS = {  # (comparison, target)
    "pipeline_speedup": (">=", 1.6), "overlap_efficiency": (">=", 0.85), "broadcast_vs_copy": ("<=", 2.0),
    "worker_blocked_frac": ("<=", 0.01), "learner_wait_frac": ("<=", 0.1), "rollout_batching_speedup": (">=", 4.0),
    "decode_useful_frac": (">=", 0.95), "gen_vs_forward": (">=", 0.5),
    "learner_efficiency": (">=", 0.8), "worker_scaling": (">=", 0.9),
}


CEILINGS = {  # what this machine allows, from the same runs: a figure at its ceiling cannot go higher here
    "_split_ceiling": "pipeline_speedup ceiling (serial step / slower pipeline phase at its thread count)",
    "_cpu_ceiling": "worker_scaling ceiling (CPU cores / twice the cores busy with one worker)",
    "_bare_two_process_scaling": "two plain rollout processes, no learner, no pipeline (2 procs / 2 x 1 proc)",
}


def run_bench(b: BenchConfig) -> int:
    """Every speed figure, printed beside its target."""
    torch.set_flush_denormal(True)
    figures, t_start = {}, time.perf_counter()
    print("[bench] pipeline vs serial ...", flush=True)
    figures.update(bench_pipeline(b))
    torch.set_num_threads(os.cpu_count() or 1)
    cfg = train_config(b)
    policy = HFCausalPolicy.from_name(cfg.model, device="cuda:0" if torch.cuda.is_available() else "cpu")
    tasks = load_tasks(task_specs(cfg)[0], limit=32)  # 32 episodes: one default training step (8 tasks x 4)
    default_step = replace(TrainConfig(), model=cfg.model)
    print("[bench] weight broadcast ...", flush=True)
    figures.update(bench_broadcast(policy))
    print("[bench] rollout batching ...", flush=True)
    figures.update(bench_rollout_batching(policy, tasks, max_new_tokens=16))
    print("[bench] decode efficiency ...", flush=True)
    figures.update(bench_decode(policy, default_step, tasks))
    print("[bench] learner efficiency ...", flush=True)
    figures.update(bench_learner(policy, cfg, tasks[:4]))  # 4 tasks x 4 episodes
    print("[bench] worker scaling ...", flush=True)
    figures.update(bench_worker_scaling(b))

    print(f"\n{'figure':28s} {'value':>9s}  target")
    for k, v in figures.items():
        if k.startswith("_"):
            continue
        cmp, target = TARGETS.get(k, ("", None))
        ok = "" if target is None else ("ok" if (v >= target if cmp == ">=" else v <= target) else "MISS")
        print(f"{k:28s} {v:9.3f}  {cmp} {target if target is not None else ''} {ok}")
    for key, what in CEILINGS.items():
        if key in figures:
            print(f"  {what}: {figures[key]:.3f}")
    record_run(figures, t_start, b.json, quick=b.quick, model="tiny-random" if b.quick else b.model)
    return 0
