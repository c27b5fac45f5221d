"""What a program writes where the user says (--out): a user's folder or file is never deleted or replaced without
--overwrite, the check runs before anything loads, and a replaced output stays whole until its successor is."""

import json
import os
import sys
from pathlib import Path

import pytest

from nanorllm.config import TrainConfig
from nanorllm.run.warm_start import prompt_shape_warning
from nanorllm.utils.files import exchange, write_folder_atomic
from nanorllm.utils.outputs import OutputPath, output_problems
from test_sft import write_jsonl
from tests import forked

ROOT = Path(__file__).resolve().parents[1]
ROWS = [{"prompt": f"What is {i} + {i}?", "completion": f"\\boxed{{{2 * i}}}"} for i in range(4)]


def folder(tmp_path: Path, *files: str) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    for name in files:
        (out / name).write_text("mine")
    return out


def test_a_folder_of_the_users_files_is_refused_unless_overwrite(tmp_path):
    out = OutputPath(str(folder(tmp_path, "notes.txt")), "folder", marker="sft.json")
    assert output_problems(out) == [f"out: {out.path!r} is a folder of other files (no sft.json): give a new or "
                                    "empty folder, or --overwrite to replace it"]
    assert output_problems(out, overwrite=True) == []


def test_a_new_path_an_empty_folder_and_the_programs_own_folder_are_written(tmp_path):
    assert output_problems(OutputPath(str(tmp_path / "new" / "deeper"), "folder", marker="sft.json")) == []
    assert output_problems(OutputPath(str(folder(tmp_path)), "folder", marker="sft.json")) == []
    (tmp_path / "out" / "sft.json").write_text("{}")
    (tmp_path / "out" / "model.safetensors").write_text("")
    assert output_problems(OutputPath(str(tmp_path / "out"), "folder", marker="sft.json")) == []


def test_a_file_where_a_folder_goes_and_the_reverse_are_refused_even_with_overwrite(tmp_path):
    (tmp_path / "f").write_text("mine")
    (tmp_path / "d").mkdir()
    for out in (OutputPath(str(tmp_path / "f"), "folder"), OutputPath(str(tmp_path / "d"), "file"),
                OutputPath(str(tmp_path / "f" / "below"), "file")):
        problems = output_problems(out, overwrite=True)
        assert len(problems) == 1 and problems[0].startswith(f"out: {out.path!r}"), problems


def test_an_existing_file_is_replaced_only_with_overwrite(tmp_path):
    (tmp_path / "rows.jsonl").write_text("mine")
    out = OutputPath(str(tmp_path / "rows.jsonl"), "file")
    assert output_problems(out) == [f"out: {out.path!r} exists: give a new path, or --overwrite to replace it"]
    assert output_problems(out, overwrite=True) == []


def test_the_old_folder_stays_whole_while_the_new_one_is_written_and_after_a_failed_write(tmp_path):
    out = folder(tmp_path, "old.txt")
    seen = []

    def write(tmp: Path) -> None:
        (tmp / "new.txt").write_text("new")
        seen.append(sorted(p.name for p in out.iterdir()))

    write_folder_atomic(out, write)
    assert seen == [["old.txt"]] and sorted(p.name for p in out.iterdir()) == ["new.txt"]

    def fail(tmp: Path) -> None:
        (tmp / "half.txt").write_text("")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_folder_atomic(out, fail)
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"] and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_exchange_swaps_two_folders(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "x").write_text("a"), (b / "y").write_text("b")
    exchange(a, b)
    assert os.listdir(a) == ["y"] and os.listdir(b) == ["x"]


