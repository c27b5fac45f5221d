"""Task sources in the Hugging Face formats (parquet, CSV, JSON arrays, Arrow folders, folders of files, hf:),
with the users' own column names: files written by pandas / pyarrow / datasets themselves, never our writer."""

import json
import subprocess
import sys

import pandas as pd
import pytest

from nanorllm.datasets.tasks import TaskFileError, load_tasks
from nanorllm.envs.grader import Verdict
from nanorllm.run.lifecycle import main
from tests.procs import HANG_S, ROOT, child_env
from tests.runs import TINY_ARGS

MATH_FIELDS = {"question": "problem", "answer": "solution"}


def math_frame(n: int = 6) -> pd.DataFrame:
    """MATH-style rows (the gold is the solution's last box), a GSM8K-style one, and a column of integer ids."""
    solutions = [f"{i} and {i} make \\boxed{{{2 * i}}}" if i % 2 else f"Add them.\n#### {2 * i}" for i in range(n)]
    return pd.DataFrame({"problem": [f"What is {i} + {i}?" for i in range(n)], "solution": solutions,
                         "id": list(range(100, 100 + n)), "level": ["easy"] * n})


def test_parquet_with_other_column_names_gives_tasks_with_boxed_and_hash_golds_and_stable_ids(tmp_path):
    path = tmp_path / "math.parquet"
    math_frame(4).to_parquet(path)
    tasks = load_tasks(str(path), fields=MATH_FIELDS)
    assert [(t["task_id"], t["question"], t["answer"]) for t in tasks] == [
        ("math-00000", "What is 0 + 0?", "0"), ("math-00001", "What is 1 + 1?", "2"),
        ("math-00002", "What is 2 + 2?", "4"), ("math-00003", "What is 3 + 3?", "6")]
    assert tasks[1]["level"] == "easy" and tasks[1]["solution"].endswith("\\boxed{2}")  # own columns kept
    assert load_tasks(str(path), fields=MATH_FIELDS) == tasks  # the same ids every time
    with_ids = load_tasks(str(path), fields={**MATH_FIELDS, "task_id": "id"}, limit=2)
    assert [t["task_id"] for t in with_ids] == ["100", "101"]


def test_csv_json_array_arrow_folder_and_folder_of_parquet_files_load_the_same_tasks(tmp_path):
    import datasets

    frame = math_frame(6)
    frame.to_csv(tmp_path / "m.csv", index=False)
    (tmp_path / "m.json").write_text(json.dumps(frame.to_dict(orient="records")))
    datasets.Dataset.from_pandas(frame).save_to_disk(str(tmp_path / "arrow"))
    (tmp_path / "parts").mkdir()
    frame.iloc[:3].to_parquet(tmp_path / "parts" / "a.parquet")
    frame.iloc[3:].to_parquet(tmp_path / "parts" / "b.parquet")
    fields = {**MATH_FIELDS, "task_id": "id"}
    expected = [(str(100 + i), f"What is {i} + {i}?", str(2 * i)) for i in range(6)]
    datasets.DatasetDict({"train": datasets.Dataset.from_pandas(frame.iloc[:1]),
                          "test": datasets.Dataset.from_pandas(frame)}).save_to_disk(str(tmp_path / "splits"))
    assert len(load_tasks(str(tmp_path / "splits"), fields=fields)) == 1  # the train split by default
    for spec in ["m.csv", "m.json", "arrow", "parts", "splits@test"]:
        tasks = load_tasks(str(tmp_path / spec), fields=fields)
        assert [(t["task_id"], t["question"], t["answer"]) for t in tasks] == expected, spec


def test_a_missing_or_mistyped_column_names_the_file_the_column_and_the_columns_there(tmp_path):
    path = tmp_path / "m.parquet"
    math_frame(2).to_parquet(path)
    with pytest.raises(TaskFileError) as info:
        load_tasks(str(path), fields={"question": "prompt", "answer": "level", "task_id": "level"})
    assert info.value.problems[0] == (f"{path}: column 'prompt' (--task-fields question=prompt) not found "
                                      "(columns: problem, solution, id, level)")
    with pytest.raises(TaskFileError) as info:
        load_tasks(str(path), fields={"question": "id", "answer": "solution"})
    assert info.value.problems == [f"{path}: column 'id' (--task-fields question=id) holds int64, expected text "
                                   "(columns: problem, solution, id, level)"]


def test_an_empty_parquet_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "empty.parquet"
    pd.DataFrame({"question": pd.Series([], dtype=str), "answer": pd.Series([], dtype=str)}).to_parquet(path)
    with pytest.raises(TaskFileError) as info:
        load_tasks(str(path))
    assert info.value.problems == [f"{path}: no tasks (the source has no rows)"]


def test_bad_rows_of_a_parquet_file_are_all_reported_by_row(tmp_path):
    path = tmp_path / "m.parquet"
    pd.DataFrame({"question": ["ok?", " ", "three?"], "answer": ["1", "2", "\\boxed{}"]}).to_parquet(path)
    with pytest.raises(TaskFileError) as info:
        load_tasks(str(path))
    assert info.value.problems == [f"{path}: row 1: column 'question' is empty",
                                   f"{path}: row 2: column 'answer' has an empty \\boxed{{}}"]


