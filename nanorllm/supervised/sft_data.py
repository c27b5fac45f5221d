"""SFT rows: conversations in TRL's formats, rendered to the token streams RL samples, checked before training.

    {"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": ..., "tool_calls": [...]}, ...],
     "tools": [schema, ...]}                                        conversational (tools optional)
    {"prompt": "text", "completion": "text"}                        prompt / completion, plain
    {"prompt": [messages], "completion": [assistant messages]}      prompt / completion, conversational

JSONL, or any source `datasets` reads (parquet, a folder, hf:NAME; datasets/hf_tasks.py); `--task-fields
messages=conversations,tools=functions` names other columns (keys: messages, prompt, completion, tools). A
row without a `tools` column takes the --tools schemas.

Why rendering goes through policy/chat_render.py, turn by turn, and not through one template call: the
tokens SFT teaches must be the tokens the RL parser reads. A rollout's first prompt is `prompt_ids` of the
messages before the first reply; a reply is what the policy samples (ending with the end-of-turn token it
stops on); each later prompt is the previous prompt + the reply + `continuation_ids` of the messages after
it. An assistant message becomes the reply the policy would have to sample to write it: the template's text
of that message (its tool calls written as the template, or the fallback Hermes block, writes them), up to
and including the end-of-turn token. So each assistant turn is one StepSample, exactly like an RL turn,
and the learner merges a conversation's turns into one row (trainer/collate.py).

The loss is on assistant tokens (each reply's tokens); `whole` trains on the whole conversation instead
(every token after the first). Bad rows are named by file and line (or row), all at once, before
anything trains: a tool call naming no tool, an assistant turn with nothing to learn, a conversation past
the context, a malformed message.
"""

import json
import tempfile
from pathlib import Path

from nanorllm.core.types import StepSample
from nanorllm.datasets import hf_tasks
from nanorllm.datasets.errors import TaskFileError
from nanorllm.datasets.golds import parse_task_fields
from nanorllm.datasets.tasks import read_records
from nanorllm.policy import chat_render

SFT_FIELDS = ("messages", "prompt", "completion", "tools")
ROLES = ("system", "user", "assistant", "tool")


def sft_columns(task_fields: str | None) -> dict[str, str]:
    """{key: the source's column} for the SFT keys, from --task-fields' key=column list."""
    return {k: k for k in SFT_FIELDS} | parse_task_fields(task_fields, keys=SFT_FIELDS)


def read_rows(spec: str, *, limit: int | None = None) -> list[tuple[str, dict]]:
    """(where, row) of every row of a JSONL file ("file:line") or a `datasets` source ("source: row i")."""
    if hf_tasks.is_datasets_source(spec):
        with tempfile.TemporaryDirectory(prefix="nanorllm-sft-") as cache_dir:
            rows = hf_tasks._open(spec, cache_dir, limit).to_list()
        return [(f"{spec}: row {i}", row) for i, row in enumerate(rows[:limit])]
    path = Path(spec)
    if not path.is_file():
        raise TaskFileError(spec, [f"{spec}: {'is not a file' if path.exists() else 'file not found'}"])
    problems: list[tuple[int, str]] = []
    records = read_records(path, problems)
    if problems:
        raise TaskFileError(spec, [f"{spec}:{line}: {p}" for line, p in problems])
    return [(f"{spec}:{line}", row) for line, row in records[:limit]]


def conversation(row: dict, col: dict[str, str], tools: list[dict] | None
                 ) -> tuple[list[dict], list[dict] | None, int]:
    """(messages, tool schemas, the first trained message) of a row in any of the formats above: a `messages`
    row trains from its first message, a prompt/completion row from its completion (a prompt's own assistant
    turns, a worked example, are prompt); ValueError says what is wrong."""
    row_tools = row.get(col["tools"])
    if isinstance(row_tools, str):
        try:
            row_tools = json.loads(row_tools) if row_tools.strip() else None
        except ValueError:
            raise ValueError(f"column {col['tools']!r} is text but not a JSON list of tool schemas") from None
    if row_tools is not None and not (isinstance(row_tools, list) and all(isinstance(t, dict) for t in row_tools)):
        raise ValueError(f"column {col['tools']!r} must be a list of tool schemas (JSON objects)")
    start = 0
    if col["messages"] in row and row[col["messages"]] is not None:
        messages = row[col["messages"]]
    elif col["prompt"] in row and col["completion"] in row:
        prompt, completion = row[col["prompt"]], row[col["completion"]]
        if isinstance(prompt, str) and isinstance(completion, str):
            messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
        elif isinstance(prompt, list) and isinstance(completion, list):
            messages, start = [*prompt, *completion], len(prompt)
        else:
            raise ValueError(f"{col['prompt']!r} and {col['completion']!r} must both be text or both lists of "
                             "messages")
    else:
        raise ValueError(f"no {col['messages']!r} column, nor {col['prompt']!r} and {col['completion']!r} "
                         f"(columns: {', '.join(row) or 'none'})")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError(f"{col['messages']!r} must be a list of messages")
    return [_clean(m) for m in messages], row_tools or tools, start


def _clean(m: dict) -> dict:
    """A message's fields that templates read (a parquet row carries every column's key, as None)."""
    return {k: v for k, v in m.items() if v is not None}


