"""One default training step's rollouts on the slot engine with its eager compaction rule (a row
moves down at every hole below it) and with the CUDA-graph rule (only when that drops a slot-range
bucket), alternating in one process: seconds of each (median of the timed runs), the rows the
decode steps computed, and whether they sampled the same episodes. What the eager rule is worth on CPU.

    python -m nanorllm.bench.compaction_cpu [model] [runs]   # smollm2-135m-instruct, 4 (the first is warm-up)
"""

import sys
import time
from dataclasses import replace

import torch

from nanorllm.config import TrainConfig
from nanorllm.datasets.tasks import load_tasks
from nanorllm.config.specs import task_specs
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.policy.slot_batch import SlotBatch
from nanorllm.policy.slot_cache import slot_range
from nanorllm.trainer.training_engine import training_engine

RULES = {"every_hole": SlotBatch.step_rows, "bucket_drop": lambda self, top: slot_range(top, self.cache.slots)}


def compare(model: str = "smollm2-135m-instruct", runs: int = 4) -> dict:
    cfg = replace(TrainConfig(), model=model)
    policy = HFCausalPolicy.from_name(model)
    tasks = load_tasks(task_specs(cfg)[0], limit=cfg.tasks_per_step)
    seconds, rows, episodes = {r: [] for r in RULES}, {r: [] for r in RULES}, {}
    try:
        for run in range(runs):
            for name, rule in RULES.items():
                SlotBatch.step_rows = rule
                t0 = time.perf_counter()
                batch = training_engine(policy, cfg).run(tasks, num_samples=cfg.num_samples_per_task, seed=run)
                if run:  # the first run of each is warm-up
                    seconds[name].append(time.perf_counter() - t0)
                    rows[name].append(batch.timings["computed_rows"])
                episodes[name, run] = [[s.response_ids for s in r.step_samples] for r in batch.results]
    finally:
        SlotBatch.step_rows = RULES["every_hole"]
    median = {name: sorted(s)[len(s) // 2] for name, s in seconds.items()}
    return {"rollout_s": median, "runs_s": seconds, "computed_rows": rows,
            "same_episodes": all(episodes["every_hole", r] == episodes["bucket_drop", r] for r in range(runs))}


if __name__ == "__main__":
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    print(compare(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct",
                  int(sys.argv[2]) if len(sys.argv) > 2 else 4))