def test_jsonl_with_mapped_columns_keeps_its_per_line_errors(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([json.dumps({"prompt": "1+1?", "ground_truth": 2}),
                               json.dumps({"prompt": "", "ground_truth": "3"}),
                               json.dumps({"prompt": "2+2?", "ground_truth": "so \\boxed{4}"})]) + "\n")
    fields = {"question": "prompt", "answer": "ground_truth"}
    path.write_text(path.read_text() + json.dumps({"ground_truth": "5"}) + "\n")
    with pytest.raises(TaskFileError) as info:
        load_tasks(str(path), fields=fields)
    assert info.value.problems == [f"{path}:2: field 'prompt' is empty", f"{path}:4: field 'prompt' is missing"]
    path.write_text("\n".join(path.read_text().splitlines()[::2]) + "\n")
    assert [(t["task_id"], t["answer"]) for t in load_tasks(str(path), fields=fields)] == [("t-00001", "2"),
                                                                                           ("t-00002", "4")]


def test_a_hub_dataset_without_a_reachable_hub_says_so(tmp_path, monkeypatch):
    import datasets
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    # the libraries read these once, when first imported (here, by an earlier test): without their own
    # copies set too, the load goes to the network and retries for ~25 s before it fails
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(TaskFileError) as info:
        load_tasks("hf:nobody/no-such-set:main@test")
    assert "hf:nobody/no-such-set:main@test: cannot load 'nobody/no-such-set': the Hugging Face hub is not " \
           "reachable from this machine (HF_HUB_OFFLINE is set)" in info.value.problems[0]


@pytest.mark.slow
def test_jsonl_and_arith_load_without_datasets_installed_and_parquet_says_what_is_missing(tmp_path):
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text(json.dumps({"task_id": "a", "question": "1+1?", "answer": "2"}) + "\n")
    math_frame(2).to_parquet(tmp_path / "m.parquet")
    code = (f"import sys; sys.modules['datasets'] = None; sys.modules['pyarrow'] = None\n"
            f"from nanorllm.datasets.tasks import load_tasks, TaskFileError\n"
            f"print(len(load_tasks({str(jsonl)!r})), len(load_tasks('arith:count=5')))\n"
            f"try: load_tasks({str(tmp_path / 'm.parquet')!r})\n"
            f"except TaskFileError as e: print(e.problems[0])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=HANG_S)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert first == "1 5"
    assert second.startswith(f"{tmp_path / 'm.parquet'}: reading this source needs the 'datasets' package")


@pytest.mark.parametrize("flags, expected", [
    (["--task-fields", "question=problem,prompt=x"], "task_fields: unknown key 'prompt' in 'prompt=x' "
                                                      "(keys: question, answer, task_id)"),
    (["--task-fields", "question=nope,answer=solution"], "column 'nope' (--task-fields question=nope) not found "
                                                          "(columns: problem, solution, id, level)"),
    (["--limit", "1", "--eval-tasks", "{path}", "--task-fields", "question=problem,answer=solution"],
     "no training tasks left after removing the 1 that are also held out"),
])
def test_bad_task_input_is_refused_at_start_with_exit_2_and_nothing_written(tmp_path, capsys, flags, expected):
    path = tmp_path / "m.parquet"
    math_frame(3).to_parquet(path)
    flags = [f.replace("{path}", str(path)) for f in flags]
    out = tmp_path / "out"
    rc = main([*TINY_ARGS, "--serial", "--tasks", str(path), "--eval-tasks", "", *flags, "--output-dir", str(out)])
    assert rc == 2
    assert expected in capsys.readouterr().err
    assert not out.exists()


@pytest.fixture
def length_rule_grader(monkeypatch):
    import nanorllm.envs.math_env as math_env
    monkeypatch.setattr(math_env, "judge", lambda response, gold, **kw: Verdict(sum(map(ord, response)) % 2 == 0, "x"))


@pytest.mark.slow
def test_two_training_steps_on_a_parquet_file_with_its_own_columns_and_a_resume(tmp_path, length_rule_grader):
    path = tmp_path / "math.parquet"
    math_frame(12).to_parquet(path)
    args = [*TINY_ARGS, "--serial", "--lr", "1e-3", "--no-drop-zero-std-groups", "--tasks", str(path),
            "--task-fields", "question=problem,answer=solution,task_id=id", "--eval-tasks", "",
            "--output-dir", str(tmp_path), "--run-name", "pq"]
    assert main([*args, "--max-steps", "2", "--save-every", "1"]) == 0
    run = tmp_path / "pq"
    state = json.loads((run / "checkpoints" / "step_2" / "trainer_state.json").read_text())
    assert state["step"] == 2 and state["task_order"]["tasks"]["n"] == 12
    dump = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert {d["task_id"] for d in dump} <= {str(i) for i in range(100, 112)} and len(dump) == 2 * 4 * 2  # steps x tasks x samples
    assert main(["--resume", str(run), "--max-steps", "3"]) == 0  # same source, same fingerprint
    assert json.loads((run / "checkpoints" / "step_3" / "trainer_state.json").read_text())["step"] == 3
