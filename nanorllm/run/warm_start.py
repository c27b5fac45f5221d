"""A run that starts from a model SFT wrote (its folder's sft.json, supervised/sft.py) is told when its first prompt
is not the one the model was fine-tuned to answer: a model warm-started on the user's own conversations, then
trained under the math agent's system prompt and worked example, does not write what it was taught."""

import json
from pathlib import Path

from nanorllm.config import TrainConfig


def prompt_shape_warning(cfg: TrainConfig) -> str | None:
    """One line when --model is an SFT folder whose recorded prompt differs from this run's, naming the flags that
    match it; None otherwise (not a folder, no sft.json, or the same prompt)."""
    record = Path(cfg.model) / "sft.json"
    if not record.is_file():
        return None
    try:
        shape = json.loads(record.read_text())["prompt"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    differ = bool(shape.get("system_prompts_differ"))
    taught = (shape.get("system_prompt"), bool(shape.get("worked_example")))
    ours = (taught[0] if differ else cfg.system_prompt, cfg.worked_example)
    if ours == taught:
        return None
    flags = [f"--system-prompt {json.dumps(taught[0])}"] if ours[0] != taught[0] and taught[0] is not None else []
    flags += [] if ours[1] == taught[1] else ["--worked-example" if taught[1] else "--no-worked-example"]
    learned = "its rows' own system prompts and no worked example" if differ else describe(*taught)
    return (f"[warm start] warning: {cfg.model} was fine-tuned on prompts with {learned}, and this run prompts "
            f"with {describe(cfg.system_prompt, cfg.worked_example)}: pass {' '.join(flags)} to train it on the "
            "prompt it learned (docs/warm-start.md)")


def describe(system_prompt: str | None, worked_example: bool) -> str:
    """'the built-in system prompt and a worked example', 'no system prompt and no worked example', ..."""
    system = ("the built-in system prompt" if system_prompt is None else "no system prompt" if system_prompt == ""
              else f"the system prompt {system_prompt[:40]!r}")
    return f"{system} and {'a' if worked_example else 'no'} worked example"
