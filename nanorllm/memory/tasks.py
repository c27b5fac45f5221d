"""What the memory plan reads of a run's tasks, with the tokenizer alone (no weights): the first prompts'
length and the leading tokens they all share (a few training tasks rendered through the env's agent and
the model's chat template, as the rollout does), and the size of its largest held-out set.

The prompts decide the learner's activations: a micro-batch holds as many episodes as its token budget
takes at the episode's width, and the learner's forward computes the leading tokens every row shares
(chat markup, system prompt, worked example: 71 of the default task's 84) once for the whole
micro-batch (HFCausalPolicy.forward), not once per row. A guess of their length instead (256 tokens,
none shared) planned the default run's activations at twice what its learner held. The held-out set
decides the learner's KV cache: the eval decodes every held-out episode at once, up to
--max-batch-episodes (201 slots for the default run's 200 tasks: 2.8 GB).

None where the prompts cannot be measured without loading a model (the default model not yet
converted, a hub id, a peft adapter folder) or without running the env (tasks with no text question,
an env that fails here: its own checks name that at setup); the plan then falls back to its guesses.
The tasks are the run's, loaded once by its assembly (nanorllm/run/assembly.py).
"""

import os
from dataclasses import dataclass

SAMPLE_TASKS = 8  # rendered per run: the shared prefix is what they all begin with


@dataclass(frozen=True)
class TaskShape:
    first: int  # tokens of the longest first prompt rendered
    shared: int  # leading tokens every rendered prompt begins with
    eval_tasks: int | None = None  # tasks of the largest held-out set (--eval-tasks, each --eval-set); None: unknown


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


def task_shape(parts, *, prompt_limit: int | None = None) -> TaskShape | None:
    """The first prompts of the run's first SAMPLE_TASKS training tasks and its largest held-out set
    (module docstring), from the run's assembled `parts` (trainer/parts.py); None where they cannot be
    measured here. With `prompt_limit` (the longest first prompt the run accepts, rollout/prompt_budget.py)
    a question is rendered from its first CHARS_PER_TOKEN x (limit + 1) characters only: a longer prompt is
    refused or dropped at setup anyway."""
    tokenizer = plan_tokenizer(parts.cfg.model)
    if tokenizer is None:
        return None
    from nanorllm.policy.chat_render import prompt_ids
    from nanorllm.rollout.engine import shared_prefix
    from nanorllm.rollout.prompt_budget import CHARS_PER_TOKEN

    cap = None if prompt_limit is None else CHARS_PER_TOKEN * (prompt_limit + 1)
    tasks = [t for t in parts.train_tasks[:SAMPLE_TASKS] if isinstance(t.get("question"), str)]
    try:
        prompts = []
        for task in tasks:
            agent = parts.env.make_agent()
            agent.reset(task, task["question"][:cap])
            prompts.append(prompt_ids(tokenizer, agent.messages))
    except Exception:  # the env's own checks name it at setup
        return None
    if not prompts:
        return None
    held_out = [parts.eval_tasks, *parts.eval_sets.values()]
    return TaskShape(first=max(map(len, prompts)), shared=len(shared_prefix(prompts)) if len(prompts) > 1 else 0,
                     eval_tasks=max(map(len, held_out)))
