"""Held-out evaluation: the same episodes as training, greedy, one episode per task.

It runs in the learner's own process, so it has its own hang detector (trainer/watchdog.py): a
decode step or an answer check that stands still past `hang_timeout_s` is reported with what it
was doing and which task, and stops the run instead of hanging it.

With `--eval-samples n` a second pass samples n episodes a task at `--eval-temperature` and reports the
unbiased pass@k for each k <= n and mean@n (the mean success of all n samples) beside greedy success.
"""

import math
from dataclasses import replace

from nanorllm.envs.base import EnvBundle
from nanorllm.policy.base import Policy, SamplingParams
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.trainer.metrics import grader_timeouts
from nanorllm.trainer.watchdog import Watchdog


def evaluate(policy: Policy, tasks: list[dict], *, sampling: SamplingParams, env: EnvBundle,
             max_batch_episodes: int = 64, hang_timeout_s: float = 600.0) -> dict:
    """{"success_rate", "first_turn_success", "mean_reward", "mean_turns", "n", "grader_timeouts",
    "first_timeout_task"} plus the env's own metrics (`env.metrics`), on the program's own `env` (its turns and
    grader limit with it)."""
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
        "mean_reward": sum(r.reward for r in results) / n,  # where partial scores count, success alone says little
        "mean_turns": sum(r.trajectory.num_turns for r in results) / n,
        "n": n,
        "grader_timeouts": timeouts,
        "first_timeout_task": first_timeout,
        **env.metrics(results),
    }


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k from n samples of which c passed: 1 - C(n-c, k) / C(n, k) (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def default_ks(samples: int) -> tuple[int, ...]:
    """pass@1, the powers of two below n, and pass@n."""
    return tuple(sorted({1, samples} | {2 ** i for i in range(1, samples.bit_length()) if 2 ** i < samples}))


def evaluate_sampled(policy: Policy, tasks: list[dict], *, sampling: SamplingParams, env: EnvBundle, samples: int,
                     ks: tuple[int, ...] = (), seed: int = 0, max_batch_episodes: int = 64,
                     hang_timeout_s: float = 600.0) -> dict:
    """{"pass@k" for each k, "mean@n"}: `samples` episodes a task at `sampling`'s temperature. The policy's
    sampling generator is seeded with `seed` for this call and put back after it, so an eval at any step draws
    the same numbers and the training rollouts after it are those a run without it would make."""
    ks = ks or default_ks(samples)
    generator = getattr(policy, "generator", None)
    saved = generator.get_state() if generator is not None else None
    engine = RolloutEngine(policy, sampling=replace(sampling, greedy=False), env=env,
                           max_batch_episodes=max_batch_episodes)
    try:
        with Watchdog("held-out evaluation (sampled)", hang_timeout_s, env_name=env.spec) as dog:
            dog.follow(engine, tasks)
            results = engine.run(tasks, num_samples=samples, seed=seed).results  # task order, then sample order
    finally:
        engine.close()  # an --agent's endpoint
        if saved is not None:
            generator.set_state(saved)
    passed = [sum(r.reward > 0 for r in results[i * samples:(i + 1) * samples]) for i in range(len(tasks))]
    out = {f"pass@{k}": sum(pass_at_k(samples, c, k) for c in passed) / len(tasks) for k in ks}
    out[f"mean@{samples}"] = sum(passed) / (samples * len(tasks))
    return out
