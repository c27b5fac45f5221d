"""Learner-ranks benchmark: one training step on 1 vs N data-parallel ranks, on the same batch.

    python launch/bench.py --learner-ranks [--quick] [--fsdp]

Figures, all from this one run:
  ranks_step_speedup   learner step time with 1 rank / with N ranks (gloo on CPU, NCCL on GPUs), same
                       batch, same threads per rank; its ceiling is printed beside it: the cores (or
                       devices) the ranks get, and the largest share's tokens (groups stay whole)
  ranks_parity_max     largest parameter difference after one step, N ranks vs 1 (must be <= 1e-5)
  ranks_broadcast_vs_copy  one broadcast of the flat weight block to another rank / one plain copy_ of
                       the same bytes (what sending a version to another node costs)
  ranks_allreduce_vs_copy  one all-reduce of a gradient block of the same size / the same copy_ (what
                       every DDP step moves between ranks)
With --fsdp, also the same N-rank step with the model sharded (ranks/fsdp.py):
  fsdp_step_vs_ddp     FSDP step time / DDP step time, same batch, same ranks
  fsdp_gather_frac     the part of the FSDP step spent gathering the new weights into rank 0's model
  fsdp_parity_max      largest parameter difference after one step, FSDP vs 1 rank (must be <= 1e-5)

Every rank is a fresh spawned process that builds the model from the same seed; rank 0 scatters the
batch exactly as a training run does (ranks/group.py), so this is the training path, not a model of it.
"""

import datetime
import os
import time
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from nanorllm.bench.record import median, record_run
from nanorllm.bench.spawned import spawned_answer
from nanorllm.config import TrainConfig
from nanorllm.datasets.tasks import load_tasks
from nanorllm.config.specs import task_specs
from nanorllm.ranks.group import LearnerRanks, free_port
from nanorllm.ranks.split import episode_tokens, split_groups
from nanorllm.policy.base import SamplingParams
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.config.specs import lora_spec
from nanorllm.policy.lora import trainable_parameters
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.trainer.step import train_step
from nanorllm.trainer.update import make_optimizer


def _on_spawned_ranks(world: int, target, *args):
    """Run target(rank, world, address, *args, out) on `world` spawned processes; rank 0's `out.put`."""
    address = f"tcp://127.0.0.1:{free_port()}"
    return spawned_answer(target, [(r, world, address, *args) for r in range(world)])


def run_cases(ranks: LearnerRanks, cases: list[tuple[TrainConfig, list]], steps: int) -> list[dict]:
    """On every rank: for each (cfg, results) a fresh model from cfg's seed, `steps` training steps
    of `results` (rank 0 scatters them as a run does). Rank 0 gets, per case, the parameters after
    the first step and the median time of the later steps (or of the one step)."""
    got = []
    for cfg, results in cases:
        gathers = []
        policy = HFCausalPolicy.from_name(cfg.model, seed=cfg.seed, lora=lora_spec(cfg))
        optimizer = make_optimizer(policy, cfg)
        ranks.attach(policy, optimizer)
        params, times = None, []
        for i in range(steps):
            if ranks.world > 1:
                dist.barrier()  # every rank starts the step together: the time is the step's, not a straggler's
            t0 = time.perf_counter()
            share = ranks.share(results, 0) if ranks.rank == 0 else ranks.receive()["results"]
            gathers.append(train_step(policy, optimizer, share, cfg, ranks=ranks).get("perf/gather_s", 0.0))
            times.append(time.perf_counter() - t0)
            if i == 0 and ranks.rank == 0:  # under FSDP the other ranks hold shards
                params = torch.cat([p.detach().flatten() for _, p in trainable_parameters(policy.model)]).clone()
        got.append({"params": params, "step_s": median(times[1:]) if steps > 1 else times[0],
                    "gather_s": median(gathers[1:]) if steps > 1 else gathers[0]})
    return got


def _rank_main(rank: int, world: int, address: str, cases: list, steps: int, threads: int, parallel: str,
               out) -> None:
    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    ranks = LearnerRanks(rank=rank, world=world, local_rank=rank, local_world=world, device="cpu", parallel=parallel)
    if world > 1:
        ranks.init(address, 300)
    got = run_cases(ranks, cases, steps)
    if rank == 0:  # numpy, not tensors: torch would share their memory with a process about to exit
        out.put([{**g, "params": g["params"].numpy()} for g in got])
    ranks.close()


def steps_on_ranks(world: int, cases: list[tuple[TrainConfig, list]], *, steps: int = 1, threads: int = 1,
                   spawn: bool = False, parallel: str = "ddp") -> list[dict]:
    """`run_cases` on `world` gloo ranks spawned here (one rank: in this process unless `spawn`);
    `parallel`: how the ranks hold the model (ddp, fsdp)."""
    if world == 1 and not spawn:
        return run_cases(LearnerRanks(), cases, steps)
    got = _on_spawned_ranks(world, _rank_main, cases, steps, threads, parallel)
    return [{**g, "params": torch.from_numpy(g["params"])} for g in got]


def _transfer_main(rank: int, world: int, address: str, numel: int, repeats: int, out) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    block = torch.ones(numel)
    times = {"broadcast": [], "all_reduce": []}
    for _ in range(repeats):
        for kind in times:
            dist.barrier()
            t0 = time.perf_counter()
            dist.broadcast(block, src=0) if kind == "broadcast" else dist.all_reduce(block)
            times[kind].append(time.perf_counter() - t0)
    if rank == 0:
        out.put({k: median(v) for k, v in times.items()})
    dist.destroy_process_group()


