"""Fault suite: every fault the pipeline promises to survive, against a real tiny-random run.

    python launch/chaos.py                        # every fault, a table, exit 1 on any miss (~8 min on 2 cores)
    python launch/chaos.py --only worker_hang,learner_kill
    python launch/chaos.py --soak-minutes 30      # one long run, a random worker SIGKILL/SIGSTOP every ~minute

Each fault starts launch/train.py with `--num-workers 2` in a subprocess whose environment carries
a unique token, injects the fault from outside (signals) or through the NANORLLM_FAULT hook
(nanorllm/utils/faults.py), and then counts, from what the run wrote and what is left running:

    detected in s   fault -> the learner's report of it (or the run's exit, or the last process gone)
    recovered       the run ended the way it must for this fault (finished / stopped cleanly / saved)
    groups lost     task-stream positions up to the last trained step without all their episodes
    groups doubled  groups trained more than once (rollouts.jsonl: every record names its group and step)
    processes left  processes carrying the token 10 s after the run ended
    /dev/shm left   entries in /dev/shm that were not there before

The same functions are the pytest fault tests (tests/test_faults.py).
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nanorllm.utils.procs import age_s, processes_with_token, rss_mb, shm_entries, worker_pids  # noqa: E402

TASKS_PER_STEP, SAMPLES = 4, 2
TINY_ARGS = ["--model", "tiny-random", "--max-new-tokens", "8", "--tasks-per-step", str(TASKS_PER_STEP),
             "--num-samples-per-task", str(SAMPLES), "--eval-limit", "4", "--threads", "1"]
PIPELINE = ["--num-workers", "2", "--rollout-dump-size", "100000"]


class TrainProcess:
    """launch/train.py in a subprocess; every line it prints is kept with the time it appeared."""

    def __init__(self, args: list[str], out_dir: Path, *, fault: str | None = None, token: str | None = None):
        self.token = token or uuid.uuid4().hex
        env = {**os.environ, "NANORLLM_TEST_TOKEN": self.token, "PYTHONUNBUFFERED": "1"}
        env.pop("NANORLLM_FAULT", None)
        if fault:
            env["NANORLLM_FAULT"] = fault
        cmd = [sys.executable, str(ROOT / "launch" / "train.py"), *TINY_ARGS, "--output-dir", str(out_dir), *args]
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line))

    def seen(self, needle: str, after: float = 0.0) -> float | None:
        """When a line containing `needle` appeared (at or after `after`), or None."""
        return next((t for t, line in list(self.lines) if t >= after and needle in line), None)

    def wait_for(self, needle: str, timeout: float = 120, after: float = 0.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            t = self.seen(needle, after)
            if t is not None:
                return t
            if self.proc.poll() is not None and not self.reader.is_alive():
                break
            time.sleep(0.05)
        self.proc.kill()  # a run that never got there is not left running (its children die with it)
        self.wait()
        raise AssertionError(f"{needle!r} not seen; output:\n{self.output()}")

    def output(self) -> str:
        return "".join(line for _, line in list(self.lines))

    def workers(self) -> list[int]:
        return worker_pids(self.proc.pid)

    def rank_pid(self, rank: int) -> int:
        """A learner rank's pid, from the run's "[ranks] ... rank R on <host> <device> pid N" line."""
        line = self.output().split("[ranks] ", 1)[1].splitlines()[0]
        return int(line.split(f"rank {rank} on ", 1)[1].split(" pid ", 1)[1].split()[0].rstrip(","))

    def signal(self, sig: int) -> float:
        self.proc.send_signal(sig)
        return time.monotonic()

    def wait(self, timeout: float = 240) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.reader.join(timeout=10)
        return rc


@dataclass
class Outcome:
    fault: str
    detected_s: float | None
    recovered: bool
    lost: int = 0
    doubled: int = 0
    procs_left: int = 0
    shm_left: int = 0
    notes: list[str] = field(default_factory=list)
    output: str = ""

    @property
    def ok(self) -> bool:
        return self.recovered and not (self.lost or self.doubled or self.procs_left or self.shm_left)

    def row(self) -> str:
        det = "-" if self.detected_s is None else f"{self.detected_s:.1f}"
        return (f"| {self.fault} | {det} | {'yes' if self.recovered else 'NO'} | {self.lost} | {self.doubled} | "
                f"{self.procs_left} | {self.shm_left} |")


HEADER = ("| fault | detected in s | recovered | groups lost | groups doubled | processes left | "
          "/dev/shm entries left |\n|---|---|---|---|---|---|---|")


# ---- what a run left behind -----------------------------------------------------------------------
def read_rollouts(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "rollouts.jsonl"
    if not path.exists():
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def position(group_id: str) -> int:
    return int(group_id.rsplit("@", 1)[1])


def account(counts: Counter, steps: int) -> tuple[int, int]:
    """(lost, doubled) given episodes per group_id and the number of steps trained."""
    per_position = Counter()
    for gid, n in counts.items():
        per_position[position(gid)] += n
    lost = sum(1 for p in range(steps * TASKS_PER_STEP) if per_position[p] < SAMPLES)
    doubled = sum(1 for n in per_position.values() if n > SAMPLES)
    return lost, doubled


def groups_of(run_dir: Path) -> tuple[int, int, int]:
    """(lost, doubled, last trained step) from rollouts.jsonl."""
    recs = read_rollouts(run_dir)
    steps = max((r["step"] for r in recs), default=0)
    return (*account(Counter(r["group_id"] for r in recs), steps), steps)


def checkpoint_steps(run_dir: Path) -> list[int]:
    d = Path(run_dir) / "checkpoints"
    return sorted(int(p.name[5:]) for p in d.glob("step_*") if p.name[5:].isdigit()) if d.exists() else []


def leftovers(token: str, shm_before: set[str], wait_s: float = 10.0) -> tuple[int, int, float]:
    """(processes left, /dev/shm entries left, when the last process was gone: time.monotonic()).

    /dev/shm entries carry no owner, so an entry counts only if it is still there after `wait_s`:
    another program's short-lived semaphore is not this run's leftover."""
    t0 = time.monotonic()
    while processes_with_token(token) and time.monotonic() - t0 < wait_s:
        time.sleep(0.05)
    gone = time.monotonic()
    while shm_entries() - shm_before and time.monotonic() - t0 < wait_s:
        time.sleep(0.1)
    return len(processes_with_token(token)), len(shm_entries() - shm_before), gone


def _finish(o: Outcome, run: TrainProcess, run_dir: Path, shm_before: set[str]) -> Outcome:
    o.procs_left, o.shm_left, _ = leftovers(run.token, shm_before)
    o.lost, o.doubled, steps = groups_of(run_dir)
    o.notes.append(f"{steps} steps trained")
    o.output = run.output()
    return o


# ---- the faults ----------------------------------------------------------------------------------
def _signal_a_worker(out: Path, name: str, label: str, sig: int, report: str, extra: list[str]) -> list[Outcome]:
    shm = shm_entries()
    run = TrainProcess([*PIPELINE, "--max-steps", "40", *extra, "--run-name", name], out)
    run.wait_for("step 3/")
    t = time.monotonic()
    os.kill(run.workers()[0], sig)
    rc = run.wait()
    seen = run.seen(report, after=t)
    o = Outcome(label, seen and seen - t, rc == 0 and "step 40/40" in run.output())
    return [_finish(o, run, out / name, shm)]


def worker_kill(out: Path) -> list[Outcome]:
    """SIGKILL a worker mid-run: it is restarted, its job re-issued, the run finishes."""
    return _signal_a_worker(out, "worker_kill", "worker SIGKILL", signal.SIGKILL, "died (killed by SIGKILL)", [])


def worker_hang(out: Path) -> list[Outcome]:
    """SIGSTOP a worker: past --worker-timeout-s it is reported, killed and replaced."""
    return _signal_a_worker(out, "worker_hang", "worker SIGSTOP (hang)", signal.SIGSTOP, "hung (no progress",
                            ["--worker-timeout-s", "3"])


def worker_start_fails(out: Path) -> list[Outcome]:
    """Every worker start raises: back-off, then a clean stop with the worker's traceback and a checkpoint."""
    shm = shm_entries()
    run = TrainProcess([*PIPELINE, "--max-steps", "40", "--restart-backoff-s", "0.2", "--max-restarts-per-worker", "2",
                        "--run-name", "worker_start"], out, fault="worker_start")
    rc = run.wait()
    text = run.output()
    stopped = (rc == 1 and "failures in a row" in text and "injected fault: worker_start" in text
               and checkpoint_steps(out / "worker_start") == [0])
    o = Outcome("worker fails at every start", time.monotonic() - run.t0, stopped)
    o.notes.append(f"{text.count('restarting it in')} restarts before the stop")
    return [_finish(o, run, out / "worker_start", shm)]


