"""Held-out evaluation: the same episodes as training, greedy, one episode per task.

It runs in the learner's own process, so it has its own hang detector (trainer/watchdog.py): a
decode step or an answer check that stands still past `hang_timeout_s` is reported with what it
was doing and which task, and stops the run instead of hanging it.

With `--eval-samples n` a second pass samples n episodes a task at `--eval-temperature` and reports the
unbiased pass@k for each k <= n and mean@n (the mean success of all n samples) beside greedy success. Success is
training's (`RolloutResult.succeeded`: the env's own `success` where a step's info gives it, else reward > 0).

Evaluation keeps training's failed-score rule: an episode the env raised in or whose score failed (a reward function,
judge or reward model that raised, timed out or gave nan: `RolloutResult.failed`) says nothing about the policy, so
every rate is over the scored episodes alone and the failed ones are counted beside it (`failed`), never averaged
in as zeros. pass@k and mean@n count a task's scored samples only (and a game's unplayed seats, as greedy success
does); a task with fewer than k of them is left out of pass@k (`sampled_failed` counts the failed samples). A count
of the failed episodes themselves (the env's `reward/failed/<source>`) is over every episode: over the scored ones
alone it would always read 0.

A rate over no episode is nan, which JSON has no word for: eval.json and launch/eval.py's lines hold it as null with
`why_null` beside it naming the reason (`json_ready`).
"""

import math
from dataclasses import replace

from nanorllm.core.types import RolloutResult
from nanorllm.envs.base import EnvBundle
from nanorllm.policy.base import Policy, SamplingParams
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.trainer.metrics import grader_timeouts, selfplay_metrics
from nanorllm.trainer.watchdog import Watchdog


def evaluate(policy: Policy, tasks: list[dict], *, sampling: SamplingParams, env: EnvBundle,
             max_batch_episodes: int = 64, hang_timeout_s: float = 600.0, opponent_policy: Policy | None = None) -> dict:
    """{"success_rate", "first_turn_success", "mean_reward", "mean_turns", "n", "failed", "grader_timeouts",
    "first_timeout_task"} plus the env's own metrics (`env.metrics`) and a game's selfplay/* (its policy seats
    against `--eval-opponent`, `opponent_policy` when that is a model: a fixed opponent by default), on the program's
    own `env` (its turns and grader limit with it): the rates over the `n` scored episodes, `failed` the episodes left
    out (module docstring; every rate is nan when none was scored). A game's policy seat that the game ended before it
    moved (the opponent lost on its invalid moves first) has no episode but was a game played: "unplayed" counts
    them, and success_rate, mean_reward and the selfplay/ win and draw rates count their outcomes."""
    engine = RolloutEngine(policy, sampling=replace(sampling, greedy=True), env=env,
                           max_batch_episodes=max_batch_episodes, opponent=env.settings.eval_opponent,
                           opponent_policy=opponent_policy)
    with Watchdog("held-out evaluation", hang_timeout_s, env_name=env.spec) as dog:
        dog.follow(engine, tasks)
        try:
            batch = engine.run(tasks, num_samples=1)
        finally:
            engine.close()
    results, unplayed = batch.results, batch.unplayed
    scored = [r for r in results if not r.failed]
    timeouts, first_timeout = grader_timeouts(results)
    return {
        "success_rate": mean([*(r.succeeded for r in scored), *(u.reward > 0 for u in unplayed)]),
        "first_turn_success": mean(r.first_turn_succeeded for r in scored),
        "mean_reward": mean([*(r.reward for r in scored), *(u.reward for u in unplayed)]),  # partial scores
        "mean_turns": mean(r.trajectory.num_turns for r in scored),
        "n": len(scored),
        "failed": len(results) - len(scored),
        **({"unplayed": len(unplayed)} if unplayed else {}),
        "grader_timeouts": timeouts,
        "first_timeout_task": first_timeout,
        **env_metrics(env, results, scored),
        **selfplay_metrics(results, unplayed),  # a game's: against --eval-opponent
    }


FAILED_COUNTS = "reward/failed/"  # the env's metrics that count failed episodes (rewards/functions.py)


def env_metrics(env: EnvBundle, results: list[RolloutResult], scored: list[RolloutResult]) -> dict:
    """The env's own metrics over the scored episodes, its counts of failed scores over every episode."""
    failed = {k: v for k, v in env.metrics(results).items() if k.startswith(FAILED_COUNTS)}
    return {**env.metrics(scored), **failed}


