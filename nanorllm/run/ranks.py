"""How learner ranks come to be: rank 0 spawns ranks 1..N-1 (no torchrun), or torchrun started every
process and each finds its rank in the environment. The ranks' work is ranks/group.py (rank 0's side)
and run/follower.py (every other rank's). It is wiring: it starts the follower loop, so it sits
here beside it, above the folders it uses."""

import os
import signal
import sys

from nanorllm.config import ConfigError, parse_config
from nanorllm.ranks.group import LearnerRanks, free_port, under_torchrun
from nanorllm.run.assembly import run_devices
from nanorllm.run.follower import follow
from nanorllm.utils.children import process
from nanorllm.utils.devices import DeviceError, DeviceMap
from nanorllm.utils.lifeline import die_with_parent


def start_learner(cfg, devices: DeviceMap) -> LearnerRanks:
    """This process's learner ranks on the run's `devices` (the other ranks start loading now)."""
    return start_ranks(devices, cfg.learner_timeout_s, cfg.worker_start_timeout_s, parallel=cfg.learner_parallel)


def start_ranks(devices: DeviceMap, timeout_s: float, start_timeout_s: float = 0.0, *,
                parallel: str = "ddp", follower=follow) -> LearnerRanks:
    """This process's rank: from torchrun's environment, or rank 0 of ranks it spawns now, each running
    `follower(ranks)` (a module-level function: RL's `follow`, or SFT's). Until the first step's shares
    go out, collectives wait up to `start_timeout_s` (imports, model loads and the workers' start are
    slow); from then on `timeout_s`."""
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun() else len(devices.learners)
    check_parallel(parallel, world, devices.learner)
    if under_torchrun() and world > 1:
        local, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
        if len(devices.learners) != local_world:
            raise DeviceError(f"learner_devices: torchrun started {local_world} process(es) on this node, "
                              f"--learner-devices names {len(devices.learners)} ({devices.learners})")
        ranks = LearnerRanks(rank=int(os.environ["RANK"]), world=int(os.environ["WORLD_SIZE"]), local_rank=local,
                             local_world=local_world, device=devices.learners[local], parallel=parallel)
        ranks.init("env://", timeout_s, start_timeout_s)
        return ranks
    n = len(devices.learners)
    ranks = LearnerRanks(world=n, local_world=n, device=devices.learner, parallel=parallel)
    if n == 1:
        return ranks
    address = f"tcp://127.0.0.1:{free_port()}"
    for r in range(1, n):
        p = process(spawned_rank, name=f"nanorllm-learner-{r}",
                    args=(r, n, address, devices.learners[r], timeout_s, start_timeout_s, os.getpid(), follower))
        p.start()
        ranks.procs[r], ranks.devices[r] = p, devices.learners[r]
    ranks.init(address, timeout_s, start_timeout_s)
    return ranks


def check_parallel(parallel: str, world: int, device: str) -> None:
    """DeviceError when `parallel` cannot run on `world` ranks (FSDP shards over several)."""
    if parallel == "fsdp" and world == 1:
        raise DeviceError(f"learner_parallel: fsdp shards the learner over several ranks, but there is one "
                          f"({device}); give --learner-devices N > 1 or use --learner-parallel ddp")


def spawned_rank(rank: int, world: int, address: str, device: str, timeout_s: float, start_timeout_s: float,
                 parent_pid: int, follower=follow) -> None:
    """Entry point of a rank that rank 0 spawned (no torchrun)."""
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ranks = LearnerRanks(rank=rank, world=world, local_rank=rank, local_world=world, device=device)
    ranks.init(address, timeout_s, start_timeout_s)
    code = follower(ranks)
    ranks.close()
    sys.exit(code)


def follow_torchrun(argv: list[str]) -> int:
    """A torchrun rank other than 0. Its devices come from its own command line (the same on every
    node); everything else from rank 0, so `--resume DIR` need not be readable here."""
    if "--resume" in argv:
        i = argv.index("--resume")
        argv = argv[:i] + argv[i + 2:]
    try:
        cfg = parse_config(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    devices = run_devices(cfg)
    ranks = start_learner(cfg, devices)
    try:
        return follow(ranks, devices)
    finally:
        ranks.close()
