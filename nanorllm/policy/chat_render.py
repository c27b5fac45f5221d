"""The chat template, as token streams: the one place prompts are rendered, for an env's turns
(HFCausalPolicy.first_prompt_ids / next_prompt_ids) and for the --agent endpoint alike.

A first prompt is the whole conversation through the template with its generation prompt. A later
prompt is never re-rendered: it is the previous prompt + the sampled response ids + only the new
messages, rendered after a placeholder assistant turn (the text after the placeholder is the
end-of-turn marker, the new messages and the generation prompt). So every turn of an episode extends
the one before token for token, and no decode/re-encode round trip changes a sampled token.

Tools. Where the template reads `tools`, they go to `apply_chat_template(..., tools=...)` and the
template writes them (and its tool turns) in its own words. Where it does not (SmolLM2's template, the
byte tokenizer's), the Hermes convention stands in (`FALLBACK`, Qwen2.5's wording): a "# Tools" block
with the JSON schemas in <tools></tools> and the call format <tool_call>{"name", "arguments"}</tool_call>
is appended to the system message (or is the system message, when there is none); a role `tool` message
of a template with no `tool` role is a user turn wrapped in <tool_response>...</tool_response> (a run of
them one user turn, as Qwen2.5 writes them); an assistant message's tool_calls are written into its text
as <tool_call> blocks. The fallback implies the hermes parser (`tool_format`).
"""

import json
import re

from nanorllm.policy.tool_calls import resolve_parser

SENTINEL = "\x00NANORLLM_SENTINEL\x00"
FALLBACK_LABEL = "fallback Hermes block"
FALLBACK = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{schemas}\n"
            "</tools>\n\nFor each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')
_TOOL_ROLE = re.compile(r"""['"]tool['"]""")


def reads_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders a `tools` list itself."""
    return "tools" in (getattr(tokenizer, "chat_template", None) or "")


def has_tool_role(tokenizer) -> bool:
    """Whether the template names a `tool` role (renders tool results as its own turns)."""
    return bool(_TOOL_ROLE.search(getattr(tokenizer, "chat_template", None) or ""))


def tool_format(tokenizer, parser: str | None = "auto") -> tuple[str, str]:
    """(the tool-call parser, what renders the tools): --tool-parser's name, else the format the template's markers
    show (policy/tool_calls.py parser_for_template: hermes when it has none, as under the fallback block); the
    template of the tokenizer's name or path, or "fallback Hermes block"."""
    chosen = resolve_parser(parser, getattr(tokenizer, "chat_template", None))
    if not reads_tools(tokenizer):
        return chosen, FALLBACK_LABEL
    return chosen, f"chat template of {getattr(tokenizer, 'name_or_path', '') or 'the tokenizer'}"


def fallback_block(tools: list[dict]) -> str:
    """The Hermes tools block: one JSON schema a line."""
    return FALLBACK.format(schemas="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))


def _arguments_as_objects(m: dict) -> dict:
    """An assistant message's tool-call arguments as objects where they parse (what templates read)."""
    calls = []
    for c in m["tool_calls"]:
        fn = c.get("function", c)
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                pass
        calls.append({**c, "function": {"name": fn.get("name"), "arguments": args}})
    return {**m, "tool_calls": calls}


def _fallback_messages(messages: list[dict], tools: list[dict] | None, *, tool_role: bool) -> list[dict]:
    """`messages` as a template without tools renders them: the Hermes block in the system message, tool
    calls in the assistant's text, tool results as user turns of <tool_response> blocks (without a tool role)."""
    out, in_results = [], False  # in_results: the last message out is a user turn of tool results
    for m in messages:
        if m.get("role") == "tool" and not tool_role:
            block = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
            if in_results:
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + block}
            else:
                out.append({"role": "user", "content": block})
            in_results = True
            continue
        in_results = False
        if m.get("role") == "assistant" and m.get("tool_calls"):
            blocks = [json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                                 ensure_ascii=False) for c in _arguments_as_objects(m)["tool_calls"]]
            text = "\n".join([*([m["content"]] if m.get("content") else []),
                              *(f"<tool_call>\n{b}\n</tool_call>" for b in blocks)])
            out.append({"role": "assistant", "content": text})
        else:
            out.append({**m, "content": m.get("content") or ""})
    if tools:
        block = fallback_block(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def render_text(tokenizer, messages: list[dict], tools: list[dict] | None = None, **kw) -> str:
    """The template's text of `messages` (with `tools`: the template's, or the fallback block's)."""
    if reads_tools(tokenizer):
        msgs = [_arguments_as_objects(m) if m.get("tool_calls") else m for m in messages]
        return tokenizer.apply_chat_template(msgs, tokenize=False, **({"tools": tools} if tools else {}), **kw)
    if tools or any(m.get("role") == "tool" or m.get("tool_calls") for m in messages):
        messages = _fallback_messages(messages, tools, tool_role=has_tool_role(tokenizer))
    return tokenizer.apply_chat_template(messages, tokenize=False, **kw)


def prompt_ids(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """An opening prompt's token ids: the whole conversation with the generation prompt."""
    text = render_text(tokenizer, messages, tools, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def continuation_ids(tokenizer, eos_ids: list[int], prompt: list[int], response: list[int],
                     new_messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """prompt + response + the template's text after an assistant turn for `new_messages` (its end-of-turn
    marker, the messages, the generation prompt). The tools render before the placeholder turn, so they
    are not repeated; the fallback's tool turns render as the whole prompt's do."""
    msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": SENTINEL}, *new_messages]
    text = render_text(tokenizer, msgs, tools if reads_tools(tokenizer) else None, add_generation_prompt=True)
    tail = tokenizer(text.split(SENTINEL, 1)[1], add_special_tokens=False)["input_ids"]
    if response and tail and response[-1] == tail[0] and tail[0] in eos_ids:
        tail = tail[1:]  # the sampled response already ends with the end-of-turn token
    return prompt + response + tail


KNOWN_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")


def end_of_turn_ids(tokenizer) -> list[int]:
    """Tokens that end an assistant turn: the first token the chat template writes after an assistant
    message (if it is a special token), and any well-known end-of-turn token the vocabulary holds."""
    added = tokenizer.get_added_vocab()  # special tokens as {text: id}
    ids = {added[t] for t in KNOWN_END_OF_TURN if t in added}
    if tokenizer.chat_template:
        msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": SENTINEL}]
        try:
            text = tokenizer.apply_chat_template(msgs, tokenize=False)
        except Exception:  # a template that refuses this conversation: keep the known tokens
            text = ""
        if SENTINEL in text:
            after = tokenizer(text.split(SENTINEL, 1)[1], add_special_tokens=False)["input_ids"]
            if after and after[0] in added.values():
                ids.add(after[0])
    return sorted(ids)
