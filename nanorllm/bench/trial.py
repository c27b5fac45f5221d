"""A short, timed training run in this process, for benchmarks and worker-count tuning.

Same code path as launch/train.py (TrainingRun + a rollout source) minus held-out evaluation and
checkpoints, so what is timed is exactly what a user's run does per step.
"""

import tempfile
import time
from dataclasses import replace

from nanorllm.config import TrainConfig
from nanorllm.trainer.loop import SerialSource, TrainingRun


def run_trial(cfg: TrainConfig, *, warmup_steps: int = 1) -> dict:
    """Train cfg.max_steps steps; returns wall time and per-step metrics averaged after warm-up."""
    with tempfile.TemporaryDirectory(prefix="nanorllm-trial-") as out:
        cfg = replace(cfg, eval_tasks="", output_dir=out, run_name="trial", save_model=False, sample_every=0)
        run = TrainingRun(cfg, quiet=True)
        run.setup()
        run.use_cores(alone=False)
        source = None
        try:
            t0 = time.perf_counter()
            if cfg.serial:
                source = SerialSource(run)
            else:
                from nanorllm.pipeline.learner import PipelineSource
                source = PipelineSource(run)
            t_ready = time.perf_counter()
            run.train(source)
            wall = time.perf_counter() - t0
        finally:
            if source is not None:
                source.close()
            run.cleanup()
    hist = run.history[warmup_steps:] or run.history
    mean = lambda k: sum(h.get(k, 0.0) for h in hist) / max(len(hist), 1)  # noqa: E731
    steps_s = sum(h["perf/step_s"] for h in hist)
    return {
        "wall_s": wall, "startup_s": t_ready - t0, "steps": len(run.history), "timed_steps": len(hist),
        "timed_s": steps_s, "episodes_per_s": sum(h["train/episodes"] for h in hist) / max(steps_s, 1e-9),
        "rollout_s": mean("perf/rollout_s"), "train_s": mean("perf/train_s"), "step_s": mean("perf/step_s"),
        "train_tokens_per_s": mean("perf/train_tokens_per_s"), "gen_tokens_per_s": mean("perf/gen_tokens_per_s"),
        "learner_wait_frac": mean("pipeline/learner_wait_frac"), "worker_wait_frac": mean("pipeline/worker_wait_frac"),
        "worker_idle_frac": mean("pipeline/worker_idle_frac"),
        "policy_lag_mean": mean("pipeline/policy_lag_mean"),
        "policy_lag_max": max((h.get("pipeline/policy_lag_max", 0) for h in run.history), default=0),
        "stale_dropped": run.history[-1].get("pipeline/stale_dropped", 0) if run.history else 0,
        "weight_publish_s": mean("pipeline/weight_publish_s"), "weight_load_s": mean("pipeline/weight_load_s"),
        "reward_mean": mean("reward/mean"),
    }
