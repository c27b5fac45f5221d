"""Tool calls in a model's reply, in each major model family's own format (docs/tools.md).

A parser is a function `text -> (content, calls, failures)`: `content` is the reply without the calls
it parsed, `calls` every call in the reply in order (`ToolCall`: name, arguments as a dict, the raw
text it came from), `failures` each place that reads as a call but does not parse (`ParseFailure`: the
raw text and why, worded to be sent back to the model). A failed call's text stays in `content`.
Parsers never raise on what a model writes.

`PARSERS` names them; `parser_for_template` picks one from the markers in a chat template, and
`get_parser` refuses a name it does not know, listing the ones it does; `call_like` says whether any of them
reads a call in a text. `check_call` checks a call against the request's tool schemas; `to_openai` writes calls
as an OpenAI `tool_calls` list.
"""

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict
    raw: str  # the text of the reply this call was parsed from


@dataclass(frozen=True)
class ParseFailure:
    raw: str
    why: str


ParseResult = tuple[str, list[ToolCall], list[ParseFailure]]
_DECODER = json.JSONDecoder()


def _call(name, args, raw: str) -> ToolCall | ParseFailure:
    """A call from a name and its arguments (an object, or JSON text of one), or why it is not one."""
    if not isinstance(name, str) or not name.strip():
        return ParseFailure(raw, "the tool call has no function name (a non-empty string)")
    if args is None:
        args = {}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError as e:
            return ParseFailure(raw, f"the arguments of the call to {name.strip()!r} are not valid JSON ({e})")
    if not isinstance(args, dict):
        return ParseFailure(raw, f"the arguments of the call to {name.strip()!r} are not a JSON object "
                                 f"(got {type(args).__name__})")
    return ToolCall(name.strip(), args, raw)


def _json_call(obj, raw: str, args_keys: tuple[str, ...] = ("arguments",)) -> ToolCall | ParseFailure:
    """A call from a decoded {"name", <args key>} object."""
    if not isinstance(obj, dict):
        return ParseFailure(raw, f"the tool call is not a JSON object with a \"name\" (got {type(obj).__name__})")
    key = next((k for k in args_keys if k in obj), args_keys[0])
    return _call(obj.get("name"), obj.get(key), raw)


def _collect(items: list[ToolCall | ParseFailure]) -> tuple[list[ToolCall], list[ParseFailure]]:
    return [c for c in items if isinstance(c, ToolCall)], [c for c in items if isinstance(c, ParseFailure)]


def _without(text: str, calls: list[ToolCall]) -> str:
    """The text with each parsed call's raw text taken out; unchanged when there were none."""
    if not calls:
        return text
    for c in calls:
        text = text.replace(c.raw, "", 1)
    return text.strip()


def _tagged(text: str, block: re.Pattern, open_tag: str, one: Callable[[str, str], ToolCall | ParseFailure]
            ) -> ParseResult:
    """Calls in closed `block`s (`one(inner, raw)` reads each), and an `open_tag` never closed as a failure."""
    items = [one(m.group(1), m.group(0)) for m in block.finditer(text)]
    rest = block.sub("", text)
    if open_tag in rest:
        raw = rest[rest.index(open_tag):]
        items.append(ParseFailure(raw, f"the tool call opened with {open_tag} is never closed"))
    calls, failures = _collect(items)
    return _without(text, calls), calls, failures


# -- hermes: Hermes 2 Pro / Qwen2.5 / Qwen3 --------------------------------------------------------------

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def _hermes_one(inner: str, raw: str) -> ToolCall | ParseFailure:
    try:
        obj = json.loads(inner)
    except ValueError as e:
        return ParseFailure(raw, f"the text inside <tool_call>...</tool_call> is not valid JSON ({e}); write "
                                 '{"name": ..., "arguments": {...}}')
    return _json_call(obj, raw)


