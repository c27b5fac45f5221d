"""SFT rows: conversations in TRL's formats, rendered to the token streams RL samples, checked before training.

    {"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": ..., "tool_calls": [...]}, ...],
     "tools": [schema, ...]}                                        conversational (tools optional)
    {"prompt": "text", "completion": "text"}                        prompt / completion, plain
    {"prompt": [messages], "completion": [assistant messages]}      prompt / completion, conversational
    {"text": "..."}                                                 language modelling: every token trained

JSONL, or any source `datasets` reads (parquet, a folder, hf:NAME; datasets/hf_tasks.py); `--task-fields
messages=conversations,tools=functions` names other columns (keys: messages, prompt, completion, tools, text).
A row without a `tools` column takes the --tools schemas. A text row is TRL's language-modelling format: the
tokenizer's tokens of the text (its own special tokens, as TRL adds them) and an end-of-text token, no template.

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
anything trains: a tool call RL's own check refuses (`check_call`: no such tool, arguments that are not JSON
or not of the schema's types), a tool schema without a name, an assistant turn with nothing to learn, a
conversation past the context, a malformed message, one the chat template refuses.

A conversation far past the context is refused before it is tokenized (tokenizing megabytes takes minutes):
`surely_past` bounds its tokens from below by its characters. Each token stands for at most as many characters
as its vocabulary entry is long: a byte-level BPE entry (SmolLM2, Qwen, Llama 3, the byte tokenizer) is one
character per byte, and a byte makes at most one character; a SentencePiece piece is its text with "▁" for a
space (a byte-fallback piece, "<0xE3>", is longer than its one byte); an added token is its own text. So a text
of C characters (after the tokenizer's normalizer) takes at least C / L tokens, L the vocabulary's longest
entry (81 for SmolLM2, 12 for the byte tokenizer). The converse, one token per character at least, does not
hold (a character of several bytes can be several tokens), so characters alone cannot accept a row, only refuse.
"""

import json
import tempfile
from functools import lru_cache
from pathlib import Path

from jinja2 import TemplateError

from nanorllm.config.errors import first_line
from nanorllm.core.types import StepSample
from nanorllm.datasets import hf_tasks
from nanorllm.datasets.errors import TaskFileError
from nanorllm.datasets.golds import parse_task_fields
from nanorllm.datasets.tasks import read_records
from nanorllm.policy import chat_render
from nanorllm.policy.tool_calls import check_call

SFT_FIELDS = ("messages", "prompt", "completion", "tools", "text")
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
        raise ValueError(f"no {col['messages']!r} column, nor {col['prompt']!r} and {col['completion']!r}, nor "
                         f"{col['text']!r} (columns: {', '.join(row) or 'none'})")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError(f"{col['messages']!r} must be a list of messages")
    return [_clean(m) for m in messages], row_tools or tools, start


def _clean(m: dict) -> dict:
    """A message's fields that templates read (a parquet row carries every column's key, as None)."""
    return {k: v for k, v in m.items() if v is not None}


def message_problems(messages: list[dict], tools: list[dict] | None, start: int = 0) -> list[str]:
    """What keeps a conversation from teaching anything (its replies from message `start` on), or from rendering,
    one line each."""
    problems = [f"tool schema {k}: {why}" for k, t in enumerate(tools or []) if (why := schema_problem(t))]
    tools, replies = [t for t in tools or [] if schema_problem(t) is None], 0  # a call is checked against these
    for i, m in enumerate(messages):
        role = m.get("role")
        if role not in ROLES:
            problems.append(f"message {i}: role {role!r} is not one of {', '.join(ROLES)}")
            continue
        found = content_problems(m) + (call_problems(m.get("tool_calls") or [], tools) if role == "assistant" else [])
        problems += [f"message {i} ({role}): {p}" for p in found]
        if role != "assistant" or i < start:
            continue
        if i == 0:
            problems.append(f"message {i} (assistant): nothing comes before it to condition on")
        content = m.get("content")
        if not m.get("tool_calls") and (content is None or isinstance(content, str) and not content.strip()):
            problems.append(f"message {i} (assistant): nothing to learn (no content, no tool call)")
        replies += 1
    if not replies:
        problems.append("no assistant message: nothing to learn")
    return problems


def content_problems(m: dict) -> list[str]:
    """A message's content is text; an assistant's may be absent (its tool calls, or nothing to learn, speak)."""
    content = m.get("content")
    if isinstance(content, str) or (content is None and m["role"] == "assistant"):
        return []
    return [f"content must be text, got {'none (null)' if content is None else type(content).__name__}"]


def schema_problem(schema: dict) -> str | None:
    """Why a tool schema does not name its tool as RL reads it (policy/tool_calls.py), or None: {"type": "function",
    "function": {"name", "parameters"}} or the inner object, the name text, the parameters an object."""
    fn = schema.get("function", schema)
    if not isinstance(fn, dict):
        return f"'function' must be an object {{name, parameters}}, got {type(fn).__name__}"
    if not isinstance(fn.get("name"), str) or not fn["name"].strip():
        return f"its name must be text, got {fn.get('name')!r}"
    if not isinstance(fn.get("parameters") or {}, dict):
        return f"({fn['name']}) its parameters must be a JSON schema object"
    return None


