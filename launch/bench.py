"""Benchmarks: each figure is a ratio of two things measured side by side in this one run.

    python launch/bench.py --quick               # tiny-random model, a few minutes on 2 CPU cores
    python launch/bench.py --json runs/bench.json  # the default model (slow on CPU)
    python launch/bench.py --learning [--quick]  # held-out learning per update and per second (launch/learning.py)
    python launch/bench.py --learner-ranks [--quick]  # learner step on 1 vs 2 ranks, parity, transfers (launch/learner_ranks.py)
    python launch/bench.py --gpu [--dry-run]     # the decode engine on a GPU (nanorllm/bench/gpu.py)

--quick checks that every measurement runs; its figures are not the reference (0.36 MB of weights
make broadcast_vs_copy a measure of per-call overhead, and tiny-model steps are sub-second).

Figures (targets in TARGETS):
  pipeline_speedup          serial wall time / pipeline wall time, same updates, tasks and seeds
  overlap_efficiency        pipeline_speedup / ideal, ideal = (rollout + train) / max(rollout, train) (serial)
  broadcast_vs_copy         weight publish + one worker load / one plain copy_ of the same bytes
  worker_blocked_frac       share of worker time waiting for weights or queue space
  learner_wait_frac         share of learner time waiting for data
  policy_lag_mean/max, stale_dropped
  rollout_batching_speedup  tokens/s of one batched engine call / one episode at a time with `generate`
  decode_useful_frac        decode rows whose sampled token is kept / rows computed in decode steps, in one
                            default training step (8 tasks x 4 samples, 2 turns); a finished row still computed
                            counts against it
  gen_vs_forward            kept tokens/s of that step / the model's bare batched decode forwards at the step's
                            mean batch and context (what sampling, prefills, the env and small tail batches cost)
  learner_efficiency        train tokens/s of train_step / a bare fwd+bwd+step on the same batch
  worker_scaling            throughput with 2 workers / (2 x 1 worker), same job per worker, tiny model
                            (learner not the bottleneck)
"""

import copy
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import tyro  # noqa: E402

from nanorllm.config import TrainConfig  # noqa: E402
from nanorllm.datasets.tasks import load_tasks  # noqa: E402
from nanorllm.pipeline.weights import SharedWeights  # noqa: E402
from nanorllm.policy.base import SamplingParams  # noqa: E402
from nanorllm.policy.hf_causal import HFCausalPolicy  # noqa: E402
from nanorllm.rollout.engine import RolloutEngine  # noqa: E402
from nanorllm.trainer.collate import collate_train_batch  # noqa: E402
from nanorllm.trainer.metrics import decode_useful_frac  # noqa: E402
from nanorllm.trainer.step import train_step  # noqa: E402
from nanorllm.trainer.update import make_optimizer  # noqa: E402
from launch.trial import run_trial  # noqa: E402

TARGETS = {  # (comparison, target)
    "pipeline_speedup": (">=", 1.6), "overlap_efficiency": (">=", 0.85), "broadcast_vs_copy": ("<=", 2.0),
    "worker_blocked_frac": ("<=", 0.01), "learner_wait_frac": ("<=", 0.1), "rollout_batching_speedup": (">=", 4.0),
    "decode_useful_frac": (">=", 0.95), "gen_vs_forward": (">=", 0.5),
    "learner_efficiency": (">=", 0.8), "worker_scaling": (">=", 0.9),
}


CEILINGS = {  # what this machine allows, from the same runs: a figure at its ceiling cannot go higher here
    "_split_ceiling": "pipeline_speedup ceiling (serial step / slower pipeline phase at its thread count)",
    "_cpu_ceiling": "worker_scaling ceiling (CPU cores / twice the cores busy with one worker)",
    "_bare_two_process_scaling": "two plain rollout processes, no learner, no pipeline (2 procs / 2 x 1 proc)",
}


@dataclass
class BenchConfig:
    quick: bool = False
    """tiny-random everywhere and few steps (minutes on a 2-core CPU)."""
    model: str = "smollm2-135m-instruct"
    """Model for the full run (ignored with --quick)."""
    steps: int = 5
    """Learner updates per timed run (the first is warm-up and not timed)."""
    json: str | None = None
    """Also write the figures here."""
    devices: str = "auto"
    """Devices for the pipeline runs (see launch/train.py --devices)."""


def train_config(b: BenchConfig, **kw) -> TrainConfig:
    model = "tiny-random" if b.quick else b.model
    # Keep zero-variance groups: speed figures must not depend on how many rewards happen to differ.
    base = TrainConfig(model=model, max_steps=b.steps, tasks_per_step=4, num_samples_per_task=4,
                       max_new_tokens=32 if not b.quick else 48, devices=b.devices, seed=0,
                       drop_zero_std_groups=False)
    return replace(base, **kw)


