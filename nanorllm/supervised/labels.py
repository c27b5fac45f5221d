"""Labelled rows for a reward model from the base policy itself (launch/train_reward_model.py --sample-from):
each response sampled on the math env's tasks and labelled by the env's real grader (1 correct, 0 not). It wires a
policy, the math env and the engine together, so it sits on top, beside the program that uses it.

The rule, fixed before any run: one turn (--max-turns 1), temperature 1.0, the given seed, the first prompt
and grading of --system-prompt, --worked-example and --grader-timeout-s, the env's default training tasks
(never its held-out set: a task that is in it is left out), the first --limit of them, --samples-per-task each.
"""

import json
from pathlib import Path

from nanorllm.utils.files import write_atomic


def sample_rows(cfg, say=print) -> list[dict]:
    """The rows {prompt, response, label, task_id}, written to cfg.out as JSONL."""
    from nanorllm.envs.base import EpisodeSettings
    from nanorllm.envs.registry import load_env
    from nanorllm.policy.base import SamplingParams
    from nanorllm.policy.hf_causal import HFCausalPolicy
    from nanorllm.rollout.engine import RolloutEngine

    env = load_env("math", EpisodeSettings(max_turns=cfg.max_turns, system_prompt=cfg.system_prompt,
                                           worked_example=cfg.worked_example, grader_timeout_s=cfg.grader_timeout_s))
    held = {t["question"] for t in env.load_tasks(env.default_eval_tasks)}
    tasks = [t for t in env.load_tasks(cfg.tasks or env.default_tasks) if t["question"] not in held][:cfg.limit]
    from nanorllm.supervised.fit import fit_device

    policy = HFCausalPolicy.from_name(cfg.sample_from, device=fit_device(cfg), dtype=cfg.dtype, seed=cfg.seed,
                                      replica=True)
    engine = RolloutEngine(policy, sampling=SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=1.0),
                           env=env)
    results = engine.run(tasks, num_samples=cfg.samples_per_task, seed=cfg.seed).results
    rows = [{"prompt": r.trajectory.task["question"], "response": r.trajectory.steps[-1].model_response,
             "label": int(r.succeeded), "task_id": r.task_id} for r in results if r.trajectory.steps]
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    say(f"[sample] {len(rows)} rows from {len(tasks)} tasks x {cfg.samples_per_task}: "
        f"{sum(r['label'] for r in rows) / max(len(rows), 1):.3f} labelled 1 | written to {out}")
    return rows
