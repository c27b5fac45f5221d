"""Run launch/train.py as a real subprocess and inspect what it leaves behind."""

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY_ARGS = ["--model", "tiny-random", "--max-new-tokens", "8", "--tasks-per-step", "4",
             "--num-samples-per-task", "2", "--eval-limit", "4", "--threads", "1"]


def start_train(args: list[str], out_dir: Path, **kw) -> tuple[subprocess.Popen, str]:
    """Start the launcher; every process it starts inherits a unique token in its environment."""
    token = uuid.uuid4().hex
    env = {**os.environ, "NANORLLM_TEST_TOKEN": token, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(ROOT / "launch" / "train.py"), *TINY_ARGS, "--output-dir", str(out_dir), *args]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    return proc, token


def run_train(args: list[str], out_dir: Path, timeout: float = 240) -> tuple[int, str, str]:
    proc, token = start_train(args, out_dir)
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out, token


def processes_with_token(token: str) -> list[int]:
    """PIDs of live processes whose environment carries `token` (children survive their parent)."""
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if token.encode() in (p / "environ").read_bytes():
                status = (p / "status").read_text()
                if "State:\tZ" not in status:
                    pids.append(int(p.name))
        except OSError:
            continue
    return pids


def children_of(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    out.append(int(p.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def wait_for_line(proc: subprocess.Popen, needle: str, timeout: float = 120) -> list[str]:
    """Read the process's output until a line contains `needle`; returns the lines read."""
    lines, deadline = [], time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"{needle!r} not seen; output:\n{''.join(lines)}")


def read_rollouts(run_dir: Path) -> list[dict]:
    with open(run_dir / "rollouts.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