def parse_hermes(text: str) -> ParseResult:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call."""
    return _tagged(text, _HERMES, "<tool_call>", _hermes_one)


# -- qwen3-coder: Qwen3-Coder / Qwen3.5 XML ------------------------------------------------------------

_QWEN3_CODER = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_FUNCTION = re.compile(r"^\s*<function=([^>\n]+)>(.*)</function>\s*$", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


def _xml_value(value: str):
    """A parameter's value: its text without the template's surrounding newline, as JSON where it parses
    (the template writes non-string arguments as JSON), else the text."""
    value = value.removeprefix("\n").removesuffix("\n")
    try:
        return json.loads(value)
    except ValueError:
        return value


def _qwen3_coder_one(inner: str, raw: str) -> ToolCall | ParseFailure:
    m = _FUNCTION.match(inner)
    if m is None:
        return ParseFailure(raw, "the tool call is not in the form <tool_call><function=NAME><parameter=KEY>"
                                 "value</parameter></function></tool_call>")
    args = {k.strip(): _xml_value(v) for k, v in _PARAMETER.findall(m.group(2))}
    return _call(m.group(1), args, raw)


def parse_qwen3_coder(text: str) -> ParseResult:
    """`<tool_call><function=NAME><parameter=KEY>value</parameter>...</function></tool_call>`."""
    return _tagged(text, _QWEN3_CODER, "<tool_call>", _qwen3_coder_one)


# -- llama3: Llama 3.1 / 3.2 / 3.3 JSON ----------------------------------------------------------------

_PYTHON_TAG = "<|python_tag|>"
_LLAMA_ENDS = ("<|eom_id|>", "<|eot_id|>")
_LOOKS_LIKE_CALL = re.compile(r'^\s*\{\s*"name"\s*:')


def _json_sequence(text: str) -> list[tuple[object, str]]:
    """The JSON values of `text`, separated by `;` (ValueError when it is not only that)."""
    out, i = [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        start = i
        obj, i = _DECODER.raw_decode(text, i)
        out.append((obj, text[start:i]))
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return out
        if text[i] != ";":
            raise ValueError(f"unexpected text after a JSON value at character {i}: {text[i:i + 20]!r}")
        i += 1


def parse_llama3(text: str) -> ParseResult:
    """The whole reply as `{"name": ..., "parameters": {...}}`, several separated by `;`, optionally after
    `<|python_tag|>` (the text before the tag is content). A reply that is other text has no calls."""
    body = text
    for end in _LLAMA_ENDS:
        body = body.removesuffix(end)
    prefix, tagged = "", _PYTHON_TAG in body
    if tagged:
        prefix, body = body.split(_PYTHON_TAG, 1)
    if not body.strip().startswith("{"):
        if tagged:
            return text, [], [ParseFailure(_PYTHON_TAG + body, 'the text after <|python_tag|> is not a JSON tool '
                                           'call {"name": ..., "parameters": {...}}')]
        return text, [], []
    try:
        values = _json_sequence(body)
    except ValueError as e:
        if tagged or _LOOKS_LIKE_CALL.match(body):
            return text, [], [ParseFailure(body.strip(), f"the tool call is not valid JSON ({e}); write "
                                           '{"name": ..., "parameters": {...}}, several separated by ";"')]
        return text, [], []
    if not tagged and not all(isinstance(v, dict) and "name" in v for v, _ in values):
        return text, [], []  # a JSON reply, not a call
    calls, failures = _collect([_json_call(v, raw, ("parameters", "arguments")) for v, raw in values])
    if not calls:
        return text, calls, failures
    return prefix.strip(), calls, failures


# -- mistral: [TOOL_CALLS] ----------------------------------------------------------------------------

_TOOL_CALLS = "[TOOL_CALLS]"
_NAMED = re.compile(r"\s*([^\[\]\s{]+)(?:\[CALL_ID\]([^\[\s]*))?\[ARGS\]")


def _mistral_segment(seg: str) -> tuple[list[ToolCall | ParseFailure], str]:
    """The calls of the text after one [TOOL_CALLS], and the text left after them."""
    stripped = seg.lstrip()
    if stripped.startswith(("[", "{")):  # [TOOL_CALLS] [{"name", "arguments"}, ...]
        start = len(seg) - len(stripped)
        try:
            obj, end = _DECODER.raw_decode(seg, start)
        except ValueError as e:
            return [ParseFailure(_TOOL_CALLS + seg, f"the text after [TOOL_CALLS] is not valid JSON ({e}); write "
                                 '[{"name": ..., "arguments": {...}}]')], ""
        raw = _TOOL_CALLS + seg[:end]
        return [_json_call(o, raw) for o in (obj if isinstance(obj, list) else [obj])], seg[end:]
    items, i = [], 0
    while (m := _NAMED.match(seg, i)) is not None:  # [TOOL_CALLS]NAME[ARGS]{...}, repeated
        try:
            args, end = _DECODER.raw_decode(seg, m.end())
        except ValueError as e:
            items.append(ParseFailure(_TOOL_CALLS + seg[i:], f"the arguments after [ARGS] are not valid JSON ({e})"))
            return items, ""
        items.append(_call(m.group(1), args, (_TOOL_CALLS if not items else "") + seg[i:end]))
        i = end
    if not items:
        return [ParseFailure(_TOOL_CALLS + seg, "the text after [TOOL_CALLS] is neither "
                             '[{"name": ..., "arguments": {...}}] nor NAME[ARGS]{...}')], ""
    return items, seg[i:]


def parse_mistral(text: str) -> ParseResult:
    """`[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (v3 tokenizers) or `[TOOL_CALLS]NAME[ARGS]{...}`
    (v11 and later, `[CALL_ID]id` allowed before `[ARGS]`), one [TOOL_CALLS] per call or per list."""
    if _TOOL_CALLS not in text:
        return text, [], []
    head, *segments = text.split(_TOOL_CALLS)
    items, rest = [], []
    for seg in segments:
        got, left = _mistral_segment(seg)
        items += got
        rest.append(left.strip().removesuffix("</s>"))
    calls, failures = _collect(items)
    if not calls:
        return text, calls, failures
    return " ".join(p for p in [head.strip(), *rest] if p.strip()).strip(), calls, failures


# -- deepseek-v3: DeepSeek-V3 / R1 (and V3.1's form without the type and fence) -----------------------

_DS_BEGIN, _DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_DS_CALL = re.compile(r"<｜tool▁call▁begin｜>(.*?)<｜tool▁call▁end｜>", re.S)
_DS_SEP = "<｜tool▁sep｜>"
_DS_FENCED = re.compile(r"^\s*([^\n]+?)\s*\n\s*```(?:json)?\s*\n?(.*?)\n?\s*```\s*$", re.S)


def _deepseek_one(inner: str, raw: str) -> ToolCall | ParseFailure:
    if _DS_SEP not in inner:
        return ParseFailure(raw, "the tool call has no <｜tool▁sep｜> between its type and its function")
    kind, rest = inner.split(_DS_SEP, 1)
    m = _DS_FENCED.match(rest)
    if kind.strip() == "function" and m is not None:  # V3: function<sep>NAME\n```json\n{...}\n```
        return _call(m.group(1), m.group(2), raw)
    if kind.strip() and kind.strip() != "function":  # V3.1: NAME<sep>{...}
        return _call(kind, rest, raw)
    return ParseFailure(raw, "the tool call is not in the form function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```")