def torn_result(out: Path) -> list[Outcome]:
    """A worker SIGKILLed halfway through writing an 8 MB result: the learner goes on."""
    shm = shm_entries()
    run = TrainProcess([*PIPELINE, "--max-steps", "20", "--run-name", "torn"], out, fault="torn_result")
    rc = run.wait()
    t_fault, t_seen = run.seen("[fault] worker 0"), run.seen("died (killed by SIGKILL)")
    o = Outcome("worker killed while writing a large result", t_fault and t_seen and t_seen - t_fault,
                rc == 0 and "step 20/20" in run.output() and t_fault is not None)
    return [_finish(o, run, out / "torn", shm)]


def learner_kill(out: Path) -> list[Outcome]:
    """SIGKILL the learner with jobs in flight: every child exits by itself; then resume: each group once."""
    shm = shm_entries()
    args = [*PIPELINE, "--max-steps", "30", "--save-every", "4", "--run-name", "learner_kill"]
    run = TrainProcess(args, out)
    run.wait_for("step 9/")
    t = run.signal(signal.SIGKILL)
    run.wait()
    procs, shm_left, gone = leftovers(run.token, shm)
    killed = Outcome("learner SIGKILL (orphans)", gone - t, procs == 0, procs_left=procs, shm_left=shm_left,
                     output=run.output())
    resumed = TrainProcess(["--resume", str(out / "learner_kill")], out, token=run.token)
    rc = resumed.wait()
    o = Outcome("resume after a hard kill", None, rc == 0 and "step 30/30" in resumed.output())
    o.notes.append(f"killed {time.monotonic() - t:.0f} s before; checkpoints then {checkpoint_steps(out / 'learner_kill')}")
    return [killed, _finish(o, resumed, out / "learner_kill", shm)]


