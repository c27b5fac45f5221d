"""The casts and ops of one learner update on CPU (torch.profiler): fp32, bf16 autocast casting the fp32 masters
at every forward, and bf16 with the Linear weights held in bf16 for the update (trainer/held_weights.py).

Counts, not seconds: this CPU has no bf16 units, so a bf16 update's wall time here says nothing of a GPU's.

    python -m nanorllm.bench.casts [--micro-batch-tokens 4096]
"""

import argparse
import collections
from dataclasses import replace

import torch
from torch.profiler import ProfilerActivity, profile

from nanorllm.bench.gpu_learner import QUICK_SIZES, synthetic_results, update_setup
from nanorllm.trainer.step import train_step

SETTINGS = {"fp32": ("float32", False), "bf16 autocast": ("bfloat16", False), "bf16 held": ("bfloat16", True)}
COUNTED = ("aten::_to_copy", "aten::linear", "aten::mm")


def update_ops(dtype: str, hold: bool, micro_batch_tokens: int) -> dict[str, int]:
    """Op counts of the quick benchmark's second update (the first builds what is kept: buffers, optimizer state)."""
    torch.manual_seed(0)
    policy, cfg, opt = update_setup("cpu", dtype, quick=True)
    cfg = replace(cfg, micro_batch_tokens=micro_batch_tokens)
    policy.hold_weights = hold
    train_step(policy, opt, synthetic_results(vocab=256, **QUICK_SIZES), cfg)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        m = train_step(policy, opt, synthetic_results(vocab=256, **QUICK_SIZES), cfg)
    names = collections.Counter(e.name for e in prof.events())
    return {**{name: names[name] for name in COUNTED}, "ops": sum(names.values()),
            "micro_batches": int(m["perf/micro_batches"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"one update of the quick benchmark (QUICK_SIZES), --micro-batch-tokens {args.micro_batch_tokens}, CPU")
    for name, (dtype, hold) in SETTINGS.items():
        counts = update_ops(dtype, hold, args.micro_batch_tokens)
        print(f"  {name:14s} " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
