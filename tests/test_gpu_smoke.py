"""launch/gpu_smoke.sh on CPU: it finds python3 where there is no `python`, names the wheels an image
lacks before any check starts, and (DRY_RUN=1) runs its checks' plumbing: the GPU tests it names exist,
the training runs' figures land in $OUT."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.procs import HANG_S

ROOT = Path(__file__).resolve().parents[1]


def smoke(tmp_path: Path, checks: str, *, pythonpath: str = "", timeout: int = HANG_S) -> subprocess.CompletedProcess:
    """The script with only `python3` on PATH (a wrapper of this interpreter), no PYTHON set."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "python3"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "PYTHONPATH", "CHECKS", "OUT")}
    env.update(PATH=f"{bin_dir}:/usr/bin:/bin", DRY_RUN="1", CHECKS=checks, OUT=str(tmp_path / "out"))
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run(["bash", str(ROOT / "launch/gpu_smoke.sh")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_the_smoke_script_runs_on_python3_and_every_gpu_test_it_names_exists(tmp_path):
    proc = smoke(tmp_path, "tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    named = [line for line in (ROOT / "launch/gpu_smoke.sh").read_text().split('GPU_TESTS="', 1)[1]
             .split('"', 1)[0].split()]
    assert f"{len(named)} tests collected" in proc.stdout and "[gpu_smoke] tests: exit 0" in proc.stdout


@pytest.mark.slow
def test_the_smoke_script_names_a_missing_wheel_before_any_check_starts(tmp_path):
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "tensorboard.py").write_text("raise ModuleNotFoundError(\"No module named 'tensorboard'\", "
                                         "name='tensorboard')\n")
    proc = smoke(tmp_path, "tests bench", pythonpath=str(stub))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "[gpu_smoke] missing wheels: tensorboard " in proc.stderr
    assert "[gpu_smoke] tests" not in proc.stdout and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_dry_smoke_run_writes_both_training_runs_and_their_figures(tmp_path):
    """The `steps` check (serial, then pipeline, bf16) at tiny sizes on CPU: both runs finish under the
    script's limit and their TensorBoard figures are read back into their logs. (The bench's dry run
    is tests/test_bench_gpu.py's.)"""
    proc = smoke(tmp_path, "steps", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "out"
    for run in ("steps-serial", "steps-pipeline"):
        log = (out / f"{run}.txt").read_text()
        assert "perf/step_s" in log and f"[gpu_smoke] {run}: exit 0" in proc.stdout, run
