"""Evaluate a model greedily on an env's tasks (math self-refine by default) with the training episodes.

    python launch/eval.py --model runs/<run>/final_model --tasks arith:digits=1,terms=3,count=200,seed=2
    python launch/eval.py --model smollm2-135m-instruct --tasks ../shared/data/gsm8k/train.jsonl --limit 100
    GEMINI_API_KEY=... python launch/eval.py --model gemini:gemini-2.5-flash --tasks tasks.jsonl
    python launch/eval.py --env calc --tasks calc:count=200,seed=2 --max-turns 3 --max-new-tokens 48

Prints one JSON line: {"success_rate", "first_turn_success", "mean_turns", "n"}.
"""

import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tyro  # noqa: E402

from nanorllm.datasets.tasks import TaskFileError, check_task_rows  # noqa: E402
from nanorllm.envs.base import EpisodeSettings  # noqa: E402
from nanorllm.envs.registry import EnvSpecError, load_env  # noqa: E402
from nanorllm.policy.base import SamplingParams  # noqa: E402
from nanorllm.trainer.evaluate import evaluate  # noqa: E402
from nanorllm.utils.devices import configure_threads  # noqa: E402


@dataclass
class EvalConfig:
    tasks: str
    """Tasks in the env's format (math: a JSONL file, seed schema or GSM8K format, or an arith:... spec)."""
    env: str = "math"
    """The environment bundle: math, calc, module.path:Name or path/to/file.py:Name."""
    env_arg: tuple[str, ...] = ()
    """The env's own options, key=value."""
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
    from nanorllm.llm.gemini import is_gemini_spec, policy_from_spec

    if is_gemini_spec(cfg.model):
        return policy_from_spec(cfg.model, concurrency=cfg.api_concurrency)
    from nanorllm.policy.hf_causal import HFCausalPolicy

    configure_threads(cfg.device, None, 1)
    return HFCausalPolicy.from_name(cfg.model, device=cfg.device, dtype=cfg.dtype)


def main(argv: list[str] | None = None) -> int:
    cfg = tyro.cli(EvalConfig, args=argv)
    try:
        env = load_env(cfg.env, EpisodeSettings(max_turns=cfg.max_turns, worked_example=cfg.worked_example),
                       cfg.env_arg)
        tasks = check_task_rows(env.load_tasks(cfg.tasks, limit=cfg.limit), cfg.tasks)
    except (TaskFileError, EnvSpecError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    policy = load_policy(cfg)
    result = evaluate(policy, tasks, sampling=SamplingParams(max_new_tokens=cfg.max_new_tokens), env=env,
                      max_batch_episodes=cfg.max_batch_episodes)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
