"""policy/tool_calls.py: each family's tool-call format parsed by its own parser and by no other."""

import json

import pytest

from nanorllm.policy.tool_calls import (PARSERS, ParseFailure, ToolCall, call_like, check_call, get_parser, parse,
                                         parser_for_template, resolve_parser, to_openai)

DS_B, DS_E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CB, DS_CE, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def _ds(name: str, args: str) -> str:
    return f"{DS_CB}function{DS_SEP}{name}\n```json\n{args}\n```{DS_CE}"


def _xml(name: str, **params) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


WEATHER = ("get_weather", {"city": "Paris", "unit": "celsius"})
TIME = ("get_time", {"tz": "Europe/Paris"})

# family -> [(reply as the family's template writes it, expected content, expected [(name, arguments)])]
FIXTURES = {
    "hermes": [
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
         "", [WEATHER]),
        ('I will check both.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
         '"celsius"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "Europe/Paris"}}\n'
         "</tool_call>", "I will check both.", [WEATHER, TIME]),
    ],
    "qwen3-coder": [
        (_xml("get_weather", city="Paris", unit="celsius"), "", [WEATHER]),
        ("I will check both.\n" + _xml("get_weather", city="Paris", unit="celsius") + "\n"
         + _xml("get_time", tz="Europe/Paris"), "I will check both.", [WEATHER, TIME]),
    ],
    "llama3": [
        ('{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}', "", [WEATHER]),
        ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; '
         '{"name": "get_time", "parameters": {"tz": "Europe/Paris"}}<|eom_id|>', "", [WEATHER, TIME]),
        ('I will check.<|python_tag|>{"name": "get_time", "parameters": {"tz": "Europe/Paris"}}',
         "I will check.", [TIME]),
    ],
    "mistral": [
        ('[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]', "",
         [WEATHER]),
        ('I will check both.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
         '"celsius"}}, {"name": "get_time", "arguments": {"tz": "Europe/Paris"}}]</s>', "I will check both.",
         [WEATHER, TIME]),
        ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}', "", [WEATHER]),
        ('I will check both.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}'
         '[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{"tz": "Europe/Paris"}', "I will check both.",
         [WEATHER, TIME]),
    ],
    "deepseek-v3": [
        (DS_B + _ds("get_weather", '{"city": "Paris", "unit": "celsius"}') + DS_E, "", [WEATHER]),
        ("I will check both." + DS_B + _ds("get_weather", '{"city": "Paris", "unit": "celsius"}') + "\n"
         + _ds("get_time", '{"tz": "Europe/Paris"}') + DS_E, "I will check both.", [WEATHER, TIME]),
        (f'{DS_B}{DS_CB}get_time{DS_SEP}{{"tz": "Europe/Paris"}}{DS_CE}{DS_E}', "", [TIME]),  # V3.1's form
    ],
}
CASES = [(fam, *case) for fam, cases in FIXTURES.items() for case in cases]


def test_every_family_has_a_parser_and_fixtures():
    assert set(FIXTURES) == set(PARSERS)


@pytest.mark.parametrize("family,text,content,expected", CASES)
def test_each_parser_reads_its_own_familys_calls_in_order(family, text, content, expected):
    got_content, calls, failures = parse(text, family)
    assert [(c.name, c.arguments) for c in calls] == expected
    assert got_content == content and failures == []
    assert all(isinstance(c, ToolCall) and c.raw in text for c in calls)


@pytest.mark.parametrize("parser", list(PARSERS))
@pytest.mark.parametrize("family,text,content,expected", CASES)
def test_no_parser_finds_calls_in_another_familys_format(parser, family, text, content, expected):
    if parser == family:
        return
    got_content, calls, _ = parse(text, parser)
    assert calls == [] and got_content == text


@pytest.mark.parametrize("parser", list(PARSERS))
def test_plain_text_has_no_calls_and_no_failures(parser):
    for text in ["The answer is 4.", '{"answer": 4}', "", "use a <tag> here"]:
        assert parse(text, parser) == (text, [], [])


