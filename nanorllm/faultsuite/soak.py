"""Soak: one long run; a random worker is SIGKILLed or SIGSTOPped every 40-80 s, memory sampled every 10 s."""

import json
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

from nanorllm.faultsuite.ledger import account, leftovers, read_rollouts
from nanorllm.faultsuite.process import TrainProcess
from nanorllm.faultsuite.proc_scan import age_s, rss_mb, shm_entries


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


def run_soak(out: Path, minutes: float) -> int:
    """The soak, its figures printed as JSON; exit code 1 unless `soak_ok`."""
    r = soak(out, minutes)
    print(json.dumps(r, indent=2))
    print("soak:", "ok" if soak_ok(r) else "FAILED")
    return 0 if soak_ok(r) else 1
