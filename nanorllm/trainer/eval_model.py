"""Evaluate any model on a task set with the training's self-refine loop, greedily (`python launch/eval.py`):
a local one (built-in name, HF directory, hub id) or an API one (gemini:<model-name>). The same evaluation
flags as training (--eval-samples for pass@k, --eval-set for more sets, --task-fields, --reward) mean the
same here.

A run's own model (runs/<run>/final_model, its merged/, a checkpoint's model/) is evaluated with the run's
saved settings (its env, turns, reward functions, held-out tasks...: `with_run_settings`) unless flags say
otherwise: evaluated with the defaults, a single-turn reward-function run got the math env's two turns.
"""

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path

from nanorllm.config import eval_problems
from nanorllm.config.checks import agent_env_problems, bound_problems, judge_problems, tool_problems
from nanorllm.config.episode_env import episode_env
from nanorllm.config.fields import (DecodeBatch, EnvSource, EpisodeShape, EvalSettings, JudgeSettings, ModelSettings,
                                    Program, RewardFunctions, Seeding, ToolSettings)
from nanorllm.datasets.golds import TaskFieldsError, parse_task_fields
from nanorllm.datasets.tasks import check_task_rows
from nanorllm.config.specs import env_spec
from nanorllm.envs.registry import load_bundle, load_env_tasks
from nanorllm.policy.base import SamplingParams
from nanorllm.trainer.evaluate import evaluate, evaluate_sampled
from nanorllm.trainer.training_engine import eval_opponent_model
from nanorllm.utils.devices import configure_threads


@dataclass
class EvalConfig(Program, DecodeBatch, JudgeSettings, EvalSettings, EpisodeShape, RewardFunctions, ToolSettings,
                 EnvSource, Seeding, ModelSettings):
    """launch/eval.py's flags: training's groups for the model, the env or agent, its tools and reward functions,
    the episode's shape, the decode batch, the evaluation (--eval-set, --eval-samples, --eval-limit...) and the
    judge, each field declared once (config/fields.py), plus what only an evaluation chooses."""

    tasks: str | None = None
    """Tasks in the env's format (math: a JSONL file, seed schema or GSM8K format, or an arith:... spec).
    None: the env's own default held-out tasks."""
    device: str = "cpu"
    """Device of a local model."""
    api_concurrency: int = 8
    """Requests in flight at once for an API model."""


# the run's saved field each evaluation field takes when no flag gives it (the rest keep the same name)
FROM_RUN = {"tasks": "eval_tasks"}
NOT_FROM_RUN = ("model", "device", "dtype", "threads", "seed", "api_concurrency")  # the evaluation's own choices


