"""SFT on learner ranks: two ranks (DDP or FSDP) train as one does, a checkpoint taken on FSDP ranks resumes on
DDP ranks as the uninterrupted run, a killed rank stops the run naming it with the last checkpoint kept, and
FSDP on one rank is refused before anything is written."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from nanorllm.run.sft_program import main
from tests import forked

ROOT = Path(__file__).resolve().parents[1]
ROWS = [{"prompt": f"What is {i} + {i}?", "completion": f"\\boxed{{{2 * i}}}"} for i in range(12)]


def rows_file(tmp_path: Path, n: int = 12) -> str:
    path = tmp_path / f"rows{n}.jsonl"
    rows = [{"prompt": f"What is {i} + {i}?", "completion": f"\\boxed{{{2 * i}}}"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def sft_args(tmp_path: Path, name: str, *extra: str) -> list[str]:
    return ["--model", "tiny-random", "--data", rows_file(tmp_path), "--out", str(tmp_path / f"{name}-model"),
            "--output-dir", str(tmp_path / "runs"), "--run-name", name, "--threads", "1", "--devices", "cpu",
            "--rows-per-step", "4", "--epochs", "2", "--lr", "1e-3", "--eval-frac", "0.25", "--report-to", "jsonl",
            *extra]


def losses(tmp_path: Path, name: str) -> tuple[list[float], list[float]]:
    """(training loss per step, held-out loss per evaluation) of run `name`."""
    rows = [json.loads(line) for line in (tmp_path / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    return [m["sft/loss"] for m in rows if "sft/loss" in m], [m["sft/eval_loss"] for m in rows if "sft/eval_loss" in m]


def weights(tmp_path: Path, name: str) -> dict[str, torch.Tensor]:
    return load_file(tmp_path / f"{name}-model" / "model.safetensors")


@pytest.mark.slow
def test_two_ranks_ddp_and_fsdp_train_as_one_rank_does(tmp_path):
    """Each step's rows split over the ranks by tokens, the loss normalised over every rank's tokens and the
    gradients averaged: the per-step and held-out losses and the written model agree with one rank's."""
    assert main(sft_args(tmp_path, "one")) == 0
    assert main(sft_args(tmp_path, "ddp", "--learner-devices", "2")) == 0
    assert main(sft_args(tmp_path, "fsdp", "--learner-devices", "2", "--learner-parallel", "fsdp",
                         "--eval-every", "1")) == 0
    one_train, one_eval = losses(tmp_path, "one")
    assert len(one_train) == 5 and len(one_eval) == 2 and one_train[-1] < one_train[0]  # 9 rows x 2 epochs / 4
    for name in ("ddp", "fsdp"):
        train, held = losses(tmp_path, name)
        assert train == pytest.approx(one_train, abs=1e-5)
        assert [held[0], held[-1]] == pytest.approx(one_eval, abs=1e-5)
        a, b = weights(tmp_path, "one"), weights(tmp_path, name)
        assert a.keys() == b.keys() and max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    assert len(losses(tmp_path, "fsdp")[1]) == 6  # before, after each of the 5 steps (the last is also the final)


@pytest.mark.slow
def test_a_checkpoint_of_fsdp_ranks_resumes_on_ddp_ranks_as_the_uninterrupted_run(tmp_path):
    """The checkpoint holds the full optimizer state gathered from the FSDP shards, so it resumes on any number
    of ranks; the resumed steps are the uninterrupted run's."""
    assert main(sft_args(tmp_path, "whole")) == 0
    assert main(sft_args(tmp_path, "cut", "--learner-devices", "2", "--learner-parallel", "fsdp",
                         "--max-steps", "3", "--eval-every", "1")) == 0
    assert sorted(p.name for p in (tmp_path / "runs" / "cut" / "checkpoints").iterdir()) == ["step_3"]
    assert main(sft_args(tmp_path, "cut", "--learner-devices", "2", "--resume", str(tmp_path / "runs" / "cut"))) == 0
    assert losses(tmp_path, "cut")[0] == pytest.approx(losses(tmp_path, "whole")[0], abs=1e-5)


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.slow
def test_a_killed_rank_stops_the_run_naming_it_and_the_last_checkpoint_resumes_on_one_rank(tmp_path):
    """SIGKILL learner rank 1 mid-run: one line naming it, exit 1, no process left, the last checkpoint kept;
    resuming it on one rank finishes the run."""
    args = ["--model", "tiny-random", "--data", rows_file(tmp_path, 40), "--out", str(tmp_path / "model"),
            "--output-dir", str(tmp_path / "runs"), "--run-name", "killed", "--threads", "1", "--devices", "cpu",
            "--rows-per-step", "2", "--epochs", "5", "--save-every", "3", "--report-to", "jsonl"]
    log = tmp_path / "log.txt"
    with log.open("w") as out:
        proc = forked.Popen([sys.executable, "-u", str(ROOT / "launch" / "sft.py"), *args, "--learner-devices",
                             "2"], stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    deadline = time.monotonic() + 300
    while "step 4/" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    text = log.read_text()
    pids = [int(part.split(" pid ")[1]) for part in text.split("[ranks] ", 1)[1].splitlines()[0].split(", ")]
    os.kill(pids[1], signal.SIGKILL)
    assert proc.wait(timeout=120) == 1
    text = log.read_text()
    assert f"[failed] learner rank 1 on cpu (pid {pids[1]}) killed by SIGKILL" in text
    assert all(_gone(pid) for pid in pids)
    saved = sorted(int(p.name[5:]) for p in (tmp_path / "runs" / "killed" / "checkpoints").iterdir())
    trained = max(int(line[5:].split("/")[0]) for line in text.splitlines() if line.startswith("step "))
    assert saved and saved[-1] == trained // 3 * 3 and not (tmp_path / "model").exists()
    done = forked.run([sys.executable, str(ROOT / "launch" / "sft.py"), *args, "--resume",
                       str(tmp_path / "runs" / "killed")], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "step 100/100" in done.stdout and (tmp_path / "model" / "model.safetensors").is_file()


def test_fsdp_on_one_rank_is_refused_before_anything_is_written(tmp_path, capsys):
    args = sft_args(tmp_path, "refused", "--learner-parallel", "fsdp")
    assert main(args) == 2
    assert "learner_parallel: fsdp shards the learner over several ranks" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "refused-model").exists()


def test_a_temporary_folder_too_long_for_the_ranks_server_is_refused_before_anything_is_written(tmp_path, monkeypatch,
                                                                                             capsys):
    tmp = tmp_path / ("t" * 120)
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    assert main(sft_args(tmp_path, "long", "--learner-devices", "2")) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: TMPDIR: '{tmp}' is too long for the fork server") and "107" in line
    assert not (tmp_path / "runs").exists() and not (tmp_path / "long-model").exists()
