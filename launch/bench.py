"""Benchmarks: each figure is a ratio of two things measured side by side in this one run.

    python launch/bench.py --quick               # tiny-random model, a few minutes on 2 CPU cores
    python launch/bench.py --json runs/bench.json  # the default model (slow on CPU)
    python launch/bench.py --learning [--quick]  # held-out learning per update and per second (nanorllm/bench/learning.py)
    python launch/bench.py --learner-ranks [--quick]  # learner step on 1 vs 2 ranks, parity, transfers (nanorllm/bench/learner_ranks.py)
    python launch/bench.py --gpu [--dry-run]     # the decode engine on a GPU (nanorllm/bench/gpu.py)
    python launch/bench.py --lora [--quick]      # full fine-tune vs LoRA: memory, publish, update, decode (nanorllm/bench/lora.py)

The figures and their targets: nanorllm/bench/suite.py.
"""

import sys

import tyro

from nanorllm.bench.config import BenchConfig
from nanorllm.bench.gpu import GpuBenchConfig, run_gpu_bench
from nanorllm.bench.learner_ranks import RanksBenchConfig, run_ranks_bench
from nanorllm.bench.learning import LearningConfig, run_learning
from nanorllm.bench.lora import LoraBenchConfig, run_lora_bench
from nanorllm.bench.suite import run_bench


def main(argv: list[str]) -> int:
    if "--learning" in argv:  # its own benchmark, with its own flags
        return run_learning(tyro.cli(LearningConfig, args=[a for a in argv if a != "--learning"]))
    if "--gpu" in argv:  # the decode engine's GPU figures
        return run_gpu_bench(tyro.cli(GpuBenchConfig, args=[a for a in argv if a != "--gpu"]))
    if "--learner-ranks" in argv:  # 1 vs N learner ranks
        return run_ranks_bench(tyro.cli(RanksBenchConfig, args=[a for a in argv if a != "--learner-ranks"]))
    if "--lora" in argv:  # full fine-tune vs LoRA
        return run_lora_bench(tyro.cli(LoraBenchConfig, args=[a for a in argv if a != "--lora"]))
    return run_bench(tyro.cli(BenchConfig, args=argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
