"""Packing benchmark: the RL update and the SFT update on padded micro-batches and on packed ones, same data,
side by side.

    python launch/bench.py packing [--quick] [--json runs/packing.json]

RL: the episodes are sampled once from the model on the default task (rewards alternated so every sample
carries a gradient). SFT: --sft-rows demonstrations, half math (short) and half calculator-tool (long),
rendered once. Each round times one update padded and one packed, interleaved so load from other
processes falls on both alike, and the medians are reported. Both updates start from the same weights
each round (restored after each), so they compute the same function on the same data.

Figures:
  padded_update_s, packed_update_s   seconds of one RL update (train_step's perf/train_s), median of the rounds
  packed_speedup                     padded_update_s / packed_update_s
  pad_frac                           the padded RL passes' padding share
  sft_padded_tokens_per_s,           trained (assistant) tokens per second of one SFT update, padded and packed
  sft_packed_tokens_per_s
  sft_packed_speedup                 their ratio; sft_pad_frac, sft_packed_pad_frac: each one's padding share
"""

import time
from dataclasses import dataclass, replace

import torch

from nanorllm.bench.record import median, record_run
from nanorllm.config import TrainConfig
from nanorllm.config.sft import SFT_DEFAULTS, SFTConfig
from nanorllm.config.specs import task_specs
from nanorllm.core.types import StepSample
from nanorllm.datasets.tasks import load_tasks
from nanorllm.envs.tools import load_tools
from nanorllm.policy.base import SamplingParams
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.ranks.group import LearnerRanks
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.supervised.demos import demonstration_rows
from nanorllm.trainer.loss import SFTLoss
from nanorllm.trainer.step import train_step
from nanorllm.trainer.update import make_optimizer, update


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
    parts: str = "rl,sft"
    """Which updates to time: rl, sft or both (rl samples its episodes first: minutes for the default model on CPU)."""
    sft_rows: int = 32
    """SFT conversations in the SFT update (half math demonstrations, half calculator-tool ones)."""
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
    parts = b.parts.split(",")
    results = sampled_episodes(policy, cfg, load_tasks(task_specs(cfg)[0], limit=b.tasks), samples=b.samples) \
        if "rl" in parts else []

    def rl_update(packing: bool) -> dict:
        run_cfg = replace(cfg, packing=packing)
        m = train_step(policy, make_optimizer(policy, run_cfg), results, run_cfg)
        return {"s": m["perf/train_s"], "tokens": m["train/tokens"], "pad_frac": m["perf/pad_frac"]}

    rows = sft_rows_mix(policy, b.sft_rows) if "sft" in parts else []
    sft_cfg = SFTConfig(**{**SFT_DEFAULTS, "model": cfg.model, "micro_batch_tokens": b.micro_batch_tokens})
    ranks = LearnerRanks(device=device)

    def sft_update(packing: bool) -> dict:
        run_cfg = replace(sft_cfg, packing=packing)
        t0 = time.perf_counter()
        n = update(policy, make_optimizer(policy, run_cfg), rows, run_cfg, ranks=ranks, loss=SFTLoss(), host={})
        return {"s": time.perf_counter() - t0, "tokens": n["tokens"],
                "pad_frac": 1 - n["real_tokens"] / max(n["padded_tokens"], 1)}

    figures = {}
    if "rl" in parts:
        rl = interleaved(policy, rl_update, b.rounds)
        figures.update({"padded_update_s": rl[False]["s"], "packed_update_s": rl[True]["s"],
                        "packed_speedup": rl[False]["s"] / rl[True]["s"], "pad_frac": rl[False]["pad_frac"],
                        "_rl_tokens": rl[False]["tokens"], "_episodes": len(results)})
    if "sft" in parts:
        sft = interleaved(policy, sft_update, b.rounds)
        figures.update({"sft_padded_tokens_per_s": sft[False]["tokens"] / sft[False]["s"],
                        "sft_packed_tokens_per_s": sft[True]["tokens"] / sft[True]["s"],
                        "sft_pad_frac": sft[False]["pad_frac"], "sft_packed_pad_frac": sft[True]["pad_frac"],
                        "_sft_samples": len(rows), "_sft_tokens": sft[False]["tokens"]})
        figures["sft_packed_speedup"] = figures["sft_packed_tokens_per_s"] / figures["sft_padded_tokens_per_s"]
    for k, v in figures.items():
        print(f"{k:28s} {v:10.4f}")
    record_run(figures, t_start, b.json, model=cfg.model, device=device, threads=b.threads)
    return 0


def interleaved(policy: HFCausalPolicy, step, rounds: int) -> dict[bool, dict]:
    """step(packing) padded then packed, `rounds` times, the weights restored after each (both compute the
    same function on the same data); the medians of the rounds after the first (a warm-up)."""
    start = [p.detach().clone() for p in policy.parameters()]
    seen: dict[bool, list[dict]] = {False: [], True: []}
    for r in range(rounds):
        for packing in (False, True):
            m = step(packing)
            with torch.no_grad():
                for p, s in zip(policy.parameters(), start):
                    p.copy_(s)
            if r:
                seen[packing].append(m)
    return {k: {f: median([m[f] for m in ms]) for f in ms[0]} for k, ms in seen.items()}


def sft_rows_mix(policy: HFCausalPolicy, n: int) -> list[StepSample]:
    """n SFT conversations of two lengths, as a data set's vary: math demonstrations (one short reply) and
    calculator-tool ones (the tools block, a call, its result and the answer)."""
    math = SFTConfig(**{**SFT_DEFAULTS, "model": "-", "env": "math", "demos": n - n // 2, "out": "-"})
    calc = replace(math, env="nanorllm.envs.calc_tool:CalcTasks", demos=n // 2)
    tools = [t.schema for t in load_tools("nanorllm.envs.calc_tool:calc")]
    rows = demonstration_rows(math, policy, None) + demonstration_rows(calc, policy, tools)
    return [s for row in rows for s in row]


def sampled_episodes(policy: HFCausalPolicy, cfg: TrainConfig, tasks: list[dict], *, samples: int) -> list:
    """`samples` episodes of each task from `policy`, rewards alternated so every sample carries a gradient."""
    engine = RolloutEngine(policy, sampling=SamplingParams(max_new_tokens=cfg.max_new_tokens,
                                                           temperature=cfg.temperature), max_turns=cfg.max_turns)
    results = engine.run(tasks, num_samples=samples, seed=1).results
    for i, r in enumerate(results):
        r.trajectory.final_reward = float(i % 2)
    return results
