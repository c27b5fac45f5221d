"""SFT rows: each format read, rendered as the rollouts' token streams, bad rows named all at once (tool calls by
RL's own check, rows that crashed the renderer, rows far past the context before they are tokenized); the SFT
loss."""

import json

import pytest
import torch

from nanorllm.datasets.errors import TaskFileError
from nanorllm.envs.calc_tool import EXAMPLE, calc
from nanorllm.envs.tools import tool_schema
from nanorllm.policy.tool_calls import parse
from nanorllm.supervised import sft_data
from nanorllm.supervised.sft_data import load_sft_rows
from nanorllm.trainer.collate import collate_train_batch
from nanorllm.trainer.loss import SFTLoss, token_logprobs

SCHEMA = tool_schema("calc_tool.py:calc", calc)
TOOL_ROW = {"messages": [{"role": "system", "content": "Use the tool."}, *EXAMPLE], "tools": [SCHEMA]}


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def load(policy, spec, **kw):
    return load_sft_rows(spec, policy.tokenizer, policy.eos_ids, max_tokens=kw.pop("max_tokens", 4096), **kw)


def text(policy, ids) -> str:
    return policy.tokenizer.decode(ids)


def test_a_tool_conversation_renders_as_the_rollout_that_would_sample_it(tiny_policy, tmp_path):
    """Each assistant turn is one sample: its prompt is the policy's own first or continued prompt, its reply
    the tokens the policy would sample (through the end-of-turn token), which the RL parser reads back."""
    (row,) = load(tiny_policy, write_jsonl(tmp_path / "t.jsonl", [TOOL_ROW]))
    call, answer = row
    messages, tools = TOOL_ROW["messages"], [SCHEMA]
    assert call.prompt_ids == tiny_policy.first_prompt_ids(messages[:2], tools)
    assert answer.prompt_ids == tiny_policy.next_prompt_ids(call.prompt_ids, call.response_ids, messages[3], tools)
    assert call.response_ids[-1] in tiny_policy.eos_ids and answer.response_ids[-1] in tiny_policy.eos_ids
    _, calls, failures = parse(text(tiny_policy, call.response_ids[:-1]))
    assert [(c.name, c.arguments) for c in calls] == [("calc", {"expression": "12 * 34 + 5"})] and not failures
    assert text(tiny_policy, answer.response_ids[:-1]) == "The answer is \\boxed{413}."
    batch = collate_train_batch(row, pad_id=tiny_policy.pad_id)
    assert int(batch["loss_mask"].sum()) == len(call.response_ids) + len(answer.response_ids)  # assistant tokens only


def test_prompt_completion_rows_plain_and_conversational_render_alike(tiny_policy, tmp_path):
    rows = [{"prompt": "2 + 2?", "completion": "\\boxed{4}"},
            {"prompt": [{"role": "user", "content": "2 + 2?"}],
             "completion": [{"role": "assistant", "content": "\\boxed{4}"}]},
            {"messages": [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "\\boxed{4}"}]}]
    plain, chat, messages = load(tiny_policy, write_jsonl(tmp_path / "p.jsonl", rows))
    assert plain[0].prompt_ids == chat[0].prompt_ids == messages[0].prompt_ids
    assert plain[0].response_ids == chat[0].response_ids == messages[0].response_ids


def test_task_fields_map_columns_and_tools_come_from_the_flag_where_a_row_has_none(tiny_policy, tmp_path):
    row = {"conversation": TOOL_ROW["messages"]}
    spec = write_jsonl(tmp_path / "m.jsonl", [row])
    (mapped,) = load(tiny_policy, spec, task_fields="messages=conversation", tools=[SCHEMA])
    (direct,) = load(tiny_policy, write_jsonl(tmp_path / "d.jsonl", [TOOL_ROW]))
    assert [s.prompt_ids for s in mapped] == [s.prompt_ids for s in direct]
    with pytest.raises(TaskFileError, match="no tool named 'calc'"):  # without --tools the call names no tool
        load(tiny_policy, spec, task_fields="messages=conversation")


def test_a_parquet_file_reads_like_the_jsonl(tiny_policy, tmp_path):
    pytest.importorskip("datasets")
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": "2 + 2?", "completion": "\\boxed{4}"}, {"prompt": "3 + 3?", "completion": "\\boxed{6}"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
    from_parquet = load(tiny_policy, str(tmp_path / "rows.parquet"))
    from_jsonl = load(tiny_policy, write_jsonl(tmp_path / "rows.jsonl", rows))
    assert [r[0].response_ids for r in from_parquet] == [r[0].response_ids for r in from_jsonl]


