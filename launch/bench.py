"""Benchmarks: each figure is a ratio of two things measured side by side in this one run.

    python launch/bench.py --quick                     # speed figures, tiny-random model, minutes on 2 CPU cores
    python launch/bench.py --json runs/bench.json      # speed figures, the default model (slow on CPU)
    python launch/bench.py learning [--quick]          # held-out learning per update and per second
    python launch/bench.py learner-ranks [--quick]     # learner step on 1 vs 2 ranks, parity, transfers
    python launch/bench.py gpu [--dry-run]             # the decode engine and the learner on a GPU
    python launch/bench.py lora [--quick]              # full fine-tune vs LoRA: memory, publish, update, decode
    python launch/bench.py packing [--quick]           # the RL and SFT updates, padded vs packed
    python launch/bench.py precision [--quick]         # fp32 vs bf16: matmul ceiling, update, rollout; --main-job
    python launch/bench.py sanity [--quick]            # train on the tasks the model solves 20-80%: to mastery?
    python launch/bench.py baselines [--quick]         # RL vs distillation, RFT and SFT on gold: equal episodes, wall
    python launch/bench.py agents [--model tiny-random] # the --agent endpoint vs the same episodes as an --env
    python launch/bench.py adapters [--model tiny-random] # a reasoning-gym dataset via its adapter vs as a JSONL file
    python launch/bench.py MODE --help                 # that mode's flags

`--learning`, `--learner-ranks`, `--gpu` and `--lora` name the same modes. The figures and their targets:
nanorllm/bench/suite.py (speed), learning.py, learner_ranks.py, gpu.py, lora.py.
"""

import functools
import operator
import sys
from typing import Annotated

import tyro

from nanorllm.bench.adapters import AdapterBenchConfig, run_adapter_bench
from nanorllm.bench.agents import AgentBenchConfig, run_agent_bench
from nanorllm.bench.baselines import BaselinesBenchConfig, run_baselines_bench
from nanorllm.bench.config import BenchConfig
from nanorllm.bench.gpu import GpuBenchConfig, run_gpu_bench
from nanorllm.bench.learner_ranks import RanksBenchConfig, run_ranks_bench
from nanorllm.bench.learning import LearningConfig, run_learning
from nanorllm.bench.lora import LoraBenchConfig, run_lora_bench
from nanorllm.bench.packing import PackingBenchConfig, run_packing_bench
from nanorllm.bench.precision import PrecisionBenchConfig, run_precision_bench
from nanorllm.bench.sanity import SanityBenchConfig, run_sanity_bench
from nanorllm.bench.suite import run_bench

MODES = {  # name: (its config, what runs it, one line for --help)
    "speed": (BenchConfig, run_bench, "pipeline vs serial, decode efficiency, weight broadcast, worker scaling"),
    "learning": (LearningConfig, run_learning, "held-out gain per update and per second, serial vs pipeline"),
    "learner-ranks": (RanksBenchConfig, run_ranks_bench, "the learner step on 1 vs N ranks (DDP, FSDP)"),
    "gpu": (GpuBenchConfig, run_gpu_bench, "the decode engine, the learner update and the weight broadcast on a GPU"),
    "lora": (LoraBenchConfig, run_lora_bench, "full fine-tune vs LoRA: learner memory, publish, update, decode"),
    "packing": (PackingBenchConfig, run_packing_bench, "the RL and SFT updates on padded vs packed micro-batches"),
    "precision": (PrecisionBenchConfig, run_precision_bench, "fp32 vs bf16 side by side, and what --dtype auto picks"),
    "sanity": (SanityBenchConfig, run_sanity_bench, "train only on the tasks the model solves 20-80% of the time"),
    "baselines": (BaselinesBenchConfig, run_baselines_bench, "RL vs distillation, RFT and SFT on gold, each seed"),
    "agents": (AgentBenchConfig, run_agent_bench, "the --agent endpoint vs the same episodes as an --env, tokens/s"),
    "adapters": (AdapterBenchConfig, run_adapter_bench, "a reasoning-gym dataset via its adapter vs as a JSONL file"),
}


def mode_args(argv: list[str]) -> list[str]:
    """The argv with its mode first: `--gpu ...` reads as `gpu ...`, and no mode is `speed`."""
    for name in MODES:
        if f"--{name}" in argv:
            return [name] + [a for a in argv if a != f"--{name}"]
    if argv and argv[0] in MODES:
        return argv
    if argv in ([], ["-h"], ["--help"]):  # the overview lists every mode
        return argv
    return ["speed", *argv]


def main(argv: list[str]) -> int:
    modes = {name: Annotated[cls, tyro.conf.subcommand(name, description=line)]
             for name, (cls, _, line) in MODES.items()}
    args = mode_args(list(argv)) or ["speed"]
    cfg = tyro.cli(functools.reduce(operator.or_, modes.values()), args=args, description=__doc__)
    run = next(fn for cls, fn, _ in MODES.values() if type(cfg) is cls)
    return run(cfg)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