def _stop_by_signals(out: Path, name: str, label: str, first: int, then: int, then_after_s: float,
                     expect_rc: int) -> list[Outcome]:
    shm = shm_entries()
    run = TrainProcess([*PIPELINE, "--max-steps", "5000", "--run-name", name], out)
    run.wait_for("step 5/")
    t = run.signal(first)
    try:
        run.proc.wait(timeout=then_after_s)
    except subprocess.TimeoutExpired:
        run.signal(then)
    rc = run.proc.wait(timeout=240)
    took = time.monotonic() - t
    run.wait()
    last = groups_of(out / name)[2]
    o = Outcome(label, took, rc == expect_rc and took < 10 and last in checkpoint_steps(out / name))
    o.notes.append(f"exit {rc} after {took:.1f} s; checkpoints {checkpoint_steps(out / name)}")
    return [_finish(o, run, out / name, shm)]


def sigint_twice(out: Path) -> list[Outcome]:
    """Ctrl-C, and Ctrl-C again 0.3 s later: the checkpoint is still written; exit 130 within 10 s."""
    return _stop_by_signals(out, "sigint", "SIGINT twice", signal.SIGINT, signal.SIGINT, 0.3, 130)


def sigterm_then_kill(out: Path) -> list[Outcome]:
    """`docker stop`: SIGTERM, SIGKILL 10 s later if still alive: it must be done (143) before that."""
    return _stop_by_signals(out, "sigterm", "SIGTERM, SIGKILL after 10 s", signal.SIGTERM, signal.SIGKILL, 10.0, 143)


def sighup(out: Path) -> list[Outcome]:
    """The terminal closed (SIGHUP): a stop like SIGTERM, checkpoint first, exit 129."""
    return _stop_by_signals(out, "sighup", "SIGHUP (terminal closed)", signal.SIGHUP, signal.SIGKILL, 10.0, 129)


