"""Rejection sampling (RFT, STaR, expert iteration): the policy's own rewarded episodes as SFT rows.

    python launch/sample.py --model M --env math --limit 200 --samples-per-task 8 --out runs/rft.jsonl
    python launch/sft.py --model M --data runs/rft.jsonl --out runs/rft_model

K episodes per task run through the training engine, env and reward sources (the episodes RL would
sample at the same settings); those at or above --min-reward are kept, each once per task (the same
replies twice are one row), and written as prompt/completion conversations: the prompt is the agent's
first prompt (system prompt, worked example, question: prompt, not trained), the completion the
episode's replies with the env's feedback or tool results between them, so launch/sft.py trains the
replies exactly where the episode wrote them. Each row carries its task_id and reward.
"""

import json
from pathlib import Path

from nanorllm.config.sft import SampleConfig
from nanorllm.config.specs import env_spec, sampling_params
from nanorllm.core.types import RolloutResult, Trajectory
from nanorllm.envs.registry import load_bundle, training_tasks
from nanorllm.rollout.engine import RolloutEngine
from nanorllm.utils.files import write_atomic
from nanorllm.utils.outputs import OutputPath, output_problems


def episode_messages(t: Trajectory) -> list[dict]:
    """The messages an episode added after its first prompt: each reply, and between replies the env's
    feedback (a user message) or the tools' results (`tool` messages)."""
    out = []
    for step in t.steps:
        out.append({"role": "assistant", "content": step.model_response})
        if "tool_results" in step.info and not step.done:
            out += [{"role": "tool", "name": r["name"], "content": r["content"]} for r in step.info["tool_results"]]
        elif step.feedback is not None and not step.done:
            out.append({"role": "user", "content": step.feedback})
    return out


def kept_rows(results: list[RolloutResult], prompts: dict[str, list[dict]], *, min_reward: float,
              tools: list[dict] | None = None) -> list[dict]:
    """The episodes at or above `min_reward` (not failed) as SFT rows, each task's identical completions once."""
    rows, seen = [], set()
    for r in results:
        if r.failed or r.reward < min_reward:
            continue
        completion = episode_messages(r.trajectory)
        key = (r.task_id, json.dumps(completion, sort_keys=True))
        if key in seen:
            continue
        seen.add(key)
        rows.append({"task_id": r.task_id, "prompt": prompts[r.task_id], "completion": completion,
                     "reward": r.reward, **({"tools": tools} if tools else {})})
    return rows


def sample_rows(cfg: SampleConfig, policy) -> tuple[list[dict], list[RolloutResult]]:
    """(the kept rows, every episode sampled): --samples-per-task episodes of each task from `policy` on --env."""
    bundle = load_bundle(env_spec(cfg))
    tasks = training_tasks(bundle, cfg.tasks, cfg.eval_tasks, cfg.limit)
    engine = RolloutEngine(policy, sampling=sampling_params(cfg), env=bundle)
    results = engine.run(tasks, num_samples=cfg.samples_per_task, seed=cfg.seed).results
    prompts = {}
    for task in tasks:
        env, agent = bundle.make_env(), bundle.make_agent()
        agent.reset(task, env.reset(task))
        prompts[task["task_id"]] = list(agent.messages)
    tools = getattr(bundle, "tools", None)
    schemas = [t.schema for t in tools] if tools else None
    return kept_rows(results, prompts, min_reward=cfg.min_reward, tools=schemas), results


def summary(rows: list[dict], results: list[RolloutResult], cfg: SampleConfig) -> str:
    """The closing line: the rows kept of the episodes sampled, and how many of those failed (an env error, or a
    reward no source could compute), which are never kept whatever --min-reward says."""
    failed = sum(r.failed for r in results)
    return (f"[sample] kept {len(rows)} of {len(results)} episodes (reward >= {cfg.min_reward}, deduplicated; "
            f"{failed} failed: an env error or a reward that could not be computed) in {cfg.out}")


def main(argv: list[str]) -> int:
    """launch/sample.py: parse and check, sample, write the kept rows (atomically); 2 on bad input."""
    import sys

    import tyro

    from nanorllm.datasets.errors import TaskFileError
    from nanorllm.utils.modules import EnvSpecError
    from nanorllm.policy.hf_causal import HFCausalPolicy
    from nanorllm.supervised.sft import learner_device
    from nanorllm.utils.devices import configure_threads

    cfg = tyro.cli(SampleConfig, args=argv, description=__doc__)
    problems = cfg.validate() or output_problems(OutputPath(cfg.out, "file"), cfg.overwrite)
    if problems:
        print("\n".join(f"error: {p}" for p in problems), file=sys.stderr)
        return 2
    device = learner_device(cfg.devices)
    configure_threads(device, cfg.threads, 1)
    try:
        policy = HFCausalPolicy.from_name(cfg.model, device=device, seed=cfg.seed)
        rows, results = sample_rows(cfg, policy)
    except (TaskFileError, EnvSpecError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(Path(cfg.out), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(summary(rows, results, cfg))
    return 0
