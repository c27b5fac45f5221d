"""The tests' tiny run settings, and the tiny runs many tests share (tests/conftest.py's fixtures).

A shared run trains once a session, across pytest-xdist workers too: the first worker to ask trains it
under a file lock in the session's common temporary folder, the others read what it left. A test that
changes a run (resumes it, damages a checkpoint) copies the folder first (`copy_run`).

The tiny random model never writes a \\boxed{} answer, so the serial and LoRA runs grade with a rule it
can meet (`length_rule`: an even sum of character codes, about half the responses): rewards differ inside
groups, advantages are non-zero and every update really moves the weights.
"""

import contextlib
import io
import json
import shutil
import time
from pathlib import Path

import pytest
from filelock import FileLock

import nanorllm.envs.math_env as math_env
from nanorllm.faultsuite.process import SAMPLES, TASKS_PER_STEP  # the fault ledger counts groups by these
from nanorllm.envs.grader import Verdict

TINY_ARGS = ["--model", "tiny-random", "--max-new-tokens", "8", "--tasks-per-step", str(TASKS_PER_STEP),
             "--num-samples-per-task", str(SAMPLES), "--eval-limit", "4", "--threads", "1"]
SERIAL = [*TINY_ARGS, "--serial", "--lr", "1e-3", "--no-drop-zero-std-groups"]
LORA = ["--lora-rank", "4", "--kl-coef", "0.05", "--lr", "1e-2", "--off-policy-correction", "tis"]


def length_rule(response, gold, **kw) -> Verdict:
    return Verdict(sum(map(ord, response)) % 2 == 0, "x")


@contextlib.contextmanager
def length_rule_grading():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(math_env, "judge", length_rule)
        yield


def train_in_process(out: Path, name: str, args: list[str]) -> str:
    """launch/train.py's main in this process on `args` (SERIAL's settings first), graded by the length
    rule; returns what it printed. The run folder is out/name."""
    from nanorllm.run.lifecycle import main

    printed = io.StringIO()
    with length_rule_grading(), contextlib.redirect_stdout(printed):
        rc = main([*SERIAL, "--output-dir", str(out), "--run-name", name, *args])
    assert rc == 0, printed.getvalue()[-4000:]
    return printed.getvalue()


def once(tmp_path_factory, worker_id: str, name: str, make) -> dict:
    """`make(folder) -> dict` run once a session: by this process without xdist, else by whichever
    worker asks first while the others wait on the lock. The dict must be JSON."""
    if worker_id == "master":
        return make(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent / f"shared-{name}"
    with FileLock(str(shared) + ".lock"):
        done = shared / "outcome.json"
        if not done.exists():
            shared.mkdir(exist_ok=True)
            done.write_text(json.dumps(make(shared)))
        return json.loads(done.read_text())


def copy_run(run: Path, tmp_path: Path) -> Path:
    """A copy of a shared run's folder that a test may change."""
    return Path(shutil.copytree(run, tmp_path / run.name))


# ---- the shared runs -----------------------------------------------------------------------------
def serial_runs(out: Path) -> dict:
    """`part`: 2 steps, a checkpoint at each, TensorBoard and metrics.jsonl. `full`: 4 steps with every
    periodic output on (checkpoints kept 2, a 5-record dump, samples and held-out eval every 2 steps);
    the same episodes as `part` and as `part` resumed to step 4."""
    part = train_in_process(out, "part", ["--max-steps", "2", "--save-every", "1", "--report-to", "tensorboard,jsonl"])
    full = train_in_process(out, "full", ["--max-steps", "4", "--save-every", "1", "--keep-checkpoints", "2",
                                          "--rollout-dump-size", "5", "--sample-every", "2", "--eval-every", "2"])
    return {"part": str(out / "part"), "full": str(out / "full"), "part_output": part, "full_output": full}


def lora_runs(out: Path) -> dict:
    """LoRA rank 4 with a KL term and the TIS correction: `part` (2 steps, a checkpoint at each) and
    `whole` (4 steps), the same episodes."""
    part = train_in_process(out, "part", ["--max-steps", "2", "--save-every", "1", *LORA])
    train_in_process(out, "whole", ["--max-steps", "4", *LORA])
    return {"part": str(out / "part"), "whole": str(out / "whole"), "part_output": part}


def pipeline_run(out: Path) -> dict:
    """launch/train.py in a fresh interpreter with 2 workers, 4 steps: its exit code, what it printed, and what
    it left once its last process was gone (processes carrying its token, new /dev/shm entries no live
    process holds, files in its own temporary folder but torch's compile cache, which importing torch._dynamo
    creates there for every later run to share)."""
    from nanorllm.faultsuite.ledger import new_shm
    from tests.procs import processes_with_token, run_train, shm_entries

    shm_before = shm_entries()
    tmp = out / "tmp"
    tmp.mkdir()
    rc, printed, token = run_train(["--num-workers", "2", "--max-steps", "4", "--run-name", "p2"], out,
                                   env={"TMPDIR": str(tmp)}, fresh=True)
    deadline = time.monotonic() + 60  # a safety net: the children exit with the launcher, by themselves
    while processes_with_token(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    tmp_left = sorted(p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_"))
    return {"run": str(out / "p2"), "rc": rc, "output": printed, "procs_left": processes_with_token(token),
            "shm_left": sorted(new_shm(shm_before)), "tmp_left": tmp_left}