BROKEN = {  # a call each family's parser reads as a call that does not parse
    "hermes": ['<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>',
               '<tool_call>{"arguments": {}}</tool_call>',
               '<tool_call>{"name": "get_weather", "arguments": [1, 2]}</tool_call>',
               '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}'],
    "qwen3-coder": ["<tool_call>\n<parameter=city>Paris</parameter>\n</tool_call>",
                    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"],
    "llama3": ['{"name": "get_weather", "parameters": {"city": "Paris"',
               '<|python_tag|>{"name": "get_weather", "parameters": "Paris"}',
               "<|python_tag|>brave_search.call(query='x')"],
    "mistral": ['[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": ]', "[TOOL_CALLS]get_weather[ARGS]{oops",
                "[TOOL_CALLS] nothing here"],
    "deepseek-v3": [DS_B + _ds("get_weather", '{"city": ') + DS_E,
                    DS_B + DS_CB + "function" + DS_SEP + "get_weather\n```json\n{}"],
}


@pytest.mark.parametrize("family,text", [(f, t) for f, ts in BROKEN.items() for t in ts])
def test_a_broken_call_is_a_failure_with_a_reason_and_stays_in_the_content(family, text):
    content, calls, failures = parse(text, family)
    assert calls == [] and content == text
    assert len(failures) == 1 and isinstance(failures[0], ParseFailure)
    assert failures[0].why and failures[0].raw and failures[0].raw.strip() in text


def test_a_broken_call_beside_a_good_one_keeps_the_good_one():
    text = ('<tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}</tool_call>'
            '<tool_call>{"name": oops}</tool_call>')
    content, calls, failures = parse(text, "hermes")
    assert [c.name for c in calls] == ["get_time"] and len(failures) == 1
    assert content == '<tool_call>{"name": oops}</tool_call>'
    assert "not valid JSON" in failures[0].why


def test_arguments_given_as_json_text_are_decoded():
    _, calls, _ = parse('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>', "hermes")
    assert calls[0].arguments == {"x": 1}


TEMPLATES = {
    "hermes": "{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>\n<tool_call>\n"
              '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>',
    "qwen3-coder": "<tools>{% for tool in tools %}<function>{{ tool.name }}</function>{% endfor %}"
                   "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>",
    "llama3": "<|start_header_id|>ipython<|end_header_id|>{%- if builtin_tools %}<|python_tag|>{% endif %}",
    "mistral": "{%- if message.tool_calls %}[TOOL_CALLS][{% for tc in message.tool_calls %}{% endfor %}]",
    "deepseek-v3": "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + "
                   "'<｜tool▁sep｜>' + tool['function']['name']}}",
}


@pytest.mark.parametrize("family", list(TEMPLATES))
def test_the_parser_is_chosen_from_the_chat_templates_markers(family):
    assert parser_for_template(TEMPLATES[family]) == family


def test_a_llama_template_without_the_python_tag_is_read_by_its_parameters_format():
    t = ('<|start_header_id|>user<|end_header_id|>Respond in the format {"name": function name, '
         '"parameters": dictionary of argument name and its value}.<|eot_id|>')
    assert parser_for_template(t) == "llama3"


@pytest.mark.parametrize("template", [None, "", "{{ messages[0]['content'] }}"])
def test_a_template_with_no_known_marker_gets_hermes(template):
    assert parser_for_template(template) == "hermes"


def test_an_unknown_parser_name_is_refused_naming_the_valid_ones():
    with pytest.raises(ValueError) as e:
        get_parser("gpt4")
    assert all(name in str(e.value) for name in PARSERS)
    with pytest.raises(ValueError):
        resolve_parser("nope", TEMPLATES["mistral"])
    assert resolve_parser(None, TEMPLATES["mistral"]) == "mistral"
    assert resolve_parser("auto", TEMPLATES["llama3"]) == "llama3"
    assert resolve_parser("qwen3-coder", TEMPLATES["mistral"]) == "qwen3-coder"


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {}, "unit": {}},
                                          "required": ["city"]}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]


