"""Run launch/train.py as a process of its own and inspect what it leaves behind.

A test's run is a fork of a warm interpreter (tests/forked.py: the same script, argv, environment
and streams, without ~4 CPU-seconds of imports each); `fresh=True` starts a new interpreter, as a user does."""

import subprocess
import uuid
from pathlib import Path

from nanorllm.faultsuite.ledger import read_rollouts  # noqa: F401 (for the tests)
from nanorllm.faultsuite.process import ROOT, child_env  # noqa: F401 (for the tests)
from nanorllm.faultsuite.process import train_command as _train_command
from nanorllm.faultsuite.proc_scan import processes_with_token, shm_entries  # noqa: F401 (for the tests)
from tests import forked
from tests.runs import TINY_ARGS

HANG_S = 900  # the limit on a subprocess a test waits for: a net under a hang, not a guess at how long it takes


def train_command(args: list[str], out_dir: Path) -> list[str]:
    """launch/train.py on the tests' tiny settings (tests/runs.py) and then `args`, its runs under `out_dir`."""
    return _train_command(args, out_dir, base=TINY_ARGS)


def start_train(args: list[str], out_dir: Path, env: dict | None = None, *, fresh: bool = False,
                **kw) -> tuple[subprocess.Popen, str]:
    """Start the launcher; every process it starts inherits a unique token in its environment (and `env`)."""
    token = uuid.uuid4().hex
    popen = subprocess.Popen if fresh else forked.Popen
    proc = popen(train_command(args, out_dir), env=child_env(token) | (env or {}), stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT, text=True, **kw)
    return proc, token


def run_train(args: list[str], out_dir: Path, timeout: float = HANG_S, env: dict | None = None, *,
              fresh: bool = False) -> tuple[int, str, str]:
    proc, token = start_train(args, out_dir, env, fresh=fresh)
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out, token


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