def on_cpu(b: BenchConfig) -> bool:
    return b.devices == "cpu" or (b.devices == "auto" and not torch.cuda.is_available())


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


def bench_rollout_batching(policy: HFCausalPolicy, tasks: list[dict], max_new_tokens: int) -> dict:
    """Same episodes, same forced length (no EOS): one batched engine call vs plain generate, one by one."""
    eos = policy.eos_ids
    policy.eos_ids = []  # every response runs to max_new_tokens
    try:
        engine = RolloutEngine(policy, sampling=SamplingParams(max_new_tokens=max_new_tokens), max_turns=1)
        t0 = time.perf_counter()
        results = engine.run(tasks, num_samples=1, seed=0)
        batched_s = time.perf_counter() - t0
        tokens = sum(len(s.response_ids) for r in results for s in r.step_samples)
        t0 = time.perf_counter()
        single_tokens = 0
        for r in results:
            ids = torch.tensor([r.step_samples[0].prompt_ids], device=policy.device)
            out = policy.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                        max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                                        pad_token_id=policy.pad_id, top_k=0)
            single_tokens += out.shape[1] - ids.shape[1]
        single_s = time.perf_counter() - t0
    finally:
        policy.eos_ids = eos
    return {"rollout_batching_speedup": (tokens / batched_s) / (single_tokens / single_s),
            "_batched_tokens_per_s": tokens / batched_s, "_single_tokens_per_s": single_tokens / single_s,
            "_episodes": len(tasks), "_batched_tokens": tokens, "_single_tokens": single_tokens}


def bench_decode(policy: HFCausalPolicy, cfg: TrainConfig, tasks: list[dict]) -> dict:
    """One default training step's rollouts, then bare decode forwards at its mean batch and context."""
    from transformers import DynamicCache

    from nanorllm.rollout.build import training_engine

    engine = training_engine(policy, cfg)
    engine.run(tasks[:2], num_samples=1, seed=1)  # warm-up
    t0 = time.perf_counter()
    results = engine.run(tasks[:cfg.tasks_per_step], num_samples=cfg.num_samples_per_task, seed=0)
    step_s = time.perf_counter() - t0
    st = results[0].timings
    samples = [s for r in results for s in r.step_samples]
    batch = max(1, round(st["decode_rows"] / max(st["decode_steps"], 1)))
    context = round(sum(len(s.prompt_ids) + len(s.response_ids) / 2 for s in samples) / len(samples))
    steps = cfg.max_new_tokens
    ids = torch.randint(0, len(policy.tokenizer), (batch, context + steps), device=policy.device)
    mask = torch.ones_like(ids)
    pos = torch.arange(context + steps, device=policy.device).expand(batch, -1)
    with policy.decode_batch(SamplingParams()):  # eval mode, no grad, the policy's autocast
        cache = DynamicCache()
        policy.cached_forward(ids[:, :context], mask[:, :context], pos[:, :context], cache)
        t0 = time.perf_counter()
        for t in range(context, context + steps):  # attention over a growing cache, as in sampling
            policy.cached_forward(ids[:, t:t + 1], mask[:, :t + 1], pos[:, t:t + 1], cache)
        bare_s = time.perf_counter() - t0
    gen_per_s, bare_per_s = st["tokens_kept"] / step_s, batch * steps / bare_s
    return {"decode_useful_frac": decode_useful_frac(st),
            "gen_vs_forward": gen_per_s / bare_per_s, "_step_s": step_s, "_tokens_kept": st["tokens_kept"],
            "_decode_rows": st["decode_rows"], "_decode_steps": st["decode_steps"],
            "_prefill_tokens": st["prefill_tokens"], "_reused_tokens": st["reused_tokens"], "_turns": len(samples),
            "_gen_tokens_per_s": gen_per_s, "_bare_forward_tokens_per_s": bare_per_s, "_mean_batch": batch,
            "_mean_context": context}