def message_problems(messages: list[dict], tools: list[dict] | None, start: int = 0) -> list[str]:
    """What keeps a conversation from teaching anything (its replies from message `start` on), one line each."""
    names = {t.get("function", t).get("name") for t in tools or []}
    problems, replies = [], 0
    for i, m in enumerate(messages):
        role = m.get("role")
        if role not in ROLES:
            problems.append(f"message {i}: role {role!r} is not one of {', '.join(ROLES)}")
            continue
        if role != "assistant" or i < start:
            if not isinstance(m.get("content", ""), str):
                problems.append(f"message {i} ({role}): content must be text")
            continue
        if i == 0:
            problems.append(f"message {i} (assistant): nothing comes before it to condition on")
        calls = m.get("tool_calls") or []
        if not calls and not str(m.get("content") or "").strip():
            problems.append(f"message {i} (assistant): nothing to learn (no content, no tool call)")
        for c in calls:
            name = (c.get("function") or {}).get("name") if isinstance(c, dict) else None
            if name not in names:
                problems.append(f"message {i} (assistant): tool call {name!r} names no tool "
                                f"({', '.join(sorted(filter(None, names))) or 'no tools given'})")
        replies += 1
    if not replies:
        problems.append("no assistant message: nothing to learn")
    return problems


def render_turns(tokenizer, eos_ids: list[int], messages: list[dict], tools: list[dict] | None, *,
                 row_id: str, start: int = 0) -> list[StepSample]:
    """One StepSample per assistant message from message `start` on: the prompt RL would have at that turn and
    the reply it would sample."""
    samples: list[StepSample] = []
    prompt, reply, after = [], [], start  # after: the first message since the last reply
    for j, m in enumerate(messages):
        if m["role"] != "assistant" or j < start:
            continue
        prompt = (chat_render.prompt_ids(tokenizer, messages[:j], tools) if not samples else
                  chat_render.continuation_ids(tokenizer, eos_ids, prompt, reply, messages[after:j], tools))
        reply = reply_ids(tokenizer, eos_ids, messages[:j], m, tools)
        samples.append(StepSample(task_id=row_id, episode_id=row_id, turn=len(samples), prompt_ids=prompt,
                                  response_ids=reply, rollout_logprobs=[0.0] * len(reply), advantage=1.0))
        after = j + 1
    return samples


def reply_ids(tokenizer, eos_ids: list[int], history: list[dict], message: dict, tools: list[dict] | None) -> list[int]:
    """The tokens the policy samples to write `message` after `history`: the template's text of it (after the
    generation prompt) through its end-of-turn token, which is added where the template writes none."""
    before = chat_render.render_text(tokenizer, history, tools, add_generation_prompt=True)
    whole = chat_render.render_text(tokenizer, [*history, message], tools)
    if not whole.startswith(before):
        raise ValueError("the chat template renders this reply's history differently once the reply follows it")
    ids = tokenizer(whole[len(before):], add_special_tokens=False)["input_ids"]
    end = next((i for i, t in enumerate(ids) if t in eos_ids), None)
    return ids[:end + 1] if end is not None else ids + eos_ids[:1]


def whole_conversation(samples: list[StepSample]) -> list[StepSample]:
    """The conversation as one sample whose every token after the first is trained (the --sft-loss all mode)."""
    last = samples[-1]
    ids = last.prompt_ids + last.response_ids
    return [StepSample(task_id=last.task_id, episode_id=last.episode_id, turn=0, prompt_ids=ids[:1],
                       response_ids=ids[1:], rollout_logprobs=[0.0] * (len(ids) - 1), advantage=1.0)]


def load_sft_rows(spec: str, tokenizer, eos_ids: list[int], *, task_fields: str | None = None,
                  tools: list[dict] | None = None, max_tokens: int, whole: bool = False,
                  limit: int | None = None) -> list[list[StepSample]]:
    """Every row of `spec` rendered (one list of turns per conversation); TaskFileError names every bad row."""
    col = sft_columns(task_fields)

    def rendered(where: str, row: dict) -> list[StepSample] | str:
        try:
            messages, row_tools, start = conversation(row, col, tools)
        except ValueError as e:
            return str(e)
        return render_row(where, messages, row_tools, tokenizer, eos_ids, max_tokens=max_tokens, whole=whole,
                          start=start)

    return checked_rows(spec, [(where, rendered(where, row)) for where, row in read_rows(spec, limit=limit)])


def render_row(where: str, messages: list[dict], tools: list[dict] | None, tokenizer, eos_ids: list[int], *,
               max_tokens: int, whole: bool = False, start: int = 0) -> list[StepSample] | str:
    """A conversation's turns as the learner trains them (its replies from message `start` on), or what is
    wrong with it (one line)."""
    found = message_problems(messages, tools, start)
    if found:
        return "; ".join(found)
    try:
        samples = render_turns(tokenizer, eos_ids, messages, tools, row_id=where, start=start)
    except ValueError as e:
        return str(e)
    n = len(samples[-1].prompt_ids) + len(samples[-1].response_ids)
    if n > max_tokens:
        return f"the conversation is {n} tokens, past the context ({max_tokens})"
    return whole_conversation(samples) if whole else samples


def checked_rows(source: str, rendered: list[tuple[str, list[StepSample] | str]]) -> list[list[StepSample]]:
    """The rendered rows; TaskFileError naming every bad one ("where: what"), in order, when any is bad."""
    problems = [f"{where}: {r}" for where, r in rendered if isinstance(r, str)]
    if not rendered:
        problems.append(f"{source}: no rows")
    if problems:
        raise TaskFileError(source, problems)
    return [r for _, r in rendered]