def second_owner(out: Path) -> list[Outcome]:
    """`--resume` on a folder whose run is alive: refused at once naming the owner; the owner goes on."""
    shm = shm_entries()
    run = TrainProcess([*PIPELINE, "--max-steps", "5000", "--run-name", "owned"], out)
    run.wait_for("step 2/")
    t = time.monotonic()
    intruder = TrainProcess(["--resume", str(out / "owned")], out, token=run.token)
    rc_intruder = intruder.wait()
    took = time.monotonic() - t
    going_on = run.proc.poll() is None
    run.signal(signal.SIGTERM)
    rc = run.wait()
    last = groups_of(out / "owned")[2]
    o = Outcome("resume while the run is alive", took, rc_intruder == 2 and going_on and rc == 143
                and last in checkpoint_steps(out / "owned")
                and f"in use by another run (pid {run.proc.pid})" in intruder.output())
    o.notes.append(f"second process exit {rc_intruder} after {took:.1f} s; owner exit {rc}")
    o = _finish(o, run, out / "owned", shm)
    o.output = f"{o.output}\n--- the second process:\n{intruder.output()}"
    return [o]


def unbounded_golds(out: Path) -> list[Outcome]:
    """Golds no parser finishes (9^(9^(9^9)), 5,001 digits) for a model that always answers \\boxed{1}: each
    check is cut at the CPU budget and counted, the first one's task named; nothing hangs, the run finishes."""
    shm = shm_entries()
    tasks, heldout = out / "unbounded-tasks.jsonl", out / "unbounded-heldout.jsonl"
    rows = [{"task_id": "nested-power", "question": "a?", "answer": "9^{9^{9^9}}"},
            {"task_id": "long-gold", "question": "b?", "answer": "7" * 5001}]
    rows += [{"task_id": f"plain-{i}", "question": f"{i} + 1?", "answer": str(i + 1)} for i in range(6)]
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    heldout.write_text(json.dumps({"task_id": "held-nested", "question": "c?", "answer": "9^{9^{9^9}} + 1"}) + "\n")
    run = TrainProcess([*PIPELINE, "--tasks", str(tasks), "--eval-tasks", str(heldout), "--max-steps", "2",
                        "--grader-timeout-s", "1", "--worker-timeout-s", "10", "--run-name", "unbounded"], out,
                       fault="fixed_answer:\\boxed{1}")
    rc = run.wait()
    text = run.output()
    t_seen = run.seen("[grader] held-out eval at step 0")
    o = Outcome("golds no parser finishes", t_seen and t_seen - run.t0,
                rc == 0 and "step 2/2" in text and "hung" not in text and "first: task held-nested" in text
                and "[grader] step " in text)
    return [_finish(o, run, out / "unbounded", shm)]


def _hung_grader(out: Path, name: str, label: str, extra: list[str], report: str) -> list[Outcome]:
    shm = shm_entries()
    run = TrainProcess([*PIPELINE, "--max-steps", "40", "--worker-timeout-s", "3", "--max-restarts-per-worker", "1",
                        "--restart-backoff-s", "0.2", *extra, "--run-name", name], out, fault="grader_hang")
    rc = run.wait()
    t_seen = run.seen(report)
    o = Outcome(label, t_seen and t_seen - run.t0, rc == 1 and t_seen is not None
                and checkpoint_steps(out / name) == [0] and "[done]" not in run.output())
    return [_finish(o, run, out / name, shm)]


def worker_grader_hang(out: Path) -> list[Outcome]:
    """A worker's grader never returns: reported as hung *while grading*, with the job and task; the run
    stops past the restart cap (it would hang again) with step 0 saved."""
    return _hung_grader(out, "worker_grader_hang", "worker hung in the grader", ["--eval-tasks", ""],
                        "while grading (job 0.")


def eval_grader_hang(out: Path) -> list[Outcome]:
    """The grader never returns in the learner's held-out eval: the eval watchdog names the task and the
    run stops (exit 1, step 0 saved) instead of hanging forever."""
    return _hung_grader(out, "eval_grader_hang", "held-out eval hung in the grader", [],
                        "held-out evaluation hung: no progress")


def disk_full(out: Path) -> list[Outcome]:
    """The disk refuses step 2's periodic checkpoint: reported, retried at the next save point, the run finishes."""
    shm = shm_entries()
    run = TrainProcess([*PIPELINE, "--max-steps", "6", "--save-every", "2", "--run-name", "disk_full"], out,
                       fault="disk_full:2")
    rc = run.wait()
    d = out / "disk_full" / "checkpoints"
    o = Outcome("disk full at a periodic save", None, rc == 0 and "step 2 not written" in run.output()
                and checkpoint_steps(out / "disk_full") == [4, 6] and not list(d.glob(".tmp-*")))
    return [_finish(o, run, out / "disk_full", shm)]


