"""SFT rows: each format read, rendered as the rollouts' token streams, bad rows named all at once; the SFT loss."""

import json

import pytest
import torch

from nanorllm.datasets.errors import TaskFileError
from nanorllm.envs.calc_tool import EXAMPLE, calc
from nanorllm.envs.tools import tool_schema
from nanorllm.policy.tool_calls import parse
from nanorllm.supervised.sft import SFTLoss
from nanorllm.supervised.sft_data import load_sft_rows
from nanorllm.trainer.collate import collate_train_batch
from nanorllm.trainer.loss import token_logprobs

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
    with pytest.raises(TaskFileError, match="names no tool"):  # without --tools the call names no tool
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
    assert "tool call 'nope' names no tool (calc)" in tool and "nothing to learn" in empty
    assert "past the context (1000)" in long_row and "nor 'prompt' and 'completion'" in columns
    assert "no assistant message" in no_reply and "'tools' is text but not a JSON list" in schemas


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
    from nanorllm.run.sft import main

    rc = main(["--model", str(tmp_path / "no-such-model"), "--demos", "2", "--out", str(tmp_path / "out"),
               "--output-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"error: model: cannot load '{tmp_path / 'no-such-model'}'")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()