def test_check_call_passes_a_good_call_and_names_what_is_wrong_with_a_bad_one():
    assert check_call(ToolCall("get_weather", {"city": "Paris"}, ""), TOOLS) is None
    assert check_call(ToolCall("get_time", {}, ""), TOOLS) is None
    unknown = check_call(ToolCall("get_news", {}, ""), TOOLS)
    assert "get_news" in unknown and "get_weather" in unknown and "get_time" in unknown
    missing = check_call(ToolCall("get_weather", {"unit": "celsius"}, ""), TOOLS)
    assert "city" in missing and "required" in missing
    assert "not valid JSON" in check_call({"function": {"name": "get_weather", "arguments": "{city"}}, TOOLS)
    assert "not a JSON object" in check_call({"function": {"name": "get_weather", "arguments": "[1]"}}, TOOLS)
    assert check_call({"function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}, TOOLS) is None
    assert check_call({"name": "get_time", "arguments": "{}"}, TOOLS) is None
    assert check_call(ParseFailure("x", "why it failed"), TOOLS) == "why it failed"
    assert "no function name" in check_call({"function": {"arguments": "{}"}}, TOOLS)
    assert "no tool named" in check_call(ToolCall("f", {}, ""), None)


def test_to_openai_writes_the_openai_tool_calls_shape_in_order():
    out = to_openai([ToolCall(*WEATHER, raw=""), ToolCall(*TIME, raw="")])
    assert [set(c) for c in out] == [{"id", "type", "function"}] * 2
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in out)
    assert len({c["id"] for c in out}) == 2
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in out] == [WEATHER, TIME]
    assert to_openai([]) == []


@pytest.mark.parametrize("family", list(TEMPLATES))
def test_the_agent_endpoint_reads_calls_in_the_format_of_its_policys_template(family):
    from types import SimpleNamespace

    from nanorllm.rollout.agent_runner import AgentRunner, tool_call_errors

    policy = SimpleNamespace(tokenizer=SimpleNamespace(chat_template=TEMPLATES[family]))
    runner = AgentRunner(SimpleNamespace(policy=policy, max_turns=2), None, shared_prefix=None, min_shared=0)
    assert runner.tool_parser == family
    text, content, expected = FIXTURES[family][1]
    got_content, calls, errors = tool_call_errors(text, runner.tool_parser, TOOLS)
    assert got_content == content and errors == []
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == expected


def test_the_endpoint_records_why_a_call_cannot_run():
    from nanorllm.rollout.agent_runner import tool_call_errors

    text = ('<tool_call>{"name": "get_weather", "arguments": {"unit": "celsius"}}</tool_call>'
            '<tool_call>{"name": "get_news", "arguments": {}}</tool_call><tool_call>{oops}</tool_call>')
    _, calls, errors = tool_call_errors(text, "hermes", TOOLS)
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_news"]
    assert len(errors) == 3 and "not valid JSON" in errors[0]
    assert "city" in errors[1] and "get_news" in errors[2]


def test_tool_parser_flag_offers_auto_and_every_parser_and_refuses_another_listing_them():
    from typing import get_args, get_type_hints

    from nanorllm.config import ConfigError, parse_config
    from nanorllm.config.fields import Sources
    from nanorllm.config.specs import env_spec

    assert get_args(get_type_hints(Sources)["tool_parser"]) == ("auto", *PARSERS)
    assert parse_config([]).tool_parser == "auto"
    assert env_spec(parse_config(["--tool-parser", "llama3"])).tool_parser == "llama3"
    with pytest.raises(ConfigError) as e:
        parse_config(["--tool-parser", "gpt4"])
    assert "tool_parser" in str(e.value) and all(name in str(e.value) for name in PARSERS)


def test_a_named_tool_parser_overrides_the_templates(tmp_path):
    from types import SimpleNamespace

    from nanorllm.envs.registry import EnvSpec, load_bundle
    from nanorllm.rollout.agent_runner import AgentRunner

    path = tmp_path / "agent.py"
    path.write_text("def solve(task, client):\n    return 0.0\n")
    policy = SimpleNamespace(tokenizer=SimpleNamespace(chat_template=TEMPLATES["hermes"]))
    engine = SimpleNamespace(policy=policy, max_turns=2)
    for name, want in [("auto", "hermes"), ("mistral", "mistral")]:
        bundle = load_bundle(EnvSpec(agent=f"{path}:solve", tool_parser=name))
        assert AgentRunner(engine, bundle, shared_prefix=None, min_shared=0).tool_parser == want


def test_a_call_in_any_familys_format_or_a_broken_one_is_call_like_and_plain_text_or_json_is_not():
    written = [reply for cases in FIXTURES.values() for reply, _, calls in cases if calls]
    broken = ['<tool_call>{"name": "calc", "arguments": ', "[TOOL_CALLS]calc[ARGS]{", '{"name": "calc", "arguments": ']
    assert all(map(call_like, written + broken))
    assert not any(map(call_like, ["The answer is \\boxed{4}.", '{"answer": 4}', "", "I would call calc here."]))
