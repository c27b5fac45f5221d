"""Pipeline figures: serial vs pipeline on the same updates, the weight broadcast, worker scaling."""

import copy
import os
import time
from dataclasses import replace

import torch

from nanorllm.bench.config import BenchConfig, on_cpu, train_config
from nanorllm.bench.trial import run_trial
from nanorllm.config import TrainConfig
from nanorllm.datasets.tasks import load_tasks
from nanorllm.config.specs import task_specs
from nanorllm.pipeline.weights import SharedWeights
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.trainer.training_engine import training_engine


def bench_pipeline(b: BenchConfig) -> dict:
    serial = run_trial(train_config(b, serial=True))
    pipe = run_trial(train_config(b, num_workers=1, max_policy_lag=1, threads=1 if on_cpu(b) else None))
    speedup = serial["timed_s"] / pipe["timed_s"]
    ideal = (serial["rollout_s"] + serial["train_s"]) / max(serial["rollout_s"], serial["train_s"])
    # The pipeline cannot step faster than its slower phase as it runs there (one thread each on CPU):
    split_ceiling = serial["step_s"] / max(pipe["rollout_s"], pipe["train_s"])
    return {
        "pipeline_speedup": speedup, "overlap_efficiency": speedup / ideal, "_split_ceiling": split_ceiling,
        "worker_blocked_frac": pipe["worker_wait_frac"], "learner_wait_frac": pipe["learner_wait_frac"],
        "policy_lag_mean": pipe["policy_lag_mean"], "policy_lag_max": pipe["policy_lag_max"],
        "stale_dropped": pipe["stale_dropped"],
        "_serial": serial, "_pipeline": pipe, "_ideal": ideal,
    }


def bench_broadcast(policy: HFCausalPolicy, repeats: int = 9) -> dict:
    """One learner publish + one worker load, as in training, against one plain copy_ of the bytes."""
    replica = copy.deepcopy(policy.model)  # the worker's copy
    store = SharedWeights(policy.model)  # the learner's side; on CPU its parameters move into the buffer
    block = store.attach(replica)
    flat_src = torch.empty_like(store.flat).copy_(store.flat)
    flat_dst = torch.empty_like(store.flat)
    flat_dst.copy_(flat_src)  # first touch of every page, outside the timing
    store.load_into(block)
    copy_s, publish_s, load_s = [], [], []
    for v in range(repeats):
        t0 = time.perf_counter()
        flat_dst.copy_(flat_src)
        copy_s.append(time.perf_counter() - t0)
        store.begin_write()  # what the optimizer's pre-step hook does before each update
        publish_s.append(store.publish(v + 1))
        load_s.append(store.load_into(block)[1])
    best = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731  (median)
    return {"broadcast_vs_copy": (best(publish_s) + best(load_s)) / best(copy_s),
            "_copy_s": best(copy_s), "_publish_s": best(publish_s), "_load_s": best(load_s), "_bytes": store.nbytes,
            "_publish_in_place": store.in_place}


def _rollout_server(cfg: TrainConfig, commands, out) -> None:
    """One process, one thread: on each command n, run n engine calls of one worker job's size."""
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    policy = HFCausalPolicy.from_name(cfg.model, seed=cfg.seed)
    engine = training_engine(policy, cfg)
    tasks = load_tasks(task_specs(cfg)[0], limit=cfg.tasks_per_step)
    engine.run(tasks, num_samples=cfg.num_samples_per_task, seed=0)  # warm-up
    out.put(None)
    while (n := commands.get()) is not None:
        for i in range(n):
            engine.run(tasks, num_samples=cfg.num_samples_per_task, seed=i + 1)
        out.put(n)


def bare_process_scaling(cfg: TrainConfig, jobs: int = 4, rounds: int = 5) -> float:
    """Two independent rollout processes / twice one: what the machine gives two workers, no pipeline.

    Alone and together alternate `rounds` times (median ratio), so drift on a shared machine
    hits both sides alike."""
    ctx = torch.multiprocessing.get_context("spawn")
    commands, outs = [ctx.Queue(), ctx.Queue()], [ctx.Queue(), ctx.Queue()]
    procs = [ctx.Process(target=_rollout_server, args=(cfg, c, o)) for c, o in zip(commands, outs)]
    for p in procs:
        p.start()
    try:
        for o in outs:
            o.get(timeout=300)  # both warmed up
        ratios = []
        for _ in range(rounds):  # jobs per second of wall time, timed here: from the command to the last result
            t0 = time.perf_counter()
            commands[0].put(jobs)
            alone = outs[0].get(timeout=300) / (time.perf_counter() - t0)
            t0 = time.perf_counter()
            for c in commands:
                c.put(jobs)
            together = sum(o.get(timeout=300) for o in outs) / (time.perf_counter() - t0)
            ratios.append(together / (2 * alone))
    finally:
        for c in commands:
            c.put(None)
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return sorted(ratios)[len(ratios) // 2]


def bench_worker_scaling(b: BenchConfig) -> dict:
    """Every worker gets the same job (4 tasks x 4 episodes) with 1 or 2 workers, so the figure
    measures what a second worker adds, not the smaller batches of a step split in two."""
    quick = replace(b, quick=True)
    steps = max(b.steps, 25) + 1  # tiny-model steps are sub-second: time enough of them
    trial = lambda n: run_trial(train_config(quick, num_workers=n, tasks_per_step=4 * n,  # noqa: E731
                                             max_policy_lag=2, threads=1, max_steps=steps))
    one, two = trial(1), trial(2)
    out = {"worker_scaling": two["episodes_per_s"] / (2 * one["episodes_per_s"]),
           "_one_worker_episodes_per_s": one["episodes_per_s"], "_two_workers_episodes_per_s": two["episodes_per_s"],
           "_one": one, "_two": two}
    if on_cpu(b):
        # Cores busy with one worker (learner + worker); twice the episodes need twice that.
        busy = (1 - one["learner_wait_frac"]) + (1 - one["worker_idle_frac"] - one["worker_wait_frac"])
        out["_cores_busy_one_worker"] = busy
        out["_cpu_ceiling"] = min(1.0, (os.cpu_count() or 1) / (2 * busy))
        out["_bare_two_process_scaling"] = bare_process_scaling(train_config(quick))
    return out
