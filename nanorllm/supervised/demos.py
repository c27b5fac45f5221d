"""Demonstrations from an env's own gold: `launch/sft.py --env X --demos N` needs no data file.

Each demonstration is an episode as RL would run it, played right: the env's `reset`, the agent's first
prompt (its system prompt, worked example and question: what the policy sees in training), then the
messages the bundle's `demonstrations(task)` gives (envs/base.py). Rendered by the SFT rows' renderer
(supervised/sft_data.py), with --tools' schemas as the tool run renders them, so the warm start teaches
the first prompt RL will show and the replies its env and tool parser read.
"""

from nanorllm.config.specs import prompt_settings
from nanorllm.core.types import StepSample
from nanorllm.utils.modules import EnvSpecError
from nanorllm.envs.registry import load_env, training_tasks
from nanorllm.supervised.sft_data import checked_rows, render_row


def demonstration_conversations(bundle, tasks: list[dict]) -> list[tuple[str, list[dict], int]]:
    """(task_id, the episode's whole conversation, where its gold moves begin) for each task: the agent's first
    prompt (a worked example's reply in it is prompt, not trained) + the gold moves."""
    demos = getattr(bundle, "demonstrations", None)
    if demos is None:
        raise EnvSpecError(f"{bundle.spec!r}: the env has no demonstrations(task) (envs/base.py); give --data")
    out = []
    for task in tasks:
        env, agent = bundle.make_env(), bundle.make_agent()
        agent.reset(task, env.reset(task))
        out.append((task["task_id"], [*agent.messages, *demos(task)], len(agent.messages)))
    return out


def demonstration_rows(cfg, policy, tools: list[dict] | None) -> list[list[StepSample]]:
    """--demos N of --env's training tasks (held-out ones left out, as a training run leaves them out) as SFT rows
    for `policy`'s template; TaskFileError names a bad one."""
    bundle = load_env(cfg.env, prompt_settings(cfg), cfg.env_arg)
    bundle.use_tokenizer(policy.tokenizer)
    tasks = training_tasks(bundle, cfg.tasks, limit=cfg.demos)
    context = cfg.max_tokens or policy.model.config.max_position_embeddings
    return checked_rows(cfg.env, [(task_id, render_row(task_id, messages, tools, policy.tokenizer, policy.eos_ids,
                                                       max_tokens=context, whole=cfg.sft_loss == "all", start=start))
                                  for task_id, messages, start in demonstration_conversations(bundle, tasks)])