def parse_deepseek_v3(text: str) -> ParseResult:
    """`<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```
    <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>`; the text before the calls is content."""
    if _DS_BEGIN not in text:
        return text, [], []
    head, region = text.split(_DS_BEGIN, 1)
    region, _, tail = region.partition(_DS_END)
    items = [_deepseek_one(m.group(1), m.group(0)) for m in _DS_CALL.finditer(region)]
    left = _DS_CALL.sub("", region)
    if "<｜tool▁call▁begin｜>" in left or not items:
        items.append(ParseFailure(_DS_BEGIN + region, "a tool call opened with <｜tool▁call▁begin｜> is never "
                                  "closed with <｜tool▁call▁end｜>"))
    calls, failures = _collect(items)
    if not calls:
        return text, calls, failures
    return " ".join(p for p in (head.strip(), tail.strip()) if p), calls, failures


PARSERS: dict[str, Callable[[str], ParseResult]] = {
    "hermes": parse_hermes,
    "qwen3-coder": parse_qwen3_coder,
    "llama3": parse_llama3,
    "mistral": parse_mistral,
    "deepseek-v3": parse_deepseek_v3,
}
DEFAULT_PARSER = "hermes"


def get_parser(name: str) -> Callable[[str], ParseResult]:
    """The parser named `name`; a ValueError naming the valid ones for any other."""
    if name not in PARSERS:
        raise ValueError(f"unknown tool-call parser {name!r}; valid: {', '.join(PARSERS)}")
    return PARSERS[name]


