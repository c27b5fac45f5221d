"""RunFolder, the scaffold every training program opens: the lock, a new run's empty folder, what a run that stops
at bad input leaves (nothing), and the programs that stand on it refusing a folder in use or another run's."""

import json
from pathlib import Path

import pytest

from nanorllm.trainer.run_folder import RunFolder, run_name_now
from nanorllm.trainer.runlock import RunFolderInUse, RunLock


def open_new(output_dir: Path, name: str = "r") -> RunFolder:
    return RunFolder.open(str(output_dir), name, resume=None, default_name="unused", say=lambda _: None)


def test_a_run_that_writes_nothing_leaves_no_folder_not_even_the_ones_made_to_hold_it(tmp_path):
    folder = open_new(tmp_path / "runs" / "deep")
    assert folder.path == tmp_path / "runs" / "deep" / "r" and (folder.path / ".lock").exists()
    folder.close()
    assert list(tmp_path.iterdir()) == []


def test_a_folder_that_was_there_stays_and_a_written_run_stays_whole(tmp_path):
    (tmp_path / "runs").mkdir()
    open_new(tmp_path / "runs", "empty").close()
    assert [p.name for p in tmp_path.iterdir()] == ["runs"] and list((tmp_path / "runs").iterdir()) == []
    folder = open_new(tmp_path / "runs", "kept")
    folder.write_config({"lr": 1e-3})
    folder.close()
    assert json.loads((tmp_path / "runs" / "kept" / "config.json").read_text()) == {"lr": 1e-3}


def test_a_held_folder_is_refused_and_a_new_run_refuses_another_runs_folder(tmp_path):
    folder = open_new(tmp_path)
    with pytest.raises(RunFolderInUse, match="in use by another run"):
        open_new(tmp_path)
    folder.write_config({})
    folder.close()
    with pytest.raises(FileExistsError, match="exists and is not empty; use --resume"):
        open_new(tmp_path)
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [".lock", "config.json"]
    open_new(tmp_path, "other").close()  # refusing released the lock: nothing stays held


def test_runs_started_in_the_same_second_under_the_default_name_get_a_folder_each(tmp_path):
    first = RunFolder.open(str(tmp_path), None, resume=None, default_name="grpo__0__20261206-051500", say=print)
    second = RunFolder.open(str(tmp_path), None, resume=None, default_name="grpo__0__20261206-051500", say=print)
    assert [first.path.name, second.path.name] == ["grpo__0__20261206-051500", "grpo__0__20261206-051500-2"]
    first.close(), second.close()
    assert list(tmp_path.iterdir()) == []  # neither wrote anything


def test_the_default_name_carries_its_parts_and_the_start_time():
    name = run_name_now("math", "grpo", 3)
    assert name.startswith("math__grpo__3__") and len(name.rsplit("__", 1)[1]) == len("20261206-051500")


@pytest.mark.slow
def test_sft_refuses_a_run_folder_in_use_and_one_that_is_another_runs(tmp_path, capsys):
    from nanorllm.run.sft_program import main

    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "What is 1 + 1?", "completion": "\\boxed{2}"}) + "\n")
    args = ["--model", "tiny-random", "--threads", "1", "--data", str(rows), "--output-dir", str(tmp_path / "runs"),
            "--run-name", "r", "--out", str(tmp_path / "out")]
    (tmp_path / "runs" / "r").mkdir(parents=True)
    lock = RunLock(tmp_path / "runs" / "r").acquire()
    assert main(args) == 2 and "is in use by another run" in capsys.readouterr().err
    lock.release()
    (tmp_path / "runs" / "r" / "events.out").write_text("another run's")
    assert main(args) == 2 and "exists and is not empty; use --resume" in capsys.readouterr().err
    assert (tmp_path / "runs" / "r" / "events.out").read_text() == "another run's" and not (tmp_path / "out").exists()