def run_config_of(model: str) -> Path | None:
    """The config.json of the run `model` was saved by (final_model/, final_model/merged/,
    checkpoints/step_N/model/), or None for a model no run of ours wrote."""
    path = Path(model)
    for run in (path.parent, path.parent.parent, path.parent.parent.parent)[: 3 if path.is_dir() else 0]:
        config = run / "config.json"
        try:
            saved = json.loads(config.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(saved, dict) and {"max_steps", "env", "tasks_per_step"} <= saved.keys():
            return config
    return None


def given_fields(argv: list[str]) -> set[str]:
    """The EvalConfig fields a command line sets (--max-turns 1, --max-turns=1, --no-worked-example)."""
    names = {f.name for f in fields(EvalConfig)}
    out = set()
    for arg in argv:
        if arg.startswith("--"):
            name = arg[2:].split("=", 1)[0].replace("-", "_")
            out.add(name[3:] if name.startswith("no_") and name[3:] in names else name)
    return out & names


def with_run_settings(cfg: EvalConfig, given: set[str]) -> tuple[EvalConfig, str | None]:
    """`cfg` with every field no flag gave (`given`) taken from the saved config of the run that wrote
    `cfg.model`, and the line that says which; (cfg, None) for a model no run of ours wrote. As in training,
    --reward without --env is single-turn (--env single)."""
    config = run_config_of(cfg.model)
    if config is None:
        return replace(cfg, env=episode_env(cfg, env_given="env" in given)), None
    saved = json.loads(config.read_text())
    taken = {}
    for f in fields(EvalConfig):
        key = FROM_RUN.get(f.name, f.name)
        if f.name in given or f.name in NOT_FROM_RUN or key not in saved:
            continue
        value = saved[key]
        if f.name == "tasks" and not value:
            continue  # a run with no held-out set: the env's own
        taken[f.name] = tuple(value) if isinstance(value, list) else value
    changed = {k: v for k, v in taken.items() if v != getattr(cfg, k)}
    line = (f"[eval] {config}: the run's settings where no flag gives them"
            + (f" ({', '.join(f'{k}={v!r}' for k, v in changed.items())})" if changed else " (the defaults)"))
    return replace(cfg, **taken), line


def load_policy(cfg: EvalConfig):
    from nanorllm.policy.gemini import is_gemini_spec, policy_from_spec

    if is_gemini_spec(cfg.model):
        return policy_from_spec(cfg.model, concurrency=cfg.api_concurrency)
    from nanorllm.policy.hf_causal import HFCausalPolicy

    configure_threads(cfg.device, cfg.threads, 1)
    policy = HFCausalPolicy.from_name(cfg.model, device=cfg.device, dtype=cfg.dtype)
    policy.graphs_enabled = cfg.cuda_graphs
    return policy


def evaluate_model(cfg: EvalConfig) -> dict:
    """evaluate()'s summary with the set's "spec" ({"spec", "success_rate", ..., "n", "failed", ...}: rates over the
    scored episodes, the failed ones counted), with pass@k / mean@n under --eval-samples and each --eval-set's summary
    under "sets". Bad input (a task file, an env or agent spec, a flag) raises TaskFileError, EnvSpecError or
    ValueError, all before the model loads."""
    problems = eval_problems(cfg)
    try:
        parse_task_fields(cfg.task_fields)
    except TaskFieldsError as e:
        problems.append(f"task_fields: {e}")
    problems += agent_env_problems(cfg) + judge_problems(cfg) + tool_problems(cfg)
    problems += bound_problems(cfg, dict.fromkeys(["agent_timeout_s", "reward_timeout_s", "env_timeout_s"], "> 0"))
    if cfg.env == "single" and not (cfg.reward or cfg.judge):
        problems.append("env: 'single' episodes are scored by --reward functions or a --judge alone and none is "
                        "given, so no episode would be scored (a run trained on a --reward-model alone: eval does "
                        "not load reward models; grade it with an env, e.g. --env math)")
    if problems:
        raise ValueError("; ".join(problems))
    env = load_bundle(env_spec(cfg))
    spec = cfg.tasks if cfg.tasks is not None else env.default_eval_tasks
    if not spec:
        raise ValueError(f"tasks: the {'agent' if cfg.agent else 'env'} {cfg.agent or cfg.env!r} has no default "
                         "held-out tasks (EnvBundle.default_eval_tasks); give --tasks")
    tasks = check_task_rows(load_env_tasks(env, spec, cfg.eval_limit), spec)
    sets = {name: (check_task_rows(load_env_tasks(env, s, cfg.eval_limit), s), s)
            for name, _, s in (item.partition("=") for item in cfg.eval_set)}
    policy = load_policy(cfg)
    opponent = eval_opponent_model(policy, cfg, env)  # a game's model --eval-opponent (base: --model), frozen
    sampling = SamplingParams(max_new_tokens=cfg.max_new_tokens)

    def one(rows: list[dict], spec: str) -> dict:
        res = {"spec": spec, **evaluate(policy, rows, sampling=sampling, env=env, opponent_policy=opponent,
                                        max_batch_episodes=cfg.max_batch_episodes)}
        if cfg.eval_samples:
            res.update(evaluate_sampled(policy, rows, sampling=replace(sampling, temperature=cfg.eval_temperature),
                                        env=env, samples=cfg.eval_samples, ks=cfg.eval_k, seed=cfg.seed,
                                        max_batch_episodes=cfg.max_batch_episodes, opponent_policy=opponent))
        return res

    out = one(tasks, spec)
    if sets:
        out["sets"] = {name: one(rows, s) for name, (rows, s) in sets.items()}
    return out
