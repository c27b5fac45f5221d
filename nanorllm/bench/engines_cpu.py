"""One default training step's rollouts on the DecodeBatch and on the SlotBatch, alternating in one
process: generated tokens/s of each (median of the timed runs) and whether they sampled the same
episodes. The CPU no-regression check of the decode engine.

    python -m nanorllm.bench.engines_cpu [model] [runs]   # tiny-random, 4 (the first is warm-up)
"""

import sys
import time
from dataclasses import replace

import torch

from nanorllm.bench.decode_batch import ReferencePolicy
from nanorllm.config import TrainConfig
from nanorllm.datasets.tasks import load_tasks
from nanorllm.config.specs import task_specs
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.trainer.training_engine import training_engine

ENGINES = ("dynamic", "slots")


def compare(model: str = "tiny-random", runs: int = 4) -> dict:
    cfg = replace(TrainConfig(), model=model)
    policy = HFCausalPolicy.from_name(model)
    tasks = load_tasks(task_specs(cfg)[0], limit=cfg.tasks_per_step)
    rates, episodes, useful = {e: [] for e in ENGINES}, {}, {}
    for run in range(runs):
        for name in ENGINES:
            engine = training_engine(ReferencePolicy(policy) if name == "dynamic" else policy, cfg)
            t0 = time.perf_counter()
            batch = engine.run(tasks, num_samples=cfg.num_samples_per_task, seed=run)
            seconds = time.perf_counter() - t0
            t = batch.timings
            if run:  # the first run of each is warm-up
                rates[name].append(t["gen_tokens"] / seconds)
            episodes[name, run] = [[s.response_ids for s in r.step_samples] for r in batch.results]
            useful[name] = (t["tokens_kept"] - t["prefills"]) / max(t["decode_rows"], 1)
    median = {name: sorted(r)[len(r) // 2] for name, r in rates.items()}
    return {"tokens_per_s": median, "runs": rates, "decode_useful_frac": useful,
            "same_episodes": all(episodes["dynamic", r] == episodes["slots", r] for r in range(runs))}


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(compare(sys.argv[1] if len(sys.argv) > 1 else "tiny-random", int(sys.argv[2]) if len(sys.argv) > 2 else 4))
