"""Evaluate any model on a task set with the training's self-refine loop, greedily (`python launch/eval.py`):
a local one (built-in name, HF directory, hub id) or an API one (gemini:<model-name>)."""

from dataclasses import dataclass

from nanorllm.datasets.tasks import check_task_rows
from nanorllm.envs.base import EpisodeSettings
from nanorllm.envs.registry import load_agent, load_env
from nanorllm.policy.base import SamplingParams
from nanorllm.trainer.evaluate import evaluate
from nanorllm.utils.devices import configure_threads


@dataclass
class EvalConfig:
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
    model: str = "smollm2-135m-instruct"
    """Built-in name, HF model directory, hub id, or gemini:<model-name> (needs GEMINI_API_KEY)."""
    limit: int | None = None
    """Evaluate only the first N tasks."""
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


def load_policy(cfg: EvalConfig):
    from nanorllm.policy.gemini import is_gemini_spec, policy_from_spec

    if is_gemini_spec(cfg.model):
        return policy_from_spec(cfg.model, concurrency=cfg.api_concurrency)
    from nanorllm.policy.hf_causal import HFCausalPolicy

    configure_threads(cfg.device, None, 1)
    return HFCausalPolicy.from_name(cfg.model, device=cfg.device, dtype=cfg.dtype)


def evaluate_model(cfg: EvalConfig) -> dict:
    """evaluate()'s summary ({"success_rate", ..., "grader_timeouts", "first_timeout_task"}). A bad task file
    raises TaskFileError, a bad env spec EnvSpecError, both before the model loads."""
    settings = EpisodeSettings(max_turns=cfg.max_turns, worked_example=cfg.worked_example)
    if cfg.agent and cfg.env != "math":
        raise ValueError(f"agent: --agent replaces --env; got --env {cfg.env!r} too")
    env = (load_agent(cfg.agent, settings, timeout_s=cfg.agent_timeout_s) if cfg.agent
           else load_env(cfg.env, settings, cfg.env_arg))
    spec = cfg.tasks if cfg.tasks is not None else env.default_eval_tasks
    if not spec:
        raise ValueError(f"tasks: the {'agent' if cfg.agent else 'env'} {cfg.agent or cfg.env!r} has no default "
                         "held-out tasks (EnvBundle.default_eval_tasks); give --tasks")
    tasks = check_task_rows(env.load_tasks(spec, limit=cfg.limit), spec)
    policy = load_policy(cfg)
    return evaluate(policy, tasks, sampling=SamplingParams(max_new_tokens=cfg.max_new_tokens), env=env,
                    max_batch_episodes=cfg.max_batch_episodes)
