"""Packing benchmark: the RL update on padded micro-batches and on packed ones, same episodes, side by side.

    python launch/bench.py packing [--quick] [--json runs/packing.json]

The episodes are sampled once from the model on the default task; then each round times one update padded and one packed, interleaved so load from
other processes falls on both alike, and the medians are reported. Both updates start from the same
weights each round (restored after each), so they compute the same function on the same data.

Figures:
  padded_update_s, packed_update_s   seconds of one update (train_step's perf/train_s), median of the rounds
  packed_speedup                     padded_update_s / packed_update_s
  pad_frac                           the padded passes' padding share (the packed ones have none)
"""

import time
from dataclasses import dataclass, replace

import torch

from nanorllm.bench.record import median, record_run
from nanorllm.config import TrainConfig
from nanorllm.config.specs import task_specs
from nanorllm.datasets.tasks import load_tasks
from nanorllm.policy.base import SamplingParams
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.trainer.step import train_step
from nanorllm.trainer.update import make_optimizer


@dataclass
class PackingBenchConfig:
    quick: bool = False
    """tiny-random: checks that every measurement runs (its figures are not the reference)."""
    model: str = "smollm2-135m-instruct"
    """Model (ignored with --quick)."""
    tasks: int = 8
    """Tasks in the update's batch (x --samples episodes, the default run's 8 x 4)."""
    samples: int = 4
    """Episodes per task."""
    rounds: int = 5
    """Interleaved rounds (one padded and one packed update each); the first warms up and is not counted."""
    micro_batch_tokens: int | None = None
    """As the run's --micro-batch-tokens (None: sized for the device)."""
    threads: int = 2
    """Torch threads (CPU)."""
    json: str | None = None
    """Also write the figures here."""


def run_packing_bench(b: PackingBenchConfig) -> int:
    t_start = time.perf_counter()
    torch.set_num_threads(b.threads)
    torch.set_flush_denormal(True)
    cfg = TrainConfig(model="tiny-random" if b.quick else b.model, drop_zero_std_groups=False,
                      micro_batch_tokens=b.micro_batch_tokens)
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    policy = HFCausalPolicy.from_name(cfg.model, device=device)
    results = sampled_episodes(policy, cfg, load_tasks(task_specs(cfg)[0], limit=b.tasks), samples=b.samples)
    seconds, pads = {False: [], True: []}, []
    start = [p.detach().clone() for p in policy.parameters()]
    for r in range(b.rounds):
        for packing in (False, True):
            run_cfg = replace(cfg, packing=packing)
            m = train_step(policy, make_optimizer(policy, run_cfg), results, run_cfg)
            with torch.no_grad():
                for p, s in zip(policy.parameters(), start):
                    p.copy_(s)
            if r:
                seconds[packing].append(m["perf/train_s"])
                pads += [m["perf/pad_frac"]] if not packing else []
        print(f"[bench] round {r}: padded {seconds[False][-1:]} packed {seconds[True][-1:]}", flush=True)
    figures = {"padded_update_s": median(seconds[False]), "packed_update_s": median(seconds[True]),
               "pad_frac": median(pads), "_tokens": m["train/tokens"], "_episodes": len(results)}
    figures["packed_speedup"] = figures["padded_update_s"] / figures["packed_update_s"]
    for k, v in figures.items():
        print(f"{k:24s} {v:10.4f}")
    record_run(figures, t_start, b.json, model=cfg.model, device=device, threads=b.threads)
    return 0


def sampled_episodes(policy: HFCausalPolicy, cfg: TrainConfig, tasks: list[dict], *, samples: int) -> list:
    """`samples` episodes of each task from `policy`, rewards alternated so every sample carries a gradient."""
    engine = RolloutEngine(policy, sampling=SamplingParams(max_new_tokens=cfg.max_new_tokens,
                                                           temperature=cfg.temperature), max_turns=cfg.max_turns)
    results = engine.run(tasks, num_samples=samples, seed=1).results
    for i, r in enumerate(results):
        r.trajectory.final_reward = float(i % 2)
    return results