def parser_for_template(chat_template: str | None) -> str:
    """The parser whose format a chat template writes, from its markers; hermes when none is found."""
    t = chat_template or ""
    if "tool▁calls▁begin" in t:
        return "deepseek-v3"
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<function=" in t:  # Qwen3-Coder templates also hold <tool_call>
        return "qwen3-coder"
    if "<|python_tag|>" in t:
        return "llama3"
    if "<tool_call>" in t:
        return "hermes"
    if '"parameters"' in t and "<|start_header_id|>" in t:
        return "llama3"
    return DEFAULT_PARSER


def resolve_parser(name: str | None, chat_template: str | None) -> str:
    """`name` checked (get_parser), or the template's parser when it is None or "auto"."""
    if name in (None, "auto"):
        return parser_for_template(chat_template)
    get_parser(name)
    return name


def parse(text: str, parser: str = DEFAULT_PARSER) -> ParseResult:
    return get_parser(parser)(text)


def call_like(text: str) -> bool:
    """Whether any family's parser reads a call, or a call that fails to parse, in `text`: the model tries to
    call in some format (when the run's parser reads none, another --tool-parser may)."""
    return any(calls or failures for _, calls, failures in (p(text) for p in PARSERS.values()))


def _schemas(tools) -> dict[str, dict]:
    """{name: JSON schema of its parameters} of OpenAI tools ({"type": "function", "function": {...}})
    or bare {"name", "parameters"} entries."""
    out = {}
    for t in tools or []:
        fn = t.get("function", t) if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out[fn["name"]] = fn.get("parameters") or {}
    return out


def check_call(call, tools) -> str | None:
    """Why `call` cannot run against `tools` (a message for the model), or None when it can: no such tool, a
    required argument missing, an argument of another type than its schema's.

    `call`: a ToolCall, a ParseFailure (its reason), or an OpenAI tool call
    ({"function": {"name", "arguments": JSON text}}, or that inner object)."""
    if isinstance(call, ParseFailure):
        return call.why
    if not isinstance(call, ToolCall):
        fn = call.get("function", call) if isinstance(call, dict) else {}
        call = _call(fn.get("name") if isinstance(fn, dict) else None,
                     fn.get("arguments") if isinstance(fn, dict) else None, json.dumps(call, default=str))
        if isinstance(call, ParseFailure):
            return call.why
    schemas = _schemas(tools)
    if call.name not in schemas:
        valid = ", ".join(schemas) or "none"
        return f"there is no tool named {call.name!r}; the tools are: {valid}"
    required = schemas[call.name].get("required") or []
    missing = [k for k in required if k not in call.arguments]
    if missing:
        return f"the call to {call.name!r} lacks its required argument(s): {', '.join(missing)}"
    properties = schemas[call.name].get("properties") or {}
    wrong = [why for k, v in call.arguments.items() if (why := _type_problem(k, v, properties.get(k, {}).get("type")))]
    if wrong:
        return f"the call to {call.name!r} has argument(s) of the wrong type: {'; '.join(wrong)}"
    return None


# JSON schema types (what transformers' get_json_schema writes from type hints) and what a value must be
_JSON_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list,),
               "object": (dict,), "null": (type(None),)}
_JSON_TYPE_WORDS = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "true or false",
                    "array": "a list", "object": "an object", "null": "null"}


def _type_problem(name: str, value, json_type: str | list | None) -> str | None:
    """Why argument `name`'s `value` (parsed JSON) is not of its schema's type (or one of its types), or None: a
    bool is no number, and a string is never read as one ("3" * 4 is "3333"). A type the table lacks passes."""
    types = [json_type] if isinstance(json_type, str) else list(json_type or ())
    if not types or any(t not in _JSON_TYPES for t in types):
        return None
    ok = "boolean" in types if isinstance(value, bool) else isinstance(value, tuple(c for t in types
                                                                                    for c in _JSON_TYPES[t]))
    return None if ok else f"{name} must be {' or '.join(_JSON_TYPE_WORDS[t] for t in types)}, got {value!r}"


def to_openai(calls: list[ToolCall]) -> list[dict]:
    """[{"id": "call_...", "type": "function", "function": {"name", "arguments": JSON text}}], in order."""
    return [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
            for c in calls]
