"""What a teacher costs an update: the same rollout batch trained with and without `--teacher`, side by side.

    python -m nanorllm.bench.distill [MODEL] [ROUNDS]      # default: the default model as student and teacher, 3

One process, one thread, the main job's step (8 tasks x 4 episodes, 2 turns, 32 new tokens) sampled once; each round
times one RL update and one distillation update (`--distill-only`, the teacher a frozen copy of the student's
weights) on fresh copies of the optimizer, alternating so both see the same machine. The ratio of medians is the
teacher's forward (and the exact KL's log-softmax) over the update's forward and backward.
"""

import statistics
import sys
from dataclasses import replace

import torch

from nanorllm.bench.packing import sampled_episodes
from nanorllm.config import TrainConfig
from nanorllm.datasets.tasks import load_tasks
from nanorllm.envs.math_env import DEFAULT_TASKS
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.trainer.step import train_step
from nanorllm.trainer.teacher import Teacher
from nanorllm.trainer.update import make_optimizer


def compare(model: str, rounds: int) -> dict:
    torch.set_num_threads(1)
    cfg = TrainConfig(model=model, drop_zero_std_groups=False)
    policy = HFCausalPolicy.from_name(model)
    results = sampled_episodes(policy, cfg, load_tasks(DEFAULT_TASKS, limit=cfg.tasks_per_step),
                               samples=cfg.num_samples_per_task)
    teacher = Teacher(model, device="cpu", dtype=cfg.dtype)
    distill = replace(cfg, teacher=model, distill_only=True)
    times = {"rl": [], "distill": []}
    for _ in range(rounds + 1):  # the first round warms up
        for name, run_cfg, t in (("rl", cfg, None), ("distill", distill, teacher)):
            m = train_step(policy, make_optimizer(policy, run_cfg), results, run_cfg, teacher=t)
            times[name].append(m["perf/train_s"])
    rl, dist = (statistics.median(v[1:]) for v in times.values())
    return {"rl_s": rl, "distill_s": dist, "ratio": dist / rl, "tokens": m["train/tokens"], "rounds": rounds}


def main(argv: list[str]) -> None:
    model = argv[0] if argv else TrainConfig().model
    r = compare(model, int(argv[1]) if len(argv) > 1 else 3)
    print(f"| update of one step ({r['tokens']:.0f} response tokens, {model}, 1 thread) | median of {r['rounds']} |\n"
          f"|---|---|\n| RL (the clipped objective) | {r['rl_s']:.1f} s |\n"
          f"| distillation (+ the teacher's forward) | {r['distill_s']:.1f} s ({r['ratio']:.2f}x) |")


if __name__ == "__main__":
    main(sys.argv[1:])