def learner_exception(out: Path) -> list[Outcome]:
    """An exception in the learner: traceback, checkpoint of the last completed step, no final eval, exit 1."""
    shm = shm_entries()
    run = TrainProcess([*PIPELINE, "--max-steps", "40", "--run-name", "exc"], out, fault="learner_step:6")
    rc = run.wait()
    run_dir = out / "exc"
    summary = json.loads((run_dir / "eval.json").read_text()) if (run_dir / "eval.json").exists() else {}
    t_err = run.seen("injected fault: learner_step 6")
    ok = (rc == 1 and "Traceback" in run.output() and t_err is not None and checkpoint_steps(run_dir) == [5]
          and "after" not in summary and not (run_dir / "final_model").exists())
    o = Outcome("learner exception", t_err and time.monotonic() - t_err, ok)
    return [_finish(o, run, run_dir, shm)]


def _stop_a_rank(out: Path, name: str, label: str, sig: int, report: str, extra: list[str]) -> list[Outcome]:
    """Signal learner rank 1 of two mid-run: one error naming it, exit 1, the last completed step saved,
    nothing left; then resume on one rank: every group trained once."""
    shm = shm_entries()
    run = TrainProcess([*PIPELINE, "--learner-devices", "2", "--max-steps", "8", "--save-every", "0",
                        "--save-every-minutes", "0", *extra, "--run-name", name], out)
    run.wait_for("step 3/", timeout=300)
    t = time.monotonic()
    os.kill(run.rank_pid(1), sig)
    rc = run.wait()
    seen, text = run.seen(report, after=t), run.output()
    trained = max((int(line[5:].split("/")[0]) for line in text.splitlines() if line.startswith("step ")), default=0)
    saved = checkpoint_steps(out / name)
    stopped = Outcome(label, seen and seen - t, rc == 1 and seen is not None and saved[-1:] == [trained] and trained < 8,
                      output=text)
    stopped.procs_left, stopped.shm_left, _ = leftovers(run.token, shm)
    stopped.notes.append(f"exit {rc}; {trained} steps trained; checkpoints {saved}")
    resumed = TrainProcess(["--resume", str(out / name), "--learner-devices", "1"], out, token=run.token)
    rc = resumed.wait()
    o = Outcome(f"resume on 1 rank after {label}", None, rc == 0 and "step 8/8" in resumed.output()
                and f"step_{trained}" in resumed.output())
    return [stopped, _finish(o, resumed, out / name, shm)]


def rank_kill(out: Path) -> list[Outcome]:
    """SIGKILL learner rank 1: its connections close, the next collective fails, the error names it."""
    return _stop_a_rank(out, "rank_kill", "learner rank SIGKILL", signal.SIGKILL, "killed by SIGKILL", [])


def rank_hang(out: Path) -> list[Outcome]:
    """SIGSTOP learner rank 1: past --learner-timeout-s the collective fails, the error names the stopped rank."""
    return _stop_a_rank(out, "rank_hang", "learner rank SIGSTOP (hang)", signal.SIGSTOP, "is stopped (SIGSTOP",
                        ["--learner-timeout-s", "10"])


FAULTS = {"worker_kill": worker_kill, "worker_hang": worker_hang, "worker_start": worker_start_fails,
          "torn_result": torn_result, "learner_kill": learner_kill, "sigint_twice": sigint_twice,
          "sigterm_then_kill": sigterm_then_kill, "learner_exception": learner_exception, "rank_kill": rank_kill,
          "rank_hang": rank_hang, "sighup": sighup, "second_owner": second_owner,
          "unbounded_golds": unbounded_golds, "worker_grader_hang": worker_grader_hang,
          "eval_grader_hang": eval_grader_hang, "disk_full": disk_full}


