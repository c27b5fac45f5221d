"""Precision benchmark: fp32 against bf16 side by side on this machine, the hardware's ceiling beside them, and
what `--dtype auto` picks here and why (utils/precision.py).

    python launch/bench.py precision [--quick] [--json runs/precision.json]
    python launch/bench.py precision --main-job --seeds 0,1,2      # + the README's main job in each precision

Each round times fp32 then bf16 on the same inputs, interleaved so load from other processes falls on both alike;
the medians of the rounds after the first (a warm-up) are reported. The update starts from the same weights each
time (restored after it), so both compute the same function on the same episodes.

Figures, for DT in fp32 and bf16:
  matmul_gflops_DT            a (1024 x 576) @ (576 x 1536) matmul at --threads: the ceiling the default model's
                              linears (hidden 576, MLP 1536) can reach here
  update_s_DT                 one learner update of one default step's episodes (train_step's perf/train_s)
  rollout_tokens_per_s_DT     sampled tokens per second of one default step's rollouts (the training engine, on the
                              replica a worker holds: fp32, or bf16 weights)
  bf16_speedup_matmul, bf16_speedup_update, bf16_speedup_rollout   fp32's time over bf16's
  mismatch_k3_S               the sampler against the learner at equal weights: the mean per-token k3 of the
                              sampled tokens' logprobs (the decode engine's) against the learner's before its update
                              (`pipeline/mismatch_kl` at lag 0), on one default step's episodes, for the sampler S:
                              fp32 (an fp32 replica, an fp32 learner), bf16 (the bf16 replica a worker holds: bf16
                              weights and residual stream) and bf16_autocast (bf16 autocast over fp32 weights, as the
                              learner computes), the last two scored by a bf16 learner
  mismatch_tokens_per_s_S     that sampler's sampled tokens per second
  with --main-job, per seed: main_wall_s_DT_sS and main_gain_DT_sS (the run's wall seconds to its end and its
  held-out gain in points)
and `auto`: the dtype --dtype auto chooses on this machine's devices, with its reason.
"""

import time
from dataclasses import dataclass, replace

import torch

from nanorllm.bench.packing import sampled_episodes
from nanorllm.bench.record import median, record_run
from nanorllm.config import TrainConfig
from nanorllm.config.specs import task_specs
from nanorllm.datasets.tasks import load_tasks
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.trainer.training_engine import training_engine
from nanorllm.trainer.step import train_step
from nanorllm.trainer.update import make_optimizer
from nanorllm.utils.precision import choose_precision

DTYPES = ("float32", "bfloat16")
SHORT = {"float32": "fp32", "bfloat16": "bf16"}


@dataclass
class PrecisionBenchConfig:
    quick: bool = False
    """tiny-random: checks that every measurement runs (its figures are not the reference)."""
    model: str = "smollm2-135m-instruct"
    """Model (ignored with --quick)."""
    rounds: int = 3
    """Interleaved rounds (fp32 then bf16 each); the first warms up and is not counted."""
    threads: int = 2
    """Torch threads (CPU)."""
    main_job: bool = False
    """Also run the README's main job (launch/train.py's defaults) once per precision and seed: its wall time and
    held-out gain (tens of minutes on 2 CPU cores)."""
    seeds: str = "0"
    """The main job's seeds, comma-separated."""
    json: str | None = None
    """Also write the figures here."""


def run_precision_bench(b: PrecisionBenchConfig) -> int:
    t_start = time.perf_counter()
    torch.set_num_threads(b.threads)
    torch.set_flush_denormal(True)
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    cfg = TrainConfig(model="tiny-random" if b.quick else b.model, drop_zero_std_groups=False)
    chosen = choose_precision("auto", [device])
    figures = {**matmul_figures(b.rounds, device), **update_figures(cfg, b.rounds, device),
               **rollout_figures(cfg, b.rounds, device), **mismatch_figures(cfg, device)}
    for what, unit in (("matmul", "matmul_gflops"), ("rollout", "rollout_tokens_per_s")):
        figures[f"bf16_speedup_{what}"] = figures[f"{unit}_bf16"] / figures[f"{unit}_fp32"]
    figures["bf16_speedup_update"] = figures["update_s_fp32"] / figures["update_s_bf16"]
    if b.main_job:
        figures.update(main_job_figures(b))
    for k, v in figures.items():
        print(f"{k:36s} {v:12.6g}")
    print(f"auto on {device}: {chosen.name} ({chosen.why})")
    record_run(figures, t_start, b.json, model=cfg.model, device=device, threads=b.threads, auto=chosen.name,
               auto_why=chosen.why)
    return 0


def interleaved(measure, rounds: int) -> dict[str, float]:
    """measure(dtype) for fp32 then bf16, `rounds` times; the medians of the rounds after the first."""
    seen = {dt: [] for dt in DTYPES}
    for r in range(rounds):
        for dt in DTYPES:
            value = measure(dt)
            if r or rounds == 1:
                seen[dt].append(value)
    return {dt: median(v) for dt, v in seen.items()}