def mean(values) -> float:
    """The mean of `values`; nan when there are none (no scored episode: no rate to report)."""
    values = [float(v) for v in values]
    return sum(values) / len(values) if values else math.nan


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k from n samples of which c passed: 1 - C(n-c, k) / C(n, k) (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def default_ks(samples: int) -> tuple[int, ...]:
    """pass@1, the powers of two below n, and pass@n."""
    return tuple(sorted({1, samples} | {2 ** i for i in range(1, samples.bit_length()) if 2 ** i < samples}))


def per_task(results: list[RolloutResult], tasks: list[dict], samples: int) -> list[list[RolloutResult]]:
    """A task's episodes: its `samples` in a row, or, in a game (rollout/games.py), one per policy seat of each of
    its games, found by task id."""
    if not any(r.seat is not None for r in results):
        return [results[i * samples:(i + 1) * samples] for i in range(len(tasks))]
    by_task: dict[str, list[RolloutResult]] = {t["task_id"]: [] for t in tasks}
    for r in results:
        by_task[r.task_id].append(r)
    return list(by_task.values())


def evaluate_sampled(policy: Policy, tasks: list[dict], *, sampling: SamplingParams, env: EnvBundle, samples: int,
                     ks: tuple[int, ...] = (), seed: int = 0, max_batch_episodes: int = 64,
                     hang_timeout_s: float = 600.0, opponent_policy: Policy | None = None) -> dict:
    """{"pass@k" for each k, "mean@n", "sampled_failed"}: `samples` episodes a task at `sampling`'s temperature,
    counted over each task's scored samples (module docstring), and in a game `sampled/selfplay/*` (selfplay_metrics
    of these episodes). A game's policy seat that the game ended before it moved counts as one of its task's samples
    with its outcome, as `evaluate` counts it (a win: a pass), so greedy and sampled play stand on one footing. The
    policy's sampling generator is seeded with `seed` for this call and put back after it, so an eval at any step
    draws the same numbers and the training rollouts after it are those a run without it would make."""
    ks = ks or default_ks(samples)
    generator = getattr(policy, "generator", None)
    saved = generator.get_state() if generator is not None else None
    engine = RolloutEngine(policy, sampling=replace(sampling, greedy=False), env=env,
                           max_batch_episodes=max_batch_episodes, opponent=env.settings.eval_opponent,
                           opponent_policy=opponent_policy)
    try:
        with Watchdog("held-out evaluation (sampled)", hang_timeout_s, env_name=env.spec) as dog:
            dog.follow(engine, tasks)
            batch = engine.run(tasks, num_samples=samples, seed=seed)  # task order, then sample order
    finally:
        engine.close()  # an --agent's endpoint
        if saved is not None:
            generator.set_state(saved)
    results = batch.results
    groups = [[r.succeeded for r in rs if not r.failed] for rs in per_task(results, tasks, samples)]
    index = {t["task_id"]: i for i, t in enumerate(tasks)}
    for u in batch.unplayed:
        groups[index[u.task_id]].append(u.reward > 0)
    counts = [(len(g), sum(g)) for g in groups]  # (scored samples, passed) a task
    out = {f"pass@{k}": mean(pass_at_k(n, c, k) for n, c in counts if n >= k) for k in ks}
    scored = sum(n for n, _ in counts)
    out[f"mean@{samples}"] = sum(c for _, c in counts) / scored if scored else math.nan
    out["sampled_failed"] = sum(r.failed for r in results)
    # a game's sampled play, beside the greedy play's selfplay/*: its invalid moves above all, which greedy play alone
    # does not show for the temperature training samples at
    out.update({f"sampled/{k}": v for k, v in selfplay_metrics(results, batch.unplayed).items()})
    return out


def json_ready(res: dict) -> dict:
    """`res` as JSON holds it: each rate over no episode (nan) null, "why_null" naming the reason of each; its
    --eval-sets' under "sets" likewise."""
    out = {k: {name: json_ready(r) for name, r in v.items()} if k == "sets" else v for k, v in res.items()}
    why = {k: why_null(k, res) for k, v in out.items() if isinstance(v, float) and not math.isfinite(v)}
    if not why:
        return out
    return {**out, **{k: None for k in why}, "why_null": why}


def why_null(key: str, res: dict) -> str:
    """Why `res[key]` has no value."""
    if key.startswith("pass@"):
        return f"no task had {key[5:]} scored samples ({res.get('sampled_failed', 0)} sampled episodes not scored)"
    if key.startswith("mean@"):
        return f"no sampled episode was scored ({res.get('sampled_failed', 0)} not scored)"
    if res.get("n") == 0:
        return f"no episode was scored ({res.get('failed', 0)} not scored: the env raised or a reward source failed)"
    return f"{key} is not a finite number"


def success_gain(summary: dict) -> dict:
    """{"gain": after's success_rate - before's} of eval.json's `summary`: null with "why_null" where either has none;
    {} until both are there."""
    before, after = summary.get("before", {}), summary.get("after", {})
    if "success_rate" not in before or "success_rate" not in after:
        return {}
    missing = [when for when, res in (("before", before), ("after", after)) if res["success_rate"] is None]
    if missing:
        return {"gain": None, "why_null": {"gain": f"no success_rate {' or '.join(missing)}: no episode was scored"}}
    return {"gain": after["success_rate"] - before["success_rate"]}
