"""The sanity check trainers of this kind run nightly: train only on tasks the base model partly knows, and see
the trainer drive them to mastery, which a format-only gain cannot fake.

    python launch/bench.py sanity [--quick] [--candidates 128 --samples 8 --band 0.2,0.8 --steps 40]

1. Candidates: --candidates of the run's training tasks (the held-out set excluded, as a run excludes it), in
   the run's seeded order.
2. Each is sampled --samples times (K) by the base model through the training engine at the training
   temperature; its pass rate is the share of those episodes that succeeded.
3. The tasks whose pass rate lies in --band (inclusive; prime-rl's 20-80%) are written as the run's only tasks.
4. A training run on them (the default run's settings, no held-out set) for --steps steps; its training success
   per step is reported, with the first step whose mean over the last --window steps reaches --goal.

Figures: candidates, in_band (and their mean pass rate before training), success per step, the last window's
mean, and reached_at (the step, or null within the budget).
"""

import json
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from nanorllm.bench.record import record_run
from nanorllm.config import TrainConfig


@dataclass
class SanityBenchConfig:
    quick: bool = False
    """tiny-random, few tasks and steps: checks that every part runs (its figures are not the reference)."""
    model: str = "smollm2-135m-instruct"
    """Model (ignored with --quick)."""
    candidates: int = 128
    """Training tasks whose pass rate is estimated."""
    samples: int = 8
    """Episodes per candidate (K) for its pass rate."""
    band: str = "0.2,0.8"
    """Pass rates kept, low,high (inclusive)."""
    steps: int = 40
    """Training steps on the kept tasks: the budget."""
    goal: float = 0.95
    """Training success the trainer must reach."""
    window: int = 5
    """Steps the success is averaged over before it is compared with --goal."""
    seed: int = 0
    """The run's seed: its task order, sampling and initialisation."""
    threads: int | None = None
    """Torch threads per process on CPU (None: the run's default)."""
    json: str | None = None
    """Also write the figures here."""


def pass_rates(results) -> dict[str, float]:
    """{task_id: share of its episodes that succeeded}."""
    seen: dict[str, list[bool]] = {}
    for r in results:
        seen.setdefault(r.task_id, []).append(bool(r.succeeded))
    return {t: sum(s) / len(s) for t, s in seen.items()}


def in_band(tasks: list[dict], rates: dict[str, float], low: float, high: float) -> list[dict]:
    """The tasks whose pass rate lies in [low, high], in their given order."""
    return [t for t in tasks if low <= rates.get(t["task_id"], -1.0) <= high]


def reached_at(success: list[float], goal: float, window: int) -> int | None:
    """The first step (1-based) whose mean success over the last `window` steps (fewer at the start: all so far,
    once `window` steps exist) reaches `goal`; None if none does."""
    for i in range(window, len(success) + 1):
        if sum(success[i - window:i]) / window >= goal:
            return i
    return None


def candidates(cfg: TrainConfig, n: int) -> list[dict]:
    """The first n of the run's training tasks (held-out ones removed) in a seeded order."""
    from nanorllm.run.assembly import assemble

    tasks = list(assemble(cfg).train_tasks)
    random.Random(cfg.seed).shuffle(tasks)
    return tasks[:n]


def sample_rates(cfg: TrainConfig, tasks: list[dict], samples: int) -> dict[str, float]:
    """Each task's pass rate under the base model: `samples` episodes through the training engine."""
    from nanorllm.policy.hf_causal import HFCausalPolicy
    from nanorllm.trainer.training_engine import training_engine

    policy = HFCausalPolicy.from_name(cfg.model, dtype=cfg.dtype, seed=cfg.seed, replica=True)
    results = training_engine(policy, cfg).run(tasks, num_samples=samples, seed=cfg.seed).results
    return pass_rates(results)


def train_on(cfg: TrainConfig, tasks: list[dict], steps: int) -> list[float]:
    """Training success per step of a run on `tasks` alone (no held-out set)."""
    from dataclasses import replace

    from nanorllm.bench.trial import checked
    from nanorllm.run.lifecycle import run_training

    success: list[float] = []
    with tempfile.TemporaryDirectory(prefix="nanorllm-sanity-") as out:
        path = Path(out) / "tasks.jsonl"
        path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
        run = replace(cfg, tasks=str(path), eval_tasks="", max_steps=steps, output_dir=out, run_name="sanity",
                      save_model=False)
        outcome = run_training(run, quiet=True, evaluate_first=False, finish=lambda r: {},
                               on_step=lambda r, n: success.append(r.history[-1]["success_rate"]) if n else None)
    checked(outcome.exit_code, "the sanity run")
    return success


def run_sanity_bench(b: SanityBenchConfig) -> int:
    t_start = time.perf_counter()
    torch.set_flush_denormal(True)
    cfg = TrainConfig(model="tiny-random" if b.quick else b.model, seed=b.seed, threads=b.threads)
    n, k, steps = (8, 2, 2) if b.quick else (b.candidates, b.samples, b.steps)
    low, high = (float(x) for x in b.band.split(","))
    pool = candidates(cfg, n)
    rates = sample_rates(cfg, pool, k)
    kept = in_band(pool, rates, 0.0, 1.0) if b.quick else in_band(pool, rates, low, high)
    print(f"[sanity] {len(kept)} of {len(pool)} tasks have a pass rate in [{low}, {high}] over {k} samples",
          flush=True)
    if not kept:
        print("[sanity] no task in the band: nothing to train on (widen --band or raise --candidates)")
        return 1
    success = train_on(cfg, kept, steps)
    window = min(b.window, len(success))
    figures = {"candidates": len(pool), "in_band": len(kept),
               "in_band_pass_rate": sum(rates[t["task_id"]] for t in kept) / len(kept),
               "success": success, "last_window_success": sum(success[-window:]) / window,
               "reached_at": reached_at(success, b.goal, window), "goal": b.goal, "steps": steps}
    print(f"[sanity] training success by step: {' '.join(f'{s:.2f}' for s in success)}")
    print(f"[sanity] last {window} steps {figures['last_window_success']:.3f} (goal {b.goal}): "
          f"{'reached at step ' + str(figures['reached_at']) if figures['reached_at'] else 'not reached'}")
    record_run(figures, t_start, b.json, model=cfg.model, samples=k, band=b.band, seed=b.seed)
    return 0
