"""Held-out evaluation: the same self-refine loop, greedy, one episode per task."""

from dataclasses import replace

from nanorllm.policy.base import Policy, SamplingParams
from nanorllm.rollout.engine import RolloutEngine


def evaluate(policy: Policy, tasks: list[dict], *, sampling: SamplingParams, max_turns: int,
             agent_kwargs: dict | None = None, max_batch_episodes: int = 64) -> dict:
    """{"success_rate", "first_turn_success", "mean_turns", "n"} over `tasks`."""
    engine = RolloutEngine(policy, sampling=replace(sampling, greedy=True), max_turns=max_turns,
                           max_batch_episodes=max_batch_episodes, agent_kwargs=agent_kwargs)
    results = engine.run(tasks, num_samples=1)
    n = len(results)
    return {
        "success_rate": sum(r.reward > 0 for r in results) / n,
        "first_turn_success": sum(r.trajectory.steps[0].reward > 0 for r in results) / n,
        "mean_turns": sum(r.trajectory.num_turns for r in results) / n,
        "n": n,
    }
