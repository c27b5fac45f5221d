"""Rejection sampling keeps exactly the rewarded episodes, each task's identical ones once, as SFT rows."""

import json
import re

import pytest

from helpers import ScriptedPolicy
from nanorllm.config.sft import SampleConfig
from nanorllm.supervised.rejection import main, sample_rows
from nanorllm.supervised.sft_data import conversation, sft_columns

TASKS = [{"task_id": "a", "question": "What is 1 + 1?", "answer": "2"},
         {"task_id": "b", "question": "What is 2 + 2?", "answer": "4"},
         {"task_id": "c", "question": "What is 3 + 3?", "answer": "6"}]


def reply(call: int, row: int, messages: list[dict]) -> str:
    """a: always right (three identical episodes); b: always wrong; c: sample 0 right at once, the others wrong
    first and right on the retry (two identical retried episodes)."""
    question = [m["content"] for m in messages if m["content"].startswith("What is")][-1]
    task = next(t for t in TASKS if t["question"] == question)
    right = task["task_id"] == "a" or (task["task_id"] == "c" and (call == 1 or row % 3 == 0))
    return f"\\boxed{{{task['answer']}}}" if right else "\\boxed{0}"


def test_only_rewarded_episodes_are_kept_once_each_with_their_prompt_and_replies(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    cfg = SampleConfig(model="tiny-random", env="math", tasks=str(path), eval_tasks="", samples_per_task=3, out="x",
                       max_turns=2)  # no held-out set: all three tasks sampled
    rows, sampled = sample_rows(cfg, ScriptedPolicy(reply))
    assert len(sampled) == 9
    got = [(r["task_id"], [m["content"] for m in r["completion"] if m["role"] == "assistant"], r["reward"])
           for r in rows]
    assert got == [("a", ["\\boxed{2}"], 1.0), ("c", ["\\boxed{6}"], 1.0), ("c", ["\\boxed{0}", "\\boxed{6}"], 1.0)]
    retried = rows[2]["completion"]
    assert [m["role"] for m in retried] == ["assistant", "user", "assistant"]  # the env's feedback between replies
    messages, _, start = conversation(rows[0], sft_columns(None), None)
    assert messages[start - 1]["content"] == "What is 1 + 1?" and messages[start:] == rows[0]["completion"]
    assert any(m["role"] == "assistant" for m in messages[:start])  # the worked example stays prompt


def test_the_summary_line_counts_the_failed_episodes_too(tmp_path, monkeypatch, capsys):
    """Task b's scores cannot be computed (a reward function gives nan): its three episodes failed, none is kept,
    and the line says so beside the kept ones."""
    from nanorllm.policy.hf_causal import HFCausalPolicy

    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    (tmp_path / "scores.py").write_text("def no_score_for_b(completions, task_id, **kw):\n"
                                        "    return [float('nan') if t == 'b' else 0.0 for t in task_id]\n")
    monkeypatch.setattr(HFCausalPolicy, "from_name", lambda *a, **k: ScriptedPolicy(reply))
    out = tmp_path / "rows.jsonl"
    rc = main(["--model", "tiny-random", "--env", "math", "--tasks", str(tmp_path / "tasks.jsonl"), "--eval-tasks", "",
               "--samples-per-task", "3", "--max-turns", "2", "--reward", f"{tmp_path / 'scores.py'}:no_score_for_b",
               "--out", str(out)])
    assert rc == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == (
        f"[sample] kept 3 of 9 episodes (reward >= 1.0, deduplicated; 3 failed: an env error or a reward that could "
        f"not be computed) in {out}")
    assert {json.loads(line)["task_id"] for line in out.read_text().splitlines()} == {"a", "c"}


def test_the_samplers_help_offers_no_run_folder_or_process_flag(capsys):
    """It writes one file and runs in one process: no run folder, sinks, checkpoints, workers or learner ranks."""
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    flags = set(re.findall(r"^\W{0,2}(--[a-z][a-z0-9-]*)", capsys.readouterr().out, re.M))
    assert stop.value.code == 0 and {"--out", "--samples-per-task", "--min-reward", "--seed", "--devices"} <= flags
    assert flags & {"--output-dir", "--run-name", "--report-to", "--eval-every", "--save-every", "--save-model",
                    "--rollout-dump-size", "--serial", "--num-workers", "--learner-devices", "--queue-size"} == set()
