"""The memory plan against the run: planned vs measured peak RSS of the learner and each worker.

    python -m nanorllm.bench.memory [--json out.json] -- TRAIN_FLAGS...
    python -m nanorllm.bench.memory -- --max-steps 1 --eval-limit 8 --no-save-model     # the default model

One launch/train.py run with TRAIN_FLAGS (its run folder in a temporary directory unless TRAIN_FLAGS
name an --output-dir), its processes' VmHWM (/proc/<pid>/status) read every 0.2 s until it exits: the
learner's, and every process under it (a worker, the child of the workers' fork server: the largest of them, one per
worker). A worker's RSS also counts the pages of the
shared weight block it reads, so its planned peak is its plan plus that block; the learner's plan
already holds the block (it is its parameters on a CPU learner, or a part of its own).
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nanorllm.memory.plan import GB, plan_run
from nanorllm.run.args import parse_train_args
from nanorllm.run.assembly import assemble

ROOT = Path(__file__).resolve().parents[2]


def vm_hwm(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return 0


def children(pid: int) -> list[int]:
    """The processes `pid` started, from any of its threads."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids = []
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return kids


def descendants(pid: int) -> list[int]:
    """Every process under `pid`: its children, theirs, and so on (the workers are the fork server's children)."""
    found, todo = [], [pid]
    while todo:
        for kid in children(todo.pop()):
            found.append(kid)
            todo.append(kid)
    return found


def measure(flags: list[str]) -> dict:
    """Plan and peaks of one run of launch/train.py with `flags`."""
    cfg, _, _, env = parse_train_args(flags)
    parts = assemble(cfg, env=env)
    plan = plan_run(parts)
    with tempfile.TemporaryDirectory() as tmp:
        log = open(Path(tmp) / "console.txt", "w+")
        keep = "--output-dir" in flags or any(f.startswith("--output-dir=") for f in flags)  # the run folder is kept
        proc = subprocess.Popen([sys.executable, str(ROOT / "launch" / "train.py"), *flags,
                                 *([] if keep else ["--output-dir", tmp])],
                                stdout=log, stderr=subprocess.STDOUT, text=True)
        peaks: dict[int, int] = {}
        t0 = time.perf_counter()
        while proc.poll() is None:
            for pid in [proc.pid, *descendants(proc.pid)]:
                peaks[pid] = max(peaks.get(pid, 0), vm_hwm(pid))
            time.sleep(0.2)
        log.seek(0)
        err = log.read()
        log.close()
    step_s = [float(m) for m in re.findall(r"step \d+/\d+ \|[^\n\r]*\| ([0-9.]+) s", err)]
    if proc.returncode != 0:
        raise SystemExit(f"the run exited {proc.returncode}:\n{err[-2000:]}")
    learner = peaks.pop(proc.pid)
    workers = sorted(peaks.values(), reverse=True)[:len(parts.devices.workers)]
    rows = [{"process": "learner", "planned_gb": plan.processes[0].total / GB, "measured_gb": learner / GB}]
    for i, (p, m) in enumerate(zip(plan.processes[1:], workers)):
        rows.append({"process": f"worker {i}", "planned_gb": (p.total + plan.shm_bytes) / GB, "measured_gb": m / GB})
    for r in rows:
        r["error"] = r["planned_gb"] / r["measured_gb"] - 1
    return {"flags": flags, "plan": plan.table(), "rows": rows, "wall_s": time.perf_counter() - t0, "step_s": step_s,
            "console_tail": err[-3000:]}


def main(argv: list[str]) -> int:
    out = None
    if "--json" in argv:
        i = argv.index("--json")
        out, argv = argv[i + 1], argv[:i] + argv[i + 2:]
    flags = argv[argv.index("--") + 1:] if "--" in argv else argv
    result = measure(flags)
    print(result["plan"])
    print(f"step seconds: {result['step_s']}")
    for r in result["rows"]:
        within = "met" if abs(r["error"]) <= 0.2 else "missed"
        print(f"{r['process']}: planned {r['planned_gb']:.2f} GB, measured {r['measured_gb']:.2f} GB "
              f"({r['error']:+.0%}, +-20% {within})")
    if out:
        Path(out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