def bench_learner(policy: HFCausalPolicy, cfg: TrainConfig, tasks: list[dict]) -> dict:
    engine = RolloutEngine(policy, sampling=SamplingParams(max_new_tokens=cfg.max_new_tokens,
                                                           temperature=cfg.temperature), max_turns=cfg.max_turns)
    results = engine.run(tasks, num_samples=cfg.num_samples_per_task, seed=1)
    for i, r in enumerate(results):  # alternate rewards so every sample carries a gradient
        r.trajectory.final_reward = float(i % 2)
    cfg = replace(cfg, drop_zero_std_groups=False, micro_batch_tokens=10**9)
    opt = make_optimizer(policy, cfg)
    train_step(policy, opt, results, cfg)  # warm-up
    m = train_step(policy, opt, results, cfg)
    ours = m["train/tokens"] / m["perf/train_s"]
    batch = collate_train_batch([s for r in results for s in r.step_samples], pad_id=policy.pad_id,
                                device=policy.device)
    labels = batch["input_ids"].masked_fill(batch["loss_mask"] == 0, -100)
    policy.model.train()
    for _ in range(2):  # warm-up, then timed
        t0 = time.perf_counter()
        loss = policy.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        bare_s = time.perf_counter() - t0
    return {"learner_efficiency": ours / (m["train/tokens"] / bare_s), "_train_step_s": m["perf/train_s"],
            "_bare_s": bare_s, "_tokens": m["train/tokens"]}


def _rollout_server(cfg: TrainConfig, commands, out) -> None:
    """One process, one thread: on each command n, run n engine calls of one worker job's size."""
    from nanorllm.rollout.build import training_engine

    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    policy = HFCausalPolicy.from_name(cfg.model, seed=cfg.seed)
    engine = training_engine(policy, cfg)
    tasks = load_tasks(cfg.tasks, limit=cfg.tasks_per_step)
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


def main() -> int:
    if "--learning" in sys.argv:  # its own benchmark, with its own flags
        from launch.learning import main as learning_main
        return learning_main([a for a in sys.argv[1:] if a != "--learning"])
    if "--gpu" in sys.argv:  # the decode engine's GPU figures (nanorllm/bench/gpu.py)
        from nanorllm.bench.gpu import main as gpu_main
        return gpu_main([a for a in sys.argv[1:] if a != "--gpu"])
    if "--learner-ranks" in sys.argv:  # 1 vs N learner ranks (launch/learner_ranks.py)
        from launch.learner_ranks import main as ranks_main
        return ranks_main([a for a in sys.argv[1:] if a != "--learner-ranks"])
    b = tyro.cli(BenchConfig)
    torch.set_flush_denormal(True)
    figures, t_start = {}, time.perf_counter()
    print("[bench] pipeline vs serial ...", flush=True)
    figures.update(bench_pipeline(b))
    torch.set_num_threads(os.cpu_count() or 1)
    cfg = train_config(b)
    policy = HFCausalPolicy.from_name(cfg.model, device="cuda:0" if torch.cuda.is_available() else "cpu")
    tasks = load_tasks(cfg.tasks, limit=32)  # 32 episodes: one default training step (8 tasks x 4)
    default_step = replace(TrainConfig(), model=cfg.model)
    print("[bench] weight broadcast ...", flush=True)
    figures.update(bench_broadcast(policy))
    print("[bench] rollout batching ...", flush=True)
    figures.update(bench_rollout_batching(policy, tasks, max_new_tokens=16))
    print("[bench] decode efficiency ...", flush=True)
    figures.update(bench_decode(policy, default_step, tasks))
    print("[bench] learner efficiency ...", flush=True)
    figures.update(bench_learner(policy, cfg, tasks[:4]))  # 4 tasks x 4 episodes
    print("[bench] worker scaling ...", flush=True)
    figures.update(bench_worker_scaling(b))

    print(f"\n{'figure':28s} {'value':>9s}  target")
    for k, v in figures.items():
        if k.startswith("_"):
            continue
        cmp, target = TARGETS.get(k, ("", None))
        ok = "" if target is None else ("ok" if (v >= target if cmp == ">=" else v <= target) else "MISS")
        print(f"{k:28s} {v:9.3f}  {cmp} {target if target is not None else ''} {ok}")
    for key, what in CEILINGS.items():
        if key in figures:
            print(f"  {what}: {figures[key]:.3f}")
    record_run(figures, t_start, b.json, quick=b.quick, model="tiny-random" if b.quick else b.model)
    return 0


def record_run(figures: dict, t_start: float, json_path: str | None, **fields) -> dict:
    """The run's record (date, machine, command, time, figures), written to `json_path` when given."""
    record = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), **fields,
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
              f"torch {torch.__version__}, cuda {torch.cuda.is_available()}",
              "command": " ".join(sys.argv), "total_s": time.perf_counter() - t_start, "figures": figures}
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(record, indent=2, default=float) + "\n")
    print(f"[bench] {record['total_s']:.0f} s")
    return record


if __name__ == "__main__":
    sys.exit(main())