def test_every_bad_row_is_named_by_file_and_line_at_once(tiny_policy, tmp_path):
    long = "many words " * 200
    rows = [TOOL_ROW,
            {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "",
                          "tool_calls": [{"type": "function", "function": {"name": "nope", "arguments": {}}}]}],
             "tools": [SCHEMA]},
            {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "  "}]},
            {"prompt": long, "completion": "ok"},
            {"prompt": "only a prompt"},
            {"messages": [{"role": "user", "content": "no reply"}]},
            {**TOOL_ROW, "tools": "[not json"}]
    spec = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(TaskFileError) as e:
        load(tiny_policy, spec, max_tokens=1000)
    assert [p.split(": ")[0] for p in e.value.problems] == [f"{spec}:{n}" for n in (2, 3, 4, 5, 6, 7)]
    tool, empty, long_row, columns, no_reply, schemas = e.value.problems
    assert "tool call 0: there is no tool named 'nope'; the tools are: calc" in tool and "nothing to learn" in empty
    assert "past the context (1000)" in long_row and "nor 'prompt' and 'completion'" in columns
    assert "no assistant message" in no_reply and "'tools' is text but not a JSON list" in schemas


def with_call(function) -> dict:
    """TOOL_ROW whose assistant call has `function` as its function."""
    call = {**TOOL_ROW["messages"][2], "tool_calls": [{"type": "function", "function": function}]}
    return {**TOOL_ROW, "messages": [*TOOL_ROW["messages"][:2], call, *TOOL_ROW["messages"][3:]]}


def problems_of(policy, tmp_path, rows, **kw) -> list[str]:
    """Each bad row's problems, checked to be named by file and line in order."""
    spec = write_jsonl(tmp_path / "rows.jsonl", rows)
    with pytest.raises(TaskFileError) as e:
        load(policy, spec, **kw)
    assert [p.split(": ")[0] for p in e.value.problems] == [f"{spec}:{n}" for n in range(1, len(rows) + 1)]
    return [p.split(": ", 1)[1] for p in e.value.problems]


def test_a_tool_call_that_rls_own_check_refuses_is_named_by_file_and_line(tiny_policy, tmp_path):
    """SFT checks a call with the function RL's tool env checks it with (`check_call`), so it never teaches a call
    the rollout would score as a parse failure or a wrong call."""
    unnamed = {**SCHEMA, "function": {**SCHEMA["function"], "name": 3}}
    not_json, wrong_type, no_name, list_args = problems_of(tiny_policy, tmp_path, [
        with_call({"name": "calc", "arguments": '{"expression": '}),
        with_call({"name": "calc", "arguments": {"expression": 3}}),
        {**TOOL_ROW, "tools": [unnamed]},
        with_call({"name": "calc", "arguments": "[1, 2]"})])
    assert not_json.startswith("message 2 (assistant): tool call 0: the arguments of the call to 'calc' are not valid "
                               "JSON")
    assert "tool call 0: the call to 'calc' has argument(s) of the wrong type: expression must be a string, got 3" \
        in wrong_type
    assert no_name.startswith("tool schema 0: its name must be text, got 3") and "no tool named 'calc'" in no_name
    assert "tool call 0: the arguments of the call to 'calc' are not a JSON object (got list)" in list_args


def test_rows_that_crashed_the_renderer_are_named_by_file_and_line(tiny_policy, tmp_path):
    user_null = {"messages": [{"role": "user", "content": None}, {"role": "assistant", "content": "4"}]}
    tool_null = {**TOOL_ROW, "messages": [*TOOL_ROW["messages"][:3], {"role": "tool", "name": "calc"},
                                          TOOL_ROW["messages"][4]]}
    as_dict = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": {"text": "4"}}]}
    calls_text = {**TOOL_ROW, "messages": [*TOOL_ROW["messages"][:2], {**TOOL_ROW["messages"][2], "tool_calls": "x"}]}
    found = problems_of(tiny_policy, tmp_path, [
        user_null, tool_null, with_call("calc"), {**TOOL_ROW, "tools": [{"type": "function", "function": "calc"}]},
        as_dict, calls_text, {**TOOL_ROW, "tools": [{**SCHEMA, "function": {**SCHEMA["function"], "parameters": 1}}]}])
    assert found == [
        "message 0 (user): content must be text, got none (null)",
        "message 3 (tool): content must be text, got none (null)",
        'message 2 (assistant): tool call 0: must be {"type": "function", "function": {"name", "arguments"}}, got '
        '{"type": "function", "function": "calc"}',
        "tool schema 0: 'function' must be an object {name, parameters}, got str; message 2 (assistant): tool call 0: "
        "there is no tool named 'calc'; the tools are: none",
        "message 1 (assistant): content must be text, got dict",
        "message 2 (assistant): tool_calls must be a list of calls, got str",
        "tool schema 0: (calc) its parameters must be a JSON schema object; message 2 (assistant): tool call 0: there "
        "is no tool named 'calc'; the tools are: none"]