def matmul_figures(rounds: int, device: str) -> dict:
    a, b = torch.randn(1024, 576, device=device), torch.randn(576, 1536, device=device)

    def gflops(dt: str) -> float:
        x, y = a.to(getattr(torch, dt)), b.to(getattr(torch, dt))
        x @ y
        n, t0 = 10, time.perf_counter()
        for _ in range(n):
            x @ y
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return 2 * 1024 * 576 * 1536 * n / (time.perf_counter() - t0) / 1e9

    return {f"matmul_gflops_{SHORT[dt]}": v for dt, v in interleaved(gflops, rounds).items()}


def update_figures(cfg: TrainConfig, rounds: int, device: str) -> dict:
    """One default step's episodes (sampled once, in fp32), trained by an fp32 and a bf16 learner in turn."""
    policies = {dt: HFCausalPolicy.from_name(cfg.model, device=device, dtype=dt) for dt in DTYPES}
    tasks = load_tasks(task_specs(cfg)[0], limit=cfg.tasks_per_step)
    results = sampled_episodes(policies["float32"], cfg, tasks, samples=cfg.num_samples_per_task)
    start = [p.detach().clone() for p in policies["float32"].parameters()]

    def update_s(dt: str) -> float:
        policy, run_cfg = policies[dt], replace(cfg, dtype=dt)
        m = train_step(policy, make_optimizer(policy, run_cfg), results, run_cfg)
        with torch.no_grad():
            for p, s in zip(policy.parameters(), start):
                p.copy_(s)
        return m["perf/train_s"]

    return {f"update_s_{SHORT[dt]}": v for dt, v in interleaved(update_s, rounds).items()}


def rollout_figures(cfg: TrainConfig, rounds: int, device: str) -> dict:
    """One default step's rollouts on a worker's replica of each precision."""
    tasks = load_tasks(task_specs(cfg)[0], limit=cfg.tasks_per_step)
    engines = {dt: training_engine(HFCausalPolicy.from_name(cfg.model, device=device, dtype=dt, replica=True), cfg)
               for dt in DTYPES}

    def tokens_per_s(dt: str) -> float:
        t0 = time.perf_counter()
        results = engines[dt].run(tasks, num_samples=cfg.num_samples_per_task, seed=0).results
        return sum(len(s.response_ids) for r in results for s in r.step_samples) / (time.perf_counter() - t0)

    return {f"rollout_tokens_per_s_{SHORT[dt]}": v for dt, v in interleaved(tokens_per_s, rounds).items()}


SAMPLERS = {"fp32": ("float32", True), "bf16": ("bfloat16", True), "bf16_autocast": ("bfloat16", False)}


def mismatch_figures(cfg: TrainConfig, device: str) -> dict:
    """Each sampler of SAMPLERS (dtype, replica) samples one default step's rollouts; a learner of that dtype, at the
    same weights, scores them in an update (restored after it). What is left between the bf16 learner and a sampler
    computing as it does is the decode's own: one token a row against the learner's whole sequence, other matmul
    shapes, so other roundings of each bf16 product."""
    tasks = load_tasks(task_specs(cfg)[0], limit=cfg.tasks_per_step)
    learners = {dt: HFCausalPolicy.from_name(cfg.model, device=device, dtype=dt) for dt in DTYPES}
    start = [p.detach().clone() for p in learners["float32"].parameters()]
    figures = {}
    for name, (dt, replica) in SAMPLERS.items():
        engine = training_engine(HFCausalPolicy.from_name(cfg.model, device=device, dtype=dt, replica=replica), cfg)
        t0 = time.perf_counter()
        results = engine.run(tasks, num_samples=cfg.num_samples_per_task, seed=0).results
        figures[f"mismatch_tokens_per_s_{name}"] = (sum(len(s.response_ids) for r in results for s in r.step_samples)
                                                    / (time.perf_counter() - t0))
        for i, r in enumerate(results):
            r.trajectory.final_reward = float(i % 2)  # every group trains: every token is scored
        policy, run_cfg = learners[dt], replace(cfg, dtype=dt)
        m = train_step(policy, make_optimizer(policy, run_cfg), results, run_cfg)
        figures[f"mismatch_k3_{name}"] = m["approx_kl"]
        with torch.no_grad():
            for p, s in zip(policy.parameters(), start):
                p.copy_(s)
    return figures


def main_job_figures(b: PrecisionBenchConfig) -> dict:
    """The README's main job (launch/train.py's defaults, --model and --threads aside) per precision and seed."""
    import tempfile

    from nanorllm.run.lifecycle import run_training

    figures = {}
    for seed in [int(s) for s in b.seeds.split(",")]:
        for dt in DTYPES:
            with tempfile.TemporaryDirectory(prefix="nanorllm-precision-") as out:
                cfg = TrainConfig(model=b.model, dtype=dt, seed=seed, output_dir=out, run_name="main")
                t0 = time.perf_counter()
                outcome = run_training(cfg, quiet=True)
                wall = time.perf_counter() - t0
            if outcome.exit_code != 0:
                raise RuntimeError(f"the main job in {dt}, seed {seed}, ended with exit code {outcome.exit_code}")
            figures[f"main_wall_s_{SHORT[dt]}_s{seed}"] = wall
            figures[f"main_gain_{SHORT[dt]}_s{seed}"] = 100 * outcome.summary["gain"]
    return figures
