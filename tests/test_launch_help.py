"""Every launch script's --help shows what it can do: each mode of the benchmark, each script's own flags."""

import runpy
from pathlib import Path

import pytest

LAUNCH = Path(__file__).resolve().parent.parent / "launch"


def help_text(script: str, argv: list[str], capsys) -> str:
    main = runpy.run_path(str(LAUNCH / script), run_name="launch_help")["main"]
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 0
    return capsys.readouterr().out


def test_bench_help_lists_every_mode_and_each_mode_its_flags(capsys):
    overview = help_text("bench.py", ["--help"], capsys)
    for mode in ("speed", "learning", "learner-ranks", "gpu"):
        assert mode in overview
    assert "MODE --help" in overview
    assert "--dry-run" in help_text("bench.py", ["gpu", "--help"], capsys)
    assert "--dry-run" in help_text("bench.py", ["--gpu", "--help"], capsys)  # the documented spelling
    assert "--configs" in help_text("bench.py", ["--learning", "--help"], capsys)
    assert "--fsdp" in help_text("bench.py", ["learner-ranks", "--help"], capsys)
    assert "--quick" in help_text("bench.py", ["speed", "--help"], capsys)


def test_bench_picks_the_mode_from_either_spelling():
    mode_args = runpy.run_path(str(LAUNCH / "bench.py"), run_name="launch_help")["mode_args"]
    assert mode_args(["--gpu", "--dry-run"]) == ["gpu", "--dry-run"]
    assert mode_args(["learning", "--quick"]) == ["learning", "--quick"]
    assert mode_args(["--quick"]) == ["speed", "--quick"]


def test_tune_workers_help_names_its_own_flags_beside_the_training_ones(capsys):
    text = help_text("tune_workers.py", ["--help"], capsys)
    assert all(flag in text for flag in ("--max-workers", "--trial-steps", "--device-count", "--num-samples-per-task"))


def test_train_and_eval_help_name_their_entry_flags(capsys):
    text = help_text("train.py", ["--help"], capsys)
    assert "--config FILE" in text and "--resume RUN_DIR" in text and "--max-steps" in text
    text = help_text("eval.py", ["--help"], capsys)
    assert "--tasks" in text and "--env" in text and "gemini" in text


def test_train_reward_model_help_names_each_mode(capsys):
    text = help_text("train_reward_model.py", ["--help"], capsys)
    assert all(flag in text for flag in ("--data", "--sample-from", "--to-pairs", "--score"))