def launch(script: str, *args: str, cwd: Path) -> "forked.subprocess.CompletedProcess":
    return forked.run([sys.executable, str(ROOT / "launch" / script), "--model", "tiny-random", "--threads", "1",
                       *args], cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_sft_refuses_a_folder_of_the_users_files_and_a_file_before_anything_loads(tmp_path):
    data = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    mine = folder(tmp_path, "notes.txt")
    (tmp_path / "a_file").write_text("mine")
    for out in (mine, tmp_path / "a_file"):
        done = launch("sft.py", "--data", data, "--out", str(out), "--output-dir", str(tmp_path / "runs"), cwd=tmp_path)
        assert done.returncode == 2 and done.stderr.count("error: ") == 1 and f"out: {str(out)!r}" in done.stderr
    assert (mine / "notes.txt").read_text() == "mine" and (tmp_path / "a_file").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "out", "rows.jsonl"]  # no run folder, no .tmp


@pytest.mark.slow
def test_sft_replaces_its_own_folder_and_with_overwrite_the_users_and_records_the_prompt_it_taught(tmp_path):
    data = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    mine = folder(tmp_path, "notes.txt")
    args = ("--data", data, "--out", str(mine), "--output-dir", str(tmp_path / "runs"), "--epochs", "1",
            "--rows-per-step", "4")
    done = launch("sft.py", *args, "--overwrite", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not (mine / "notes.txt").exists() and (mine / "model.safetensors").is_file()
    record = json.loads((mine / "sft.json").read_text())
    assert record["prompt"] == {"system_prompt": "", "worked_example": False, "system_prompts_differ": False}
    again = launch("sft.py", *args, cwd=tmp_path)  # its own output: replaced without --overwrite
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "rows.jsonl", "runs"]


@pytest.mark.slow
def test_sample_refuses_an_existing_file_unless_overwrite(tmp_path):
    (tmp_path / "kept.jsonl").write_text("mine\n")
    done = launch("sample.py", "--out", str(tmp_path / "kept.jsonl"), cwd=tmp_path)
    assert done.returncode == 2 and "--overwrite" in done.stderr
    assert (tmp_path / "kept.jsonl").read_text() == "mine\n"


@pytest.mark.slow
def test_the_reward_model_program_refuses_an_existing_pairs_file_unless_overwrite(tmp_path):
    data = write_jsonl(tmp_path / "labelled.jsonl", [{"prompt": "p", "response": "a", "label": 1},
                                                     {"prompt": "p", "response": "b", "label": 0}])
    (tmp_path / "pairs.jsonl").write_text("mine\n")
    args = ("--data", data, "--to-pairs", "--out", str(tmp_path / "pairs.jsonl"))
    refused = launch("train_reward_model.py", *args, cwd=tmp_path)
    assert refused.returncode == 2 and "--overwrite" in refused.stderr
    assert (tmp_path / "pairs.jsonl").read_text() == "mine\n"
    done = launch("train_reward_model.py", *args, "--overwrite", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "pairs.jsonl").read_text().splitlines()[0])["chosen"] == "a"


def sft_folder(tmp_path: Path, **prompt) -> str:
    out = tmp_path / "sft_model"
    out.mkdir()
    (out / "sft.json").write_text(json.dumps({"program": "sft", "prompt": prompt}))
    return str(out)


def test_rl_names_the_flags_when_its_prompt_is_not_the_one_sft_taught(tmp_path):
    model = sft_folder(tmp_path, system_prompt="", worked_example=False, system_prompts_differ=False)
    warning = prompt_shape_warning(TrainConfig(model=model))
    assert warning is not None and 'pass --system-prompt "" --no-worked-example' in warning
    assert prompt_shape_warning(TrainConfig(model=model, system_prompt="", worked_example=False)) is None
    assert prompt_shape_warning(TrainConfig(model=str(tmp_path))) is None  # no sft.json


def test_rows_with_differing_system_prompts_leave_only_the_worked_example_to_compare(tmp_path):
    model = sft_folder(tmp_path, system_prompt=None, worked_example=False, system_prompts_differ=True)
    assert "pass --no-worked-example to" in prompt_shape_warning(TrainConfig(model=model))
    assert prompt_shape_warning(TrainConfig(model=model, worked_example=False)) is None
