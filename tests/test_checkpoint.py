"""A checkpoint is complete or ignored: each file is checked against the manifest written last, and a
damaged newest checkpoint is reported in one line and the previous one used."""

import json
from pathlib import Path

import pytest

import nanorllm.envs.math_env as math_env
from nanorllm.run.lifecycle import main
from nanorllm.envs.grader import Verdict
from nanorllm.trainer import checkpoint
from nanorllm.trainer.checkpoint import CheckpointError, load_latest, verify_manifest, write_manifest
from tests.runs import copy_run


def test_manifest_lists_every_file_and_catches_any_change(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "w.bin").write_bytes(b"x" * 10_000)
    (tmp_path / "state.json").write_text("{}")
    manifest = write_manifest(tmp_path)
    assert set(manifest["files"]) == {"model/w.bin", "state.json"}
    assert manifest["files"]["model/w.bin"]["size"] == 10_000
    verify_manifest(tmp_path)
    data = bytearray((tmp_path / "model" / "w.bin").read_bytes())
    data[4096:8192] = b"y" * 4096  # same size, other bytes
    (tmp_path / "model" / "w.bin").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model/w.bin changed since it was written"):
        verify_manifest(tmp_path)
    write_manifest(tmp_path)
    (tmp_path / "state.json").write_text("")
    with pytest.raises(CheckpointError, match="state.json is 0 bytes, 2 were written"):
        verify_manifest(tmp_path)
    (tmp_path / checkpoint.MANIFEST).unlink()
    with pytest.raises(CheckpointError, match="no manifest.json"):
        verify_manifest(tmp_path)


def _cut(path, keep):
    path.write_bytes(path.read_bytes()[:keep])


def _overwrite_4k(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2:len(data) // 2 + 4096] = b"\0" * 4096
    path.write_bytes(bytes(data))


DAMAGE = {
    "model/config.json invalid": lambda d: (d / "model" / "config.json").write_text("{not json"),
    "model/config.json empty": lambda d: (d / "model" / "config.json").write_text(""),
    "tokenizer.json cut short": lambda d: _cut(d / "model" / "tokenizer.json", 100),
    "chat_template.jinja empty": lambda d: (d / "model" / "chat_template.jinja").write_text(""),
    "trainer_state.json {}": lambda d: (d / "trainer_state.json").write_text("{}"),
    "4 KiB of weights overwritten": lambda d: _overwrite_4k(d / "model" / "model.safetensors"),
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_newest_checkpoint_is_skipped_in_one_line(serial_runs, tmp_path, capsys, damage):
    """The shared 2-step run, a checkpoint at each step: its newest damaged in a copy."""
    run = copy_run(Path(serial_runs["part"]), tmp_path)
    if damage == "chat_template.jinja empty" and not (run / "checkpoints" / "step_2" / "model" / "chat_template.jinja").exists():
        pytest.skip("this tokenizer keeps its template in tokenizer_config.json")
    DAMAGE[damage](run / "checkpoints" / "step_2")
    ckpt, state = load_latest(run)
    assert ckpt.name == "step_1" and state["step"] == 1
    skipped = [line for line in capsys.readouterr().out.splitlines() if "skipping" in line]
    assert len(skipped) == 1 and "step_2" in skipped[0]


@pytest.mark.slow
def test_resume_verifies_and_falls_back_end_to_end(serial_runs, tmp_path, capsys):
    run = copy_run(Path(serial_runs["part"]), tmp_path)
    _overwrite_4k(run / "checkpoints" / "step_2" / "model" / "model.safetensors")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(math_env, "judge", lambda response, gold, **kw: Verdict(False, "x"))
        assert main(["--resume", str(run), "--max-steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "[resume] skipping" in out and "sha256 differs" in out and "[resume] from" in out and "step_1" in out
    assert json.loads((run / "checkpoints" / "step_3" / "trainer_state.json").read_text())["step"] == 3
