"""Prompt lengths, measured when the tasks load: a task whose first prompt does not fit the model is refused
at start, naming it and its length, instead of a minute of tokenizing a huge question and then a KV cache
refused as too large with advice about --max-batch-episodes.

Measuring costs almost nothing: a prompt has at most as many tokens as its template's plus one per UTF-8
byte of the question (byte-level and byte-fallback tokenizers give every token at least one byte), so only a
question whose bound passes the limit is tokenized, and only its first `CHARS_PER_TOKEN x (limit + 1)`
characters. Rows without a text "question" are the env's own business (its reset builds the prompt).
"""

from nanorllm.envs.base import EnvBundle
from nanorllm.policy.base import SamplingParams
from nanorllm.rollout.engine import feedback_tokens, longest_episode
from nanorllm.rollout.row_bound import CHARS_PER_TOKEN


def prompt_limit(policy, *, max_prompt_tokens: int | None, sampling: SamplingParams, max_turns: int,
                 seats: int = 1) -> int | None:
    """The longest first prompt a run accepts: `max_prompt_tokens` when given, else the model's context less the
    room the episode's turns need (responses and feedback); None when the model states no context."""
    if max_prompt_tokens is not None:
        return max_prompt_tokens
    context = getattr(policy.model.config, "max_position_embeddings", None)
    if not context:
        return None
    return context - longest_episode(0, sampling, max_turns, seats)


def no_room(policy, *, sampling: SamplingParams, max_turns: int, limit: int, seats: int = 1) -> str:
    """The problem when the limit comes from the model's context and the turns' room leaves no training task's first
    prompt a place: the flags that shrink the room are the fix, not --drop-long-prompts, which would drop them all."""
    context, feedback = policy.model.config.max_position_embeddings, feedback_tokens(sampling, seats)
    return (f"max_turns / max_new_tokens: {max_turns} turn(s) of up to {sampling.max_new_tokens} new tokens "
            f"(--max-turns, --max-new-tokens) and {max_turns - 1} feedback turn(s) of ~{feedback} tokens take "
            f"{context - limit} of the model's {context}-token context, leaving {limit} for the first prompt, less than "
            "any training task's: lower --max-turns or --max-new-tokens (or use a model with a longer context)")


def _prompt_tokens(policy, env: EnvBundle, task: dict, question: str) -> int:
    agent = env.make_agent()
    agent.reset(task, question)
    return len(policy.first_prompt_ids(agent.messages, getattr(agent, "tools", None)))


def long_prompts(tasks: list[dict], *, policy, env: EnvBundle, limit: int) -> list[tuple[dict, int, bool]]:
    """(task, tokens, cut) for every task whose first prompt holds more than `limit` tokens; `cut`: only the
    question's first CHARS_PER_TOKEN x (limit + 1) characters were tokenized (it holds at least that many)."""
    with_question = [t for t in tasks if isinstance(t.get("question"), str)]
    if not with_question:
        return []
    template = _prompt_tokens(policy, env, with_question[0], "")
    out = []
    for task in with_question:
        question = task["question"]
        if template + len(question.encode("utf-8")) <= limit:
            continue
        cap = CHARS_PER_TOKEN * (limit + 1)
        n = _prompt_tokens(policy, env, task, question[:cap])
        if n > limit:
            out.append((task, n, len(question) > cap))
    return out


def describe_long(found: list[tuple[dict, int, bool]], limit: int, what: str) -> list[str]:
    """One problem line per task (the first 10, then a count)."""
    lines = [f"{what} task {t['task_id']!r}: its prompt holds {'more than ' if cut else ''}{n} tokens, more than "
             f"{limit} (--max-prompt-tokens; default: the model's context less the turns' room)"
             for t, n, cut in found[:10]]
    if len(found) > 10:
        lines.append(f"... and {len(found) - 10} more {what} task(s) as long")
    return lines