# ---- soak ----------------------------------------------------------------------------------------
def soak(out: Path, minutes: float, *, seed: int = 0) -> dict:
    """One long run; a random worker is SIGKILLed or SIGSTOPped every 40-80 s. Returns the figures."""
    rng = random.Random(seed)
    shm = shm_entries()
    dump_size = 1024
    args = ["--num-workers", "2", "--max-steps", "100000000", "--rollout-dump-size", str(dump_size),
            "--worker-timeout-s", "10", "--max-restarts-per-run", "1000", "--save-every-minutes", "5",
            "--sample-every", "0", "--run-name", "soak"]
    run = TrainProcess(args, out)
    run.wait_for("step 1/")
    run_dir, by_step, rss, faults = out / "soak", {}, [], Counter()
    t_start = time.monotonic()
    t_end, next_fault, next_rss = t_start + minutes * 60, t_start + rng.uniform(40, 80), t_start
    def observe() -> None:  # the file is replaced atomically, one whole step at a time
        recs = read_rollouts(run_dir)
        steps = {r["step"] for r in recs}
        if len(recs) == dump_size:  # full: its oldest step may have lost some records
            steps.discard(min(steps))
        for s in steps:
            by_step[s] = Counter(r["group_id"] for r in recs if r["step"] == s)

    while time.monotonic() < t_end and run.proc.poll() is None:
        time.sleep(1.0)
        observe()
        now = time.monotonic()
        if now >= next_rss:
            workers = [p for p in run.workers() if (age_s(p) or 0) > 30]  # loaded, not starting
            sizes = [m for m in map(rss_mb, workers) if m]
            rss.append((now - t_start, rss_mb(run.proc.pid), sum(sizes) / len(sizes) if sizes else None))
            next_rss = now + 10
        if now >= next_fault and run.workers():
            kind = rng.choice(["SIGKILL", "SIGSTOP"])
            os.kill(rng.choice(run.workers()), getattr(signal, kind))
            faults[kind] += 1
            next_fault = now + rng.uniform(40, 80)
    crashed = run.proc.poll() is not None
    run.signal(signal.SIGTERM)
    rc = run.wait()
    observe()
    procs, shm_left, _ = leftovers(run.token, shm)
    steps = max(by_step, default=0)
    counts = Counter()
    for c in by_step.values():
        counts.update(c)
    lost, doubled = account(counts, steps)
    unseen = [s for s in range(1, steps + 1) if s not in by_step]
    quarter = max(1, len(rss) // 4)

    def change(i: int) -> float | None:
        first = [r[i] for r in rss[:quarter] if r[i]]
        last = [r[i] for r in rss[-quarter:] if r[i]]
        return (sum(last) / len(last)) / (sum(first) / len(first)) - 1 if first and last else None

    text = run.output()
    (out / "soak-output.log").write_text(text)  # the learner's console, to read what stopped it
    return {"minutes": minutes, "steps": steps, "faults": dict(faults), "worker_deaths_reported": text.count(" died ("),
            "worker_hangs_reported": text.count("hung (no progress"), "crashed_before_end": crashed, "exit_code": rc,
            "groups_lost": lost, "groups_doubled": doubled, "steps_not_observed": len(unseen),
            "learner_rss_mb_first_last": (rss[0][1], rss[-1][1]) if rss else None,
            "learner_rss_change": change(1), "worker_rss_change": change(2), "rss_samples": len(rss),
            "processes_left": procs, "shm_left": shm_left}


def soak_ok(r: dict) -> bool:
    flat = all(c is not None and abs(c) <= 0.10 for c in (r["learner_rss_change"], r["worker_rss_change"]))
    return (flat and not r["crashed_before_end"] and r["exit_code"] == 143 and not r["groups_lost"]
            and not r["groups_doubled"] and not r["steps_not_observed"] and not r["processes_left"]
            and not r["shm_left"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help=f"comma-separated subset of: {', '.join(FAULTS)}")
    ap.add_argument("--soak-minutes", type=float, help="run the soak instead of the fault table")
    ap.add_argument("--out", help="where the runs go (default: a temporary directory)")
    args = ap.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="nanorllm-chaos-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.soak_minutes:
        r = soak(out, args.soak_minutes)
        print(json.dumps(r, indent=2))
        print("soak:", "ok" if soak_ok(r) else "FAILED")
        return 0 if soak_ok(r) else 1
    names = args.only.split(",") if args.only else list(FAULTS)
    t0, rows = time.monotonic(), []
    for name in names:
        for o in FAULTS[name](out):
            rows.append(o)
            print(f"[chaos] {o.fault}: {'ok' if o.ok else 'FAILED'} ({'; '.join(o.notes)})", flush=True)
            if not o.ok:
                print(o.output[-4000:], flush=True)
    print(HEADER)
    for o in rows:
        print(o.row())
    print(f"{len(rows)} faults, {sum(o.ok for o in rows)} ok, {time.monotonic() - t0:.0f} s, runs under {out}")
    return 0 if all(o.ok for o in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