def call_problems(calls, tools: list[dict] | None) -> list[str]:
    """Why each of an assistant message's tool calls ({"type": "function", "function": {"name", "arguments"}})
    fails RL's own check of a call (`check_call`), one line each: the SFT rows teach no call RL would refuse."""
    if not isinstance(calls, list):
        return [f"tool_calls must be a list of calls, got {type(calls).__name__}"]
    problems = []
    for k, c in enumerate(calls):
        if not isinstance(c, dict) or not isinstance(c.get("function"), dict):
            problems.append(f'tool call {k}: must be {{"type": "function", "function": {{"name", "arguments"}}}}, '
                            f"got {json.dumps(c, default=str)[:80]}")
        elif why := check_call(c, tools):
            problems.append(f"tool call {k}: {why}")
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
    return [every_token(last.task_id, last.prompt_ids + last.response_ids)]


def every_token(row_id: str, ids: list[int]) -> StepSample:
    """`ids` as one sample that trains every token after the first."""
    return StepSample(task_id=row_id, episode_id=row_id, turn=0, prompt_ids=ids[:1], response_ids=ids[1:],
                      rollout_logprobs=[0.0] * (len(ids) - 1), advantage=1.0)


def is_text_row(row: dict, col: dict[str, str]) -> bool:
    """A language-modelling row: a text column and no conversation."""
    return (row.get(col["text"]) is not None and row.get(col["messages"]) is None
            and row.get(col["prompt"]) is None and row.get(col["completion"]) is None)


def render_text_row(where: str, text, tokenizer, eos_ids: list[int], *, max_tokens: int) -> list[StepSample] | str:
    """A text row as TRL trains it: the tokenizer's tokens of the text (with its own special tokens) ending in an
    end-of-text token, every one after the first trained; or what is wrong with it (one line)."""
    if not isinstance(text, str):
        return f"the text must be text, got {type(text).__name__}"
    if not text.strip():
        return "nothing to learn (empty text)"
    if too_long := surely_past(tokenizer, "text", len(normalized(tokenizer, text)), max_tokens):
        return too_long
    ids = tokenizer(text)["input_ids"]
    ids = ids if ids[-1] in eos_ids else ids + eos_ids[:1]
    if len(ids) > max_tokens:
        return f"the text is {len(ids)} tokens, past the context ({max_tokens})"
    return [every_token(where, ids)]


def surely_past(tokenizer, what: str, chars: int, max_tokens: int) -> str | None:
    """One line when `chars` characters of text are past the context whatever their tokens: at least chars / L
    tokens, L the most characters a token stands for."""
    longest = longest_token(tokenizer)
    if chars // longest <= max_tokens:
        return None
    return (f"the {what} is at least {chars // longest} tokens ({chars} characters, at most {longest} a token), past "
            f"the context ({max_tokens})")


@lru_cache(maxsize=8)
def longest_token(tokenizer) -> int:
    """The most characters one token stands for: its vocabulary's longest entry (why: the module's docstring)."""
    return max(map(len, tokenizer.get_vocab()))


def normalized(tokenizer, text: str) -> str:
    """`text` as the tokenizer's normalizer hands it to the model (NFC, for one, can join characters)."""
    normalizer = getattr(getattr(tokenizer, "backend_tokenizer", None), "normalizer", None)
    return normalizer.normalize_str(text) if normalizer is not None else text


def held_chars(tokenizer, eos_ids: list[int], messages: list[dict], start: int) -> int:
    """Characters the conversation's last sample surely holds (the template writes each message's text, stripped):
    every message's through the last reply, the prompt's own assistant turns left out (a template may drop a turn's
    reasoning), each reply's up to an end-of-turn token written in it (its tokens end there)."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ends = [tokenizer.decode([t]) for t in eos_ids]
    chars = 0
    for i, m in enumerate(messages[:last + 1]):
        text = m.get("content") or ""
        if m["role"] == "assistant":
            if i < start:
                continue
            text = text[:min([text.find(e) for e in ends if e and e in text], default=len(text))]
        chars += len(normalized(tokenizer, text.strip()))
    return chars


def load_sft_rows(spec: str, tokenizer, eos_ids: list[int], *, task_fields: str | None = None,
                  tools: list[dict] | None = None, max_tokens: int, whole: bool = False,
                  limit: int | None = None) -> list[list[StepSample]]:
    """Every row of `spec` rendered (one list of turns per conversation); TaskFileError names every bad row."""
    col = sft_columns(task_fields)

    def rendered(where: str, row: dict) -> list[StepSample] | str:
        if is_text_row(row, col):
            return render_text_row(where, row[col["text"]], tokenizer, eos_ids, max_tokens=max_tokens)
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
    chars = held_chars(tokenizer, eos_ids, messages, start)
    if too_long := surely_past(tokenizer, "conversation", chars, max_tokens):
        return too_long
    try:
        samples = render_turns(tokenizer, eos_ids, messages, tools, row_id=where, start=start)
    except ValueError as e:
        return str(e)
    except TemplateError as e:  # a template that refuses the conversation (roles that must alternate...)
        return f"the chat template cannot render it: {first_line(e)}"
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
