"""What a run's setup refuses, before its first rollout: tasks whose prompts leave the model no room to answer
(or, with --drop-long-prompts, those tasks left out), and a resume that would change the model or the task order."""

from dataclasses import asdict
from pathlib import Path
from typing import Callable

from nanorllm.config import ConfigError, TrainConfig
from nanorllm.config.specs import sampling_params
from nanorllm.datasets.tasks import TaskFileError
from nanorllm.envs.base import EnvBundle
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.rollout.prompt_budget import describe_long, long_prompts, no_room, prompt_limit
from nanorllm.trainer import fingerprint


def check_prompt_lengths(cfg: TrainConfig, policy: HFCausalPolicy, env: EnvBundle, tasks: dict[str, list[dict]],
                         say: Callable[[str], None]) -> dict[str, list[dict]]:
    """`tasks` ({"training": ..., "held-out": ...}) as the run may train and evaluate them: refused (TaskFileError,
    exit 2) when a task's first prompt is longer than the limit, naming each, or with --drop-long-prompts returned
    without them, counted."""
    sampling = sampling_params(cfg)
    seats = getattr(env, "seats", 1)  # a game's seat is shown the other seats' replies too
    limit = prompt_limit(policy, max_prompt_tokens=cfg.max_prompt_tokens, sampling=sampling, max_turns=cfg.max_turns,
                         seats=seats)
    if limit is None:
        return tasks
    found = {what: long_prompts(ts, policy=policy, env=env, limit=limit) if limit > 0 else ts
             for what, ts in tasks.items()}
    if cfg.max_prompt_tokens is None and len(found["training"]) == len(tasks["training"]):
        # the turns' room leaves no task a place: --drop-long-prompts would drop them all
        raise ConfigError([no_room(policy, sampling=sampling, max_turns=cfg.max_turns, limit=limit, seats=seats)],
                          "--max-turns / --max-new-tokens")
    if not any(found.values()):
        return tasks
    if not cfg.drop_long_prompts:
        problems = [line for what, f in found.items() for line in describe_long(f, limit, what)]
        source = " and ".join(s for s, what in ((cfg.tasks, "training"), (cfg.eval_tasks, "held-out")) if found[what])
        raise TaskFileError(source, problems + ["pass --drop-long-prompts to leave them out"])
    kept = {what: drop_long(what, ts, found[what], limit, say) for what, ts in tasks.items()}
    if not kept["training"]:
        raise TaskFileError("--tasks", [f"every training task's prompt is longer than {limit} tokens"])
    return kept


def drop_long(what: str, tasks: list[dict], long: list[tuple[dict, int, object]], limit: int,
              say: Callable[[str], None]) -> list[dict]:
    """`tasks` without the `long` ones (long_prompts' (task, tokens, ...) of them), their count said."""
    if not long:
        return tasks
    long_ids = {id(t) for t, _, _ in long}
    t, n, _ = long[0]
    say(f"[tasks] left out {len(long)} {what} task(s) whose prompt is longer than {limit} "
        f"tokens (--drop-long-prompts; first: {t['task_id']}, {n} tokens)")
    return [t for t in tasks if id(t) not in long_ids]


def check_resumable(cfg: TrainConfig, state: dict, task_order: dict | None, run_dir: Path) -> None:
    """Refuse (ConfigError, exit 2) a resume that would change the model or, unless accepted, the task order."""
    problems = fingerprint.fixed_changes(state["config"], asdict(cfg))
    changed = fingerprint.order_changes(state.get("task_order"), task_order)
    if changed and not cfg.resume_new_data:
        problems += [f"task order differs from the checkpoint's: {c}" for c in changed]
        problems.append("pass --resume-new-data to train on the new order, from a new epoch")
    if problems:
        raise ConfigError(problems, f"--resume {run_dir}")
