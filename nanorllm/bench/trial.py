"""A short, timed training run in this process, for benchmarks and worker-count tuning.

Same lifecycle as launch/train.py (run/lifecycle.py) minus held-out evaluation and checkpoints,
so what is timed is exactly what a user's run does per step.
"""

import tempfile
from dataclasses import replace

from nanorllm.config import TrainConfig
from nanorllm.run.lifecycle import run_training


def checked(code: int, what: str) -> None:
    """A benchmark's run that did not finish stops the benchmark: Ctrl-C as such, anything else as an error."""
    if code in (130, 143):
        raise KeyboardInterrupt
    if code != 0:
        raise RuntimeError(f"{what} ended with exit code {code}; its output is above")


def run_trial(cfg: TrainConfig, *, warmup_steps: int = 1) -> dict:
    """Train cfg.max_steps steps; returns wall time and per-step metrics averaged after warm-up."""
    with tempfile.TemporaryDirectory(prefix="nanorllm-trial-") as out:
        cfg = replace(cfg, eval_tasks="", output_dir=out, run_name="trial", save_model=False, sample_every=0)
        outcome = run_training(cfg, quiet=True, checkpoints=False)
    checked(outcome.exit_code, "the trial")
    history, wall = outcome.history, outcome.startup_s + outcome.train_s
    hist = history[warmup_steps:] or history
    mean = lambda k: sum(h.get(k, 0.0) for h in hist) / max(len(hist), 1)  # noqa: E731
    steps_s = sum(h["perf/step_s"] for h in hist)
    return {
        "wall_s": wall, "startup_s": outcome.startup_s, "steps": len(history), "timed_steps": len(hist),
        "timed_s": steps_s, "episodes_per_s": sum(h["train/episodes"] for h in hist) / max(steps_s, 1e-9),
        "rollout_s": mean("perf/rollout_s"), "train_s": mean("perf/train_s"), "step_s": mean("perf/step_s"),
        "train_tokens_per_s": mean("perf/train_tokens_per_s"), "gen_tokens_per_s": mean("perf/gen_tokens_per_s"),
        "learner_wait_frac": mean("pipeline/learner_wait_frac"), "worker_wait_frac": mean("pipeline/worker_wait_frac"),
        "worker_idle_frac": mean("pipeline/worker_idle_frac"),
        "policy_lag_mean": mean("pipeline/policy_lag_mean"),
        "policy_lag_max": max((h.get("pipeline/policy_lag_max", 0) for h in history), default=0),
        "stale_dropped": history[-1].get("pipeline/stale_dropped", 0) if history else 0,
        "weight_publish_s": mean("pipeline/weight_publish_s"), "weight_load_s": mean("pipeline/weight_load_s"),
        "reward_mean": mean("reward/mean"),
    }
