"""The first prompts' shape, for the memory plan: how long they are and how many leading tokens they all
share, measured with the tokenizer alone (no weights) by rendering a few training tasks through the env's
agent and the model's chat template, as the rollout does.

Both decide the learner's activations: a micro-batch holds as many episodes as its token budget takes at
the episode's width, and the learner's forward computes the leading tokens every row shares (chat markup,
system prompt, worked example: 71 of the default task's 84) once for the whole micro-batch
(HFCausalPolicy.forward), not once per row. A guess of their length instead (256 tokens, none shared)
planned the default run's activations at twice what its learner held.

None where they cannot be measured without loading a model (the default model not yet converted, a hub
id, a peft adapter folder) or without running the env (tasks with no text question, an env that fails
here: its own checks name that at setup); the plan then falls back to its guess.
"""

import os
from dataclasses import dataclass

SAMPLE_TASKS = 8  # rendered per run: the shared prefix is what they all begin with


@dataclass(frozen=True)
class PromptShape:
    first: int  # tokens of the longest first prompt rendered
    shared: int  # leading tokens every rendered prompt begins with


def plan_tokenizer(name: str):
    """The tokenizer of model `name` if it can be had without loading or converting a model; else None."""
    from nanorllm.policy.byte_tokenizer import tiny_tokenizer
    from nanorllm.policy.lora import is_adapter_dir
    from nanorllm.policy.models import SMOLLM2, TINY, cache_dir
    from nanorllm.policy.presets import PREFIX, PRESETS, is_preset, preset_tokenizer

    if is_preset(name):
        entry = PRESETS.get(name.removeprefix(PREFIX))
        return preset_tokenizer(entry[2]["vocab_size"]) if entry else None
    if name == TINY:
        return tiny_tokenizer()
    path = str(cache_dir() / SMOLLM2) if name == SMOLLM2 else name
    if not os.path.isfile(os.path.join(path, "config.json")) or is_adapter_dir(path):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    except Exception:
        return None


def prompt_shape(cfg) -> PromptShape | None:
    """The first prompts of the run's first SAMPLE_TASKS training tasks (module docstring); None where they
    cannot be measured here."""
    tokenizer = plan_tokenizer(cfg.model)
    if tokenizer is None:
        return None
    from nanorllm.envs.registry import env_from_config, task_specs
    from nanorllm.policy.hf_causal import chat_prompt_ids
    from nanorllm.rollout.engine import shared_prefix

    try:
        env = env_from_config(cfg)
        spec, _ = task_specs(cfg, env)
        tasks = [t for t in env.load_tasks(spec, limit=SAMPLE_TASKS) if isinstance(t.get("question"), str)]
        prompts = []
        for task in tasks:
            agent = env.make_agent()
            agent.reset(task, task["question"])
            prompts.append(chat_prompt_ids(tokenizer, agent.messages))
    except Exception:  # the env's or the tasks' own checks name it at setup
        return None
    if not prompts:
        return None
    return PromptShape(first=max(map(len, prompts)), shared=len(shared_prefix(prompts)) if len(prompts) > 1 else 0)
