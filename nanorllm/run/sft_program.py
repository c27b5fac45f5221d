"""launch/sft.py's program: flags and checks before anything is written, the learner ranks, the training
(supervised/sft.py) on rank 0 and `follow_sft` on every other rank.

With `--learner-devices N` rank 0 renders and checks every row first, then spawns ranks 1..N-1 (run/ranks.py,
as RL's learner does); each loads the model, takes rank 0's weights and AdamW state (DDP, or its FSDP shard)
and trains its share of each step's rows (ranks/split.py) until rank 0 releases it. Rank 0 alone logs,
checkpoints and writes --out; the held-out loss and, under FSDP, the checkpoint's optimizer state are
computed by all ranks together between steps.
"""

import sys

import tyro

from nanorllm.config.errors import ConfigError
from nanorllm.config.sft import SFT_DEFAULTS, SFTConfig
from nanorllm.config.specs import lora_spec
from nanorllm.datasets.errors import TaskFileError
from nanorllm.memory.plan import MemoryPlanError, check_plan
from nanorllm.memory.sft_plan import plan_sft
from nanorllm.ranks.group import LearnerRanks, RankError, under_torchrun, where_line
from nanorllm.run.ranks import check_parallel, start_ranks
from nanorllm.supervised import sft
from nanorllm.trainer.checkpoint import CheckpointError
from nanorllm.trainer.trainable import load_trainable
from nanorllm.trainer.update import make_optimizer
from nanorllm.utils.children import socket_folder_problem
from nanorllm.utils.devices import DeviceError, configure_threads, resolve_devices
from nanorllm.utils.modules import EnvSpecError
from nanorllm.utils.outputs import OutputPath, output_problems
from nanorllm.utils.precision import choose_precision


def main(argv: list[str]) -> int:
    """launch/sft.py: parse, check (flags, devices, the memory plan before anything loads, tools, every row) before
    anything is written, train; 2 on bad input, 1 when a learner rank is lost (the last checkpoint stands), 0 after
    the plan alone under --memory-plan-only."""
    cfg = tyro.cli(SFTConfig, default=SFTConfig(**SFT_DEFAULTS), args=argv, description=sft.__doc__)
    problems = cfg.validate() or output_problems(OutputPath(cfg.out, "folder", marker=sft.MARKER), cfg.overwrite)
    if under_torchrun():
        problems.append("launch/sft.py starts its own learner ranks (--learner-devices N): run it with python, "
                        "not torchrun")
    if problems:
        print("\n".join(f"error: {p}" for p in problems), file=sys.stderr)
        return 2
    try:
        devices = resolve_devices(cfg.devices, 0, serial=True, learner_spec=cfg.learner_devices)
        check_parallel(cfg.learner_parallel, len(devices.learners), devices.learner)
        precision = choose_precision(cfg.dtype, devices.learners)
        cfg.dtype = precision.name  # the run's dtype from here on: its ranks, its plan, config.json
        if len(devices.learners) > 1 and (why := socket_folder_problem()) is not None:
            raise ConfigError([why])  # the ranks' fork server could not listen
        if not check_plan(plan_sft(cfg, devices.learner), cfg.model, plan_only=cfg.memory_plan_only):
            return 0
        print(f"[precision] {cfg.dtype}: {precision.why}", flush=True)
        run, start = sft.start_run(cfg, lambda policy: sft.sft_rows(cfg, policy), device=devices.learner,
                                   processes=len(devices.learners))
    except (TaskFileError, EnvSpecError, MemoryPlanError, DeviceError, CheckpointError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)  # FileExistsError: the run folder is another run's, or in use
        return 2
    except ConfigError as e:
        print("\n".join(f"error: {p}" for p in e.problems), file=sys.stderr)
        return 2
    ranks = None
    try:
        ranks = start_ranks(devices, cfg.learner_timeout_s, parallel=cfg.learner_parallel, follower=follow_sft)
        if ranks.world > 1:
            ranks.broadcast((cfg, run.steps))  # the other ranks load the model from it, then take rank 0's weights
            print(where_line(ranks.attach(run.policy, run.optimizer)), flush=True)
        sft.train_sft(run, start, ranks=ranks)
        ranks.release()
    except RankError as e:
        print(f"[failed] {e}; the last checkpoint in {run.run_dir} stands (--resume it)", file=sys.stderr)
        return 1
    finally:
        run.folder.close()
        if ranks is not None:
            ranks.close()
    print(f"[sft] model written to {cfg.out}")
    return 0


def follow_sft(ranks: LearnerRanks) -> int:
    """A learner rank other than 0: rank 0's config, the model, rank 0's weights and optimizer state; then train
    its share of every step (or join a collective rank 0 runs between steps) until rank 0 releases it."""
    cfg, steps = ranks.broadcast()  # the run's steps: its learning-rate schedule ends there
    configure_threads(ranks.device, cfg.threads, ranks.world)
    policy = load_trainable(cfg, device=ranks.device, lora=lora_spec(cfg))  # rank 0's weights come in attach
    optimizer = make_optimizer(policy, cfg)
    ranks.parallel = cfg.learner_parallel
    ranks.attach(policy, optimizer)
    while (step := ranks.begin()) is not None:
        if callable(step):  # the held-out loss, or FSDP's optimizer state for a checkpoint
            step(policy, optimizer, ranks)
            continue
        share = ranks.receive()
        if share is not None:
            sft.train_rows(policy, optimizer, share["results"], cfg, ranks, lr=sft.step_lr(cfg, step, steps))
    return 0