def transfer_costs(numel: int, repeats: int = 5) -> dict:
    """Broadcast and all-reduce of a numel-float32 block between 2 gloo ranks vs one copy_ of it."""
    got = _on_spawned_ranks(2, _transfer_main, numel, repeats)
    src, dst = torch.ones(numel), torch.empty(numel)
    dst.copy_(src)  # first touch outside the timing
    copies = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        copies.append(time.perf_counter() - t0)
    copy_s = median(copies)
    return {"ranks_broadcast_vs_copy": got["broadcast"] / copy_s, "ranks_allreduce_vs_copy": got["all_reduce"] / copy_s,
            "_broadcast_s": got["broadcast"], "_allreduce_s": got["all_reduce"], "_copy_s": copy_s,
            "_transfer_bytes": numel * 4}


def bench_learner_ranks(cfg: TrainConfig, results: list, *, world: int = 2, steps: int = 4, fsdp: bool = False) -> dict:
    """Step time 1 vs `world` ranks and the parity of their first step, on `results`; then transfers;
    with `fsdp` the same `world` ranks sharded, against DDP."""
    cfg = replace(cfg, drop_zero_std_groups=False)
    one, = steps_on_ranks(1, [(cfg, results)], steps=steps, spawn=True)  # a fresh process each side, 1 thread a rank
    many, = steps_on_ranks(world, [(cfg, results)], steps=steps)
    sharded = {}
    if fsdp:
        f, = steps_on_ranks(world, [(cfg, results)], steps=steps, parallel="fsdp")
        sharded = {"fsdp_step_vs_ddp": f["step_s"] / many["step_s"], "fsdp_gather_frac": f["gather_s"] / f["step_s"],
                   "fsdp_parity_max": float((one["params"] - f["params"]).abs().max()),
                   "_fsdp_step_s": f["step_s"], "_fsdp_gather_s": f["gather_s"]}
    shares = split_groups(results, world)
    total = sum(episode_tokens(r) for r in results)
    largest = max(sum(episode_tokens(r) for r in s) for s in shares)
    numel = one["params"].numel()
    return {
        "ranks_step_speedup": one["step_s"] / many["step_s"],
        "_ranks_ceiling": min(world, os.cpu_count() or 1, total / max(largest, 1)),
        "ranks_parity_max": float((one["params"] - many["params"]).abs().max()),
        "_one_rank_step_s": one["step_s"], "_ranks_step_s": many["step_s"], "_world": world,
        **transfer_costs(numel), **sharded,
    }


@dataclass
class RanksBenchConfig:
    quick: bool = False
    """tiny-random (minutes on a 2-core CPU); otherwise the default model."""
    model: str = "smollm2-135m-instruct"
    """Model (ignored with --quick)."""
    world: int = 2
    """Learner ranks compared with one."""
    steps: int = 6
    """Steps per side; the first is warm-up (its parameters are the parity check's)."""
    fsdp: bool = False
    """Also the same step with the model sharded over the ranks (--learner-parallel fsdp), against DDP."""
    json: str | None = None
    """Also write the figures here."""


def run_ranks_bench(b: RanksBenchConfig) -> int:
    """The figures on a batch of the default step's shape, printed and recorded."""
    torch.set_flush_denormal(True)
    t_start = time.perf_counter()
    cfg = TrainConfig(model="tiny-random" if b.quick else b.model, tasks_per_step=4, num_samples_per_task=4, seed=0)
    policy = HFCausalPolicy.from_name(cfg.model, seed=cfg.seed)
    engine = RolloutEngine(policy, sampling=SamplingParams(max_new_tokens=48 if b.quick else 32,
                                                           temperature=cfg.temperature), max_turns=cfg.max_turns)
    tasks = load_tasks(task_specs(cfg)[0], limit=cfg.tasks_per_step)
    results = engine.run(tasks, num_samples=cfg.num_samples_per_task, seed=1).results
    for i, r in enumerate(results):  # alternate rewards so every sample carries a gradient
        r.trajectory.final_reward = float(i % 2)
    print(f"[bench] learner step on 1 vs {b.world} ranks, {len(results)} episodes, then transfers ...", flush=True)
    figures = bench_learner_ranks(cfg, results, world=b.world, steps=b.steps, fsdp=b.fsdp)
    print(f"\n{'figure':28s} {'value':>12s}")
    for k, v in figures.items():
        if not k.startswith("_"):
            print(f"{k:28s} {v:12.3g}")
    print(f"  ranks_step_speedup ceiling (min of ranks, cores, batch tokens / largest share's): "
          f"{figures['_ranks_ceiling']:.3f}")
    print(f"  step {figures['_one_rank_step_s']:.3f} s on 1 rank, {figures['_ranks_step_s']:.3f} s on {b.world}; "
          f"{figures['_transfer_bytes'] / 1e6:.1f} MB: broadcast {figures['_broadcast_s'] * 1e3:.1f} ms, "
          f"all-reduce {figures['_allreduce_s'] * 1e3:.1f} ms, copy_ {figures['_copy_s'] * 1e3:.2f} ms")
    if b.fsdp:
        print(f"  FSDP step {figures['_fsdp_step_s']:.3f} s on {b.world} ranks (DDP {figures['_ranks_step_s']:.3f} s), "
              f"of which gathering the weights into rank 0's model {figures['_fsdp_gather_s'] * 1e3:.1f} ms")
    record_run(figures, t_start, b.json, model=cfg.model)
    return 0
