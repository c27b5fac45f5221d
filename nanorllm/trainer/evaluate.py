"""Held-out evaluation: the same episodes as training, greedy, one episode per task.

It runs in the learner's own process, so it has its own hang detector (trainer/watchdog.py): a
decode step or an answer check that stands still past `hang_timeout_s` is reported with what it
was doing and which task, and stops the run instead of hanging it.
"""

from dataclasses import replace

from nanorllm.envs.base import EnvBundle, EpisodeSettings
from nanorllm.envs.registry import DEFAULT_ENV, load_env
from nanorllm.policy.base import Policy, SamplingParams
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.trainer.metrics import grader_timeouts
from nanorllm.trainer.watchdog import Watchdog


def evaluate(policy: Policy, tasks: list[dict], *, sampling: SamplingParams, env: EnvBundle | None = None,
             max_turns: int = 2, max_batch_episodes: int = 64, grader_timeout_s: float = 5.0,
             hang_timeout_s: float = 600.0) -> dict:
    """{"success_rate", "first_turn_success", "mean_turns", "n", "grader_timeouts", "first_timeout_task"} plus
    the env's own metrics (`env.metrics`). max_turns / grader_timeout_s apply to the default env only (a
    bundle carries its own)."""
    env = env or load_env(DEFAULT_ENV, EpisodeSettings(max_turns=max_turns, grader_timeout_s=grader_timeout_s))
    engine = RolloutEngine(policy, sampling=replace(sampling, greedy=True), env=env,
                           max_batch_episodes=max_batch_episodes)
    with Watchdog("held-out evaluation", hang_timeout_s, env_name=env.spec) as dog:
        dog.follow(engine, tasks)
        try:
            results = engine.run(tasks, num_samples=1).results
        finally:
            engine.close()
    n = len(results)
    timeouts, first_timeout = grader_timeouts(results)
    return {
        "success_rate": sum(r.reward > 0 for r in results) / n,
        "first_turn_success": sum(bool(r.trajectory.steps) and r.trajectory.steps[0].reward > 0 for r in results) / n,
        "mean_turns": sum(r.trajectory.num_turns for r in results) / n,
        "n": n,
        "grader_timeouts": timeouts,
        "first_timeout_task": first_timeout,
        **env.metrics(results),
    }