def test_a_row_far_past_the_context_is_refused_before_it_is_tokenized(tiny_policy, tmp_path, monkeypatch):
    """12 characters are the most a byte-tokenizer token stands for (its special tokens): 12 x 100 + 12 characters
    are past 100 tokens whatever they are (the reply's two count too); 101 characters are decided by their tokens."""
    assert sft_data.longest_token(tiny_policy.tokenizer) == 12
    far = {"prompt": "x" * 1212, "completion": "ok"}
    text = {"text": "y" * 1212}
    with monkeypatch.context() as m:
        m.setattr(sft_data, "render_turns", lambda *a, **k: pytest.fail("the row was rendered"))
        m.setattr(sft_data, "every_token", lambda *a, **k: pytest.fail("the row was tokenized"))
        conversation, lm = problems_of(tiny_policy, tmp_path, [far, text], max_tokens=100)
    assert conversation == "the conversation is at least 101 tokens (1214 characters, at most 12 a token), past the " \
                           "context (100)"
    assert lm == "the text is at least 101 tokens (1212 characters, at most 12 a token), past the context (100)"
    (near,) = problems_of(tiny_policy, tmp_path, [{"prompt": "x" * 101, "completion": "ok"}], max_tokens=100)
    assert near.startswith("the conversation is ") and "at least" not in near


def test_no_text_takes_fewer_tokens_than_the_floor_the_length_check_uses(tiny_policy):
    """The bound the early refusal stands on: each token stands for at most `longest_token` characters, whatever
    the text (multi-byte characters, special tokens written in it, runs of one character)."""
    tok = tiny_policy.tokenizer
    longest = sft_data.longest_token(tok)
    texts = ["x" * 500, "héllo wörld " * 30, "数学" * 100, "<|im_end|><|im_start|>" * 20, "🙂 a" * 50, ""]
    assert all(len(tok(t, add_special_tokens=False)["input_ids"]) >= len(t) // longest for t in texts)


def test_language_modelling_text_rows_train_every_token(tiny_policy, tmp_path):
    """TRL's {"text": ...} rows: the text's tokens and an end-of-text token, every token after the first trained;
    --task-fields maps the column; an empty or non-text text is named."""
    (row,) = load(tiny_policy, write_jsonl(tmp_path / "t.jsonl", [{"text": "The sum is 4."}]))
    ids = tiny_policy.tokenizer("The sum is 4.")["input_ids"] + tiny_policy.eos_ids[:1]
    assert len(row) == 1 and row[0].prompt_ids + row[0].response_ids == ids and row[0].prompt_ids == ids[:1]
    assert int(collate_train_batch(row, pad_id=tiny_policy.pad_id)["loss_mask"].sum()) == len(ids) - 1
    spec = write_jsonl(tmp_path / "m.jsonl", [{"body": "The sum is 4."}])
    (mapped,) = load(tiny_policy, spec, task_fields="text=body")
    assert mapped[0].response_ids == row[0].response_ids
    assert problems_of(tiny_policy, tmp_path, [{"text": " "}, {"text": 4}]) == [
        "nothing to learn (empty text)", "the text must be text, got int"]


def test_the_whole_conversation_mode_trains_every_token_after_the_first(tiny_policy, tmp_path):
    spec = write_jsonl(tmp_path / "t.jsonl", [TOOL_ROW])
    (turns,) = load(tiny_policy, spec)
    (whole,) = load(tiny_policy, spec, whole=True)
    ids = turns[-1].prompt_ids + turns[-1].response_ids
    assert len(whole) == 1 and whole[0].prompt_ids + whole[0].response_ids == ids and len(whole[0].prompt_ids) == 1


def test_the_sft_loss_is_the_mean_negative_log_likelihood_of_the_trained_tokens(tiny_policy, tmp_path):
    (row,) = load(tiny_policy, write_jsonl(tmp_path / "t.jsonl", [TOOL_ROW]))
    batch = collate_train_batch(row, pad_id=tiny_policy.pad_id)
    n = int(batch["loss_mask"].sum())
    with torch.no_grad():
        loss, metrics = SFTLoss()(tiny_policy, batch, row, SFTLoss().normalizer({"tokens": n}))
        out = tiny_policy.forward(batch["input_ids"], batch["attention_mask"], batch["positions"])
    direct = -token_logprobs(out.logits, batch["targets"])[0].mean()
    assert float(loss) == pytest.approx(float(direct), rel=1e-6) and float(metrics["tokens"]) == n


def test_a_model_that_does_not_load_is_one_line_exit_2_and_no_run_folder(tmp_path, capsys):
    from nanorllm.run.sft_program import main

    rc = main(["--model", str(tmp_path / "no-such-model"), "--demos", "2", "--out", str(tmp_path / "out"),
               "--output-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == [f"error: model: cannot load '{tmp_path / 'no-such-model'}': no such file or folder (nor "
                               "is it a hub repo id)"]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()
