"""Bad input and damaged files on the newer surfaces (run folder names, the final model's write, LoRA adapter
files, checkpoints kept, reward functions and task sources, conversational data, the memory plan's host
numbers): each is refused in one line naming what is wrong, or handled, and each is injected into a real run
where a run is what meets it."""

import json
from pathlib import Path

import pytest

from nanorllm.run.lifecycle import main
from tests.procs import TINY_ARGS


@pytest.mark.parametrize("exp_name", ["/../../../tmp/x", "a/b", "..\\..\\x", "a\0b"])
def test_an_exp_name_that_is_a_path_is_refused_before_any_folder_is_made(exp_name, tmp_path, capsys):
    assert main([*TINY_ARGS, "--serial", "--exp-name", exp_name, "--output-dir", str(tmp_path / "out")]) == 2
    assert f"exp_name: must be a plain name" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("lora", [[], ["--lora-rank", "4"]], ids=["full", "lora"])
def test_a_full_disk_while_the_final_model_is_written_leaves_no_final_model_that_looks_whole(
        lora, tmp_path, monkeypatch):
    monkeypatch.setenv("NANORLLM_FAULT", "disk_full:final")
    args = [*TINY_ARGS, "--serial", *lora, "--max-steps", "1", "--eval-tasks", "", "--output-dir", str(tmp_path)]
    assert main([*args, "--run-name", "full"]) == 1
    assert sorted(p.name for p in (tmp_path / "full").iterdir() if "final" in p.name) == []
    assert (tmp_path / "full" / "checkpoints" / "step_1").is_dir()  # the run's last step is still on disk
    monkeypatch.delenv("NANORLLM_FAULT")
    assert main([*args, "--run-name", "room"]) == 0
    written = sorted(p.name for p in (tmp_path / "room").iterdir() if "final" in p.name)
    assert written == ["final_model"]
    assert (tmp_path / "room" / "final_model" / "merged" / "config.json").is_file() == bool(lora)
