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
from typing import Annotated, Literal

import tyro

from nanorllm.config import EvalSettings, eval_problems
from nanorllm.config.checks import judge_problems
from nanorllm.config.fields import JudgeSettings
from nanorllm.config.checks import agent_env_problems, bound_problems
from nanorllm.datasets.golds import TaskFieldsError, parse_task_fields
from nanorllm.datasets.tasks import check_task_rows
from nanorllm.config.specs import env_spec
from nanorllm.envs.registry import load_bundle, load_env_tasks
from nanorllm.policy.base import SamplingParams
from nanorllm.trainer.evaluate import evaluate, evaluate_sampled
from nanorllm.utils.devices import configure_threads


@dataclass
class EvalConfig(JudgeSettings, EvalSettings):
    """launch/eval.py's flags: the evaluation fields of training (EvalSettings: --eval-set, --eval-samples,
    --eval-temperature, --eval-k), its judge (JudgeSettings: --judge ...) and what the model, the env and the
    tasks are."""

    tasks: str | None = None
    """Tasks in the env's format (math: a JSONL file, seed schema or GSM8K format, or an arith:... spec).
    None: the env's own default held-out tasks."""
    env: str = "math"
    """The environment bundle: math, calc, module.path:Name or path/to/file.py:Name."""
    env_arg: tuple[str, ...] = ()
    """The env's own options, key=value."""
    agent: str | None = None
    """An agent function against the OpenAI client instead of an env (path/to/file.py:fn); give --tasks."""
    agent_timeout_s: float = 300.0
    """An --agent episode still running this long is ended as an error."""
    env_timeout_s: float = 30.0
    """Wall-clock limit (seconds) of one call to an env server (--env openenv:...); past it the episode is an error."""
    reward: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """Reward functions that score the episodes, as in training (path/to/file.py:fn, one flag each; without
    --env single-turn: --env single)."""
    reward_weights: tuple[float, ...] = ()
    """One weight per --reward (empty: 1 each)."""
    reward_mode: Literal["add", "replace"] = "add"
    """With an env: 'add' the functions' weighted sum to the env's reward, or 'replace' it."""
    system_prompt: str | None = None
    """System prompt; None uses the env's own."""
    model: str = "smollm2-135m-instruct"
    """Built-in name, HF model directory, hub id, or gemini:<model-name> (needs GEMINI_API_KEY)."""
    task_fields: str | None = None
    """The sources' own column names, key=column: question=problem,answer=solution,task_id=id."""
    limit: int | None = None
    """Evaluate only the first N tasks (of each set)."""
    seed: int = 0
    """Seed of the sampled episodes."""
    max_turns: int = 2
    """Self-refine turns per episode."""
    max_new_tokens: int = 32
    """Longest response per turn."""
    worked_example: bool = True
    """Put one worked question/answer pair before the question."""
    device: str = "cpu"
    """Device of a local model."""
    dtype: str = "float32"
    """'float32' or 'bfloat16' for a local model."""
    api_concurrency: int = 8
    """Requests in flight at once for an API model."""
    max_batch_episodes: int = 256
    """Most rows in a local model's running decode batch (wider is faster on CPU; KV memory grows with it)."""


# the run's saved field each evaluation field takes when no flag gives it (the rest keep the same name)
FROM_RUN = {"tasks": "eval_tasks", "limit": "eval_limit"}
NOT_FROM_RUN = ("model", "device", "dtype", "seed", "api_concurrency")  # the evaluation's own choices


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
        single = (cfg.reward or cfg.judge) and "env" not in given and not cfg.agent
        return (replace(cfg, env="single") if single else cfg), None
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

    configure_threads(cfg.device, None, 1)
    return HFCausalPolicy.from_name(cfg.model, device=cfg.device, dtype=cfg.dtype)


def evaluate_model(cfg: EvalConfig) -> dict:
    """evaluate()'s summary ({"success_rate", ..., "n", "failed", ...}: rates over the scored episodes, the failed
    ones counted), with pass@k / mean@n under --eval-samples and each --eval-set's summary under "sets". Bad input
    (a task file, an env or agent spec, a flag) raises TaskFileError, EnvSpecError or ValueError, all before the
    model loads."""
    problems = eval_problems(cfg)
    try:
        parse_task_fields(cfg.task_fields)
    except TaskFieldsError as e:
        problems.append(f"task_fields: {e}")
    problems += agent_env_problems(cfg) + judge_problems(cfg)
    problems += bound_problems(cfg, {"env_timeout_s": "> 0"})
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
    tasks = check_task_rows(load_env_tasks(env, spec, cfg.limit), spec)
    sets = {name: check_task_rows(load_env_tasks(env, s, cfg.limit), s)
            for name, _, s in (item.partition("=") for item in cfg.eval_set)}
    policy = load_policy(cfg)
    sampling = SamplingParams(max_new_tokens=cfg.max_new_tokens)

    def one(rows: list[dict]) -> dict:
        res = evaluate(policy, rows, sampling=sampling, env=env, max_batch_episodes=cfg.max_batch_episodes)
        if cfg.eval_samples:
            res.update(evaluate_sampled(policy, rows, sampling=replace(sampling, temperature=cfg.eval_temperature),
                                        env=env, samples=cfg.eval_samples, ks=cfg.eval_k, seed=cfg.seed,
                                        max_batch_episodes=cfg.max_batch_episodes))
        return res

    out = one(tasks)
    if sets:
        out["sets"] = {name: one(rows) for name, rows in sets.items()}
    return out
