"""A learner rank other than 0: take a share of each step, train it, until rank 0 says the run is over.

It holds a DDP replica of the model and its own copy of the optimizer state, which stay equal to
rank 0's because every rank applies the same all-reduced gradients (under FSDP: its shard of both,
ranks/fsdp.py). Between steps rank 0 may call it into a collective of its own (`LearnerRanks.together`). It draws no tasks, writes no
logs and no checkpoints: the run's state is rank 0's. On another machine, that machine's local
rank 0 also runs its rollout workers, on the tasks rank 0 sends it. It ignores SIGINT (Ctrl-C goes to rank 0,
which saves first and then releases or ends it) and exits with rank 0: a spawned rank through its
lifeline, a torchrun rank when the agent ends the group or a collective fails.
"""

import signal
import sys
from types import SimpleNamespace

from nanorllm.ranks.group import LearnerRanks
from nanorllm.pipeline.lifeline import die_with_parent
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.trainer.step import train_step
from nanorllm.trainer.update import make_optimizer
from nanorllm.utils.devices import DeviceMap, configure_threads


def follow(ranks: LearnerRanks, devices: DeviceMap | None = None) -> int:
    """Train every step rank 0 begins. With several nodes this node's leader (local rank 0) also
    runs `devices.workers` on the shares of tasks rank 0 sends it (pipeline/learner.py)."""
    start = ranks.broadcast()  # rank 0's config, after its resume and flag overrides
    cfg = start["cfg"]
    configure_threads(ranks.device, cfg.threads, start["processes"])
    policy = HFCausalPolicy.from_name(cfg.model, device=ranks.device, dtype=cfg.dtype, seed=cfg.seed)
    ref_policy = None
    if cfg.kl_coef > 0:
        ref_policy = HFCausalPolicy.from_name(start["reference_model"], device=ranks.device, dtype=cfg.dtype)
        ref_policy.model.requires_grad_(False).eval()
    optimizer = make_optimizer(policy, cfg)
    source, remote = None, ranks.nodes > 1 and not cfg.serial
    if remote and ranks.local_rank == 0:  # this node's workers, fed by rank 0
        from nanorllm.pipeline.learner import PipelineSource

        # Version -1 until rank 0's weights are here (attach): no job starts before.
        node = SimpleNamespace(cfg=cfg, policy=policy, optimizer=optimizer, start_step=-1, devices=devices,
                               ranks=ranks, stop_requested=False)
        source = PipelineSource(node, draws=False)  # takes its first shares of tasks from rank 0
    elif remote:
        ranks.broadcast()  # the first shares of tasks: for the nodes' leaders
    ranks.parallel = cfg.learner_parallel
    ranks.attach(policy, optimizer)  # rank 0's weights and optimizer state
    if source is not None:
        source.weights.publish(start["start_step"])  # the workers start from rank 0's weights
    try:
        while (step := ranks.begin()) is not None:
            if callable(step):  # not a step: a collective rank 0 runs between steps (LearnerRanks.together)
                step(policy, optimizer, ranks)
                continue
            if source is not None:
                source.next_batch(step)  # this node's episodes of the step, sent to rank 0 in there
            elif remote:
                ranks.gather([])
            share = ranks.receive()
            if share is None:  # rank 0 stopped before training this step
                continue
            policy.version = share["version"]
            train_step(policy, optimizer, share["results"], cfg, ref_policy=ref_policy, ranks=ranks)
            if source is not None:
                source.after_update(step)  # publishes the new weights here, takes the next shares
            elif remote:
                ranks.broadcast()
    finally:
        if source is not None:
            source.close()
    return 0


def spawned_rank(rank: int, world: int, address: str, device: str, timeout_s: float, start_timeout_s: float,
                 parent_pid: int) -> None:
    """Entry point of a rank that rank 0 spawned (no torchrun)."""
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ranks = LearnerRanks(rank=rank, world=world, local_rank=rank, local_world=world, device=device)
    ranks.init(address, timeout_s, start_timeout_s)
    code = follow(ranks)
    ranks.close()
    sys.exit(code)


def follow_torchrun(argv: list[str]) -> int:
    """A torchrun rank other than 0. Its devices come from its own command line (the same on every
    node); everything else from rank 0, so `--resume DIR` need not be readable here."""
    from nanorllm.config import ConfigError, parse_config
    from nanorllm.ranks.group import learner_spec
    from nanorllm.utils.devices import resolve_devices

    if "--resume" in argv:
        i = argv.index("--resume")
        argv = argv[:i] + argv[i + 2:]
    try:
        cfg = parse_config(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    devices = resolve_devices(cfg.devices, cfg.num_workers, serial=cfg.serial, learner_spec=learner_spec(cfg))
    ranks = LearnerRanks.start(devices, cfg.learner_timeout_s, cfg.worker_start_timeout_s,
                               parallel=cfg.learner_parallel)
    try:
        return follow(ranks, devices)
    finally:
        ranks.close()
