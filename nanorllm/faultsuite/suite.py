"""Fault suite: every fault the pipeline promises to survive, against a real tiny-random run.

Each fault starts launch/train.py with `--num-workers 2` in a subprocess whose environment carries
a unique token (faultsuite/process.py), injects the fault from outside (signals) or through the
NANORLLM_FAULT hook (utils/faults.py), and then counts, from what the run wrote and what is left
running (faultsuite/ledger.py):

    detected in s   fault -> the learner's report of it (or the run's exit, or the last process gone)
    recovered       the run ended the way it must for this fault (finished / stopped cleanly / saved)
    groups lost     task-stream positions up to the last trained step without all their episodes
    groups doubled  groups trained more than once (rollouts.jsonl: every record names its group and step)
    processes left  processes carrying the token 10 s after the run ended
    /dev/shm left   entries in /dev/shm that were not there before

The same functions are the pytest fault tests (tests/test_faults.py; the --agent ones in tests/test_agent_faults.py);
`launch/chaos.py` runs them as a table.
"""

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from nanorllm.faultsuite.ledger import groups_of, leftovers, new_shm, read_rollouts
from nanorllm.faultsuite.process import PIPELINE, SAMPLES, TASKS_PER_STEP, TrainProcess
from nanorllm.faultsuite.proc_scan import shm_entries
from nanorllm.faultsuite.proxy_trap import ProxyTrap
from nanorllm.faultsuite.stub_judge import StubJudge, lying_score
from nanorllm.trainer.checkpoint import complete_steps


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


def _finish(o: Outcome, run: TrainProcess, run_dir: Path, shm_before: set[str]) -> Outcome:
    o.procs_left, o.shm_left, _ = leftovers(run.token, shm_before)
    if o.shm_left:  # named, so a leftover can be traced to what made it (a torch segment carries its maker's pid)
        o.notes.append(f"/dev/shm left: {', '.join(sorted(new_shm(shm_before))[:5])}")
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


AGENT_THAT_KILLS_ITS_WORKER = """
import multiprocessing, os, signal
from pathlib import Path

MARK = Path({mark!r})


def solve(task, client):
    reply = client.chat.completions.create(model="policy", messages=[{{"role": "user", "content": task["question"]}}])
    if multiprocessing.current_process().name.startswith("nanorllm-worker") and not MARK.exists():
        MARK.write_text(str(os.getpid()))  # once per run: the restarted worker goes on
        os.kill(os.getpid(), signal.SIGKILL)  # the other episodes' requests are decoding in this worker
    return float(len(reply.choices[0].message.content) % 2)
"""


def agent_worker_kill(out: Path) -> list[Outcome]:
    """An --agent run whose worker is SIGKILLed while its endpoint serves requests: restarted, the job's
    episodes re-run from the start, no group lost or doubled, the run finishes."""
    shm = shm_entries()
    agent = out / "agent_kill.py"
    agent.write_text(AGENT_THAT_KILLS_ITS_WORKER.format(mark=str(out / "agent_kill.killed")))
    run = TrainProcess([*PIPELINE, "--agent", f"{agent}:solve", "--tasks", "calc:count=40,seed=1", "--eval-tasks", "",
                        "--max-steps", "6", "--run-name", "agent_kill"], out)
    rc = run.wait()
    t_seen = run.seen("died (killed by SIGKILL)")
    o = Outcome("--agent worker SIGKILL mid-request", None,
                rc == 0 and "step 6/6" in run.output() and t_seen is not None
                and (out / "agent_kill.killed").exists())
    return [_finish(o, run, out / "agent_kill", shm)]


# Agents a user might write that misbehave (--agent path/to/file.py:fn): each misbehaves in some episodes.
MISBEHAVING_AGENTS = """
import itertools, sys, threading, time

_calls, _lock = itertools.count(), threading.Lock()


def _nth():
    with _lock:
        return next(_calls)


def _reward(task, client):
    reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["question"]}])
    return float(len(reply.choices[0].message.content) % 2)


def exits(task, client):
    reward = _reward(task, client)
    if _nth() % 4 == 0:
        sys.exit(2)  # what argparse does with an argument it does not know
    return reward


def hangs(task, client):
    reward = _reward(task, client)
    if int(task["task_id"].rsplit("-", 1)[-1]) % 2 == 0:  # half the tasks, every sample of each: whole groups
        time.sleep(3600)  # stuck where no timeout of its own reaches: its thread outlives the episode
    return reward


def answers(task, client):
    return _reward(task, client)
"""


def _scalar_values(run_dir: Path, tag: str) -> list[int]:
    """A scalar's values, step by step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return [int(e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def _misbehaving_code(out: Path, name: str, label: str, args: list[str], counted: str,
                      fault: str | None = None) -> list[Outcome]:
    """A pipeline run of 3 steps with a user's code (`args` name it) that misbehaves: the run finishes (exit 0,
    `[done]` last), the faults are counted in `counted`, and every process is gone after it."""
    shm = shm_entries()
    run = TrainProcess([*PIPELINE, *args, "--max-steps", "3", "--run-name", name], out, fault=fault)
    rc = run.wait()
    lines = run.output().strip().splitlines()
    counts = _scalar_values(out / name, counted)
    o = Outcome(label, None, rc == 0 and "step 3/3" in run.output() and bool(lines) and lines[-1].startswith("[done]")
                and any(counts))
    o.notes.append(f"exit {rc}; {counted} by step {counts}; last line {lines[-1][:60] if lines else ''!r}")
    return [_finish(o, run, out / name, shm)]


def _misbehaving_agent(out: Path, name: str, label: str, fn: str, extra: list[str], counted: str,
                       fault: str | None = None) -> list[Outcome]:
    """An --agent run (`fn` of MISBEHAVING_AGENTS) through `_misbehaving_code`."""
    agent = out / "misbehaving_agents.py"
    agent.write_text(MISBEHAVING_AGENTS)
    return _misbehaving_code(out, name, label, ["--agent", f"{agent}:{fn}", "--tasks", "calc:count=40,seed=1",
                                                "--eval-tasks", "calc:count=2,seed=2", *extra], counted, fault)


def agent_exits(out: Path) -> list[Outcome]:
    """An agent that calls sys.exit() in some episodes: each is an env error; the endpoint and the run go on."""
    return _misbehaving_agent(out, "agent_exits", "--agent calls sys.exit()", "exits", [], "rollout/env_errors")


def agent_hangs(out: Path) -> list[Outcome]:
    """A sync agent stuck in half its episodes (those of half the tasks, so the other groups train), more stuck
    threads than rows in the batch: each is ended at --agent-timeout-s and counted, later episodes still run, and
    the workers exit at the end."""
    return _misbehaving_agent(out, "agent_hangs", "--agent stuck past the batch's rows", "hangs",
                              ["--agent-timeout-s", "15"], "rollout/agent_timeouts")  # a net for the good episodes


def agent_engine_error(out: Path) -> list[Outcome]:
    """The engine raises mid-batch with agents waiting on requests (once per worker): the job fails once, its
    agents get answers, it is re-run; no later call inherits the failed one's agents."""
    return _misbehaving_agent(out, "agent_engine_error", "engine error mid --agent batch", "answers", [],
                              "pipeline/job_errors", fault="agent_engine_error:worker")


# Tools and reward functions a user might write that misbehave (--tools / --reward path/to/file.py:fn).
MISBEHAVING_CODE = """
import os, sys

_calls = [0]


def exits() -> str:
    \"\"\"Calls sys.exit, as a script's argument parsing does.\"\"\"
    sys.exit(2)


def floods() -> str:
    \"\"\"Prints a flood and returns 10 MB of text.\"\"\"
    print("noise " * 200)
    return "y" * (10 << 20)


def spins() -> str:
    \"\"\"A busy loop that never returns.\"\"\"
    while True:
        pass


def holds() -> str:
    \"\"\"One C call that holds the GIL for minutes.\"\"\"
    return str(len(str(7 ** 10 ** 9)))


def leaves(completions, **kwargs):
    _calls[0] += 1
    if _calls[0] == 1:  # each process's first call: the others score
        sys.exit(2)
    return [float(len(c) % 2) for c in completions]
"""


def _misbehaving_tool(out: Path, fn: str, label: str, counted: str, timeout_s: float = 2.0) -> list[Outcome]:
    """Every reply calls the tool `fn` (the tiny model is made to write the call): the run finishes, its calls
    are counted in `counted`. `timeout_s`: --tool-timeout-s, which a tool that never returns waits out at each of
    the run's ~30 calls (the helper's start has its own limit, tool_host.START_TIMEOUT_S)."""
    code = out / "misbehaving_code.py"
    code.write_text(MISBEHAVING_CODE)
    return _misbehaving_code(out, f"tool_{fn}", label, ["--tools", f"{code}:{fn}", "--tool-timeout-s", str(timeout_s),
                                                        "--max-tool-calls", "1"], counted,
                             fault=f'fixed_answer:<tool_call>{{"name": "{fn}"}}</tool_call>')


def tool_exits(out: Path) -> list[Outcome]:
    """A tool that calls sys.exit(): each call's result is its error text (rollout/tool_errors); the run goes on."""
    return _misbehaving_tool(out, "exits", "--tools function calls sys.exit()", "rollout/tool_errors")


def tool_floods(out: Path) -> list[Outcome]:
    """A tool that prints a flood and returns 10 MB: the result is cut to the row's bound and counted
    (rollout/tool_results_truncated); no row outgrows the model's context."""
    return _misbehaving_tool(out, "floods", "--tools function returns 10 MB", "rollout/tool_results_truncated")


def tool_spins(out: Path) -> list[Outcome]:
    """A tool in a busy loop: its process is killed at --tool-timeout-s (rollout/tool_errors), nothing piles up."""
    return _misbehaving_tool(out, "spins", "--tools function spins", "rollout/tool_errors", timeout_s=0.5)


def tool_holds_the_gil(out: Path) -> list[Outcome]:
    """A tool in one C call that holds the GIL for minutes: in its own process it freezes nothing of the worker's
    (the heartbeat goes on), is killed at --tool-timeout-s and counted (rollout/tool_errors)."""
    return _misbehaving_tool(out, "holds", "--tools function holds the GIL", "rollout/tool_errors", timeout_s=0.5)


def reward_exits(out: Path) -> list[Outcome]:
    """A --reward function that calls sys.exit() in each process's first call: those scores fail
    (reward/failed/leaves), the others train; the run finishes."""
    code = out / "misbehaving_code.py"
    code.write_text(MISBEHAVING_CODE)
    return _misbehaving_code(out, "reward_exits", "--reward function calls sys.exit()",
                             ["--reward", f"{code}:leaves"], "reward/failed/leaves")


def worker_start_fails(out: Path) -> list[Outcome]:
    """Every worker start raises: back-off, then a clean stop with the worker's traceback and a checkpoint."""
    shm = shm_entries()
    run = TrainProcess([*PIPELINE, "--max-steps", "40", "--restart-backoff-s", "0.2", "--max-restarts-per-worker", "2",
                        "--run-name", "worker_start"], out, fault="worker_start")
    rc = run.wait()
    text = run.output()
    stopped = (rc == 1 and "failures in a row" in text and "injected fault: worker_start" in text
               and complete_steps(out / "worker_start") == [0])
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
    o.notes.append(f"killed {time.monotonic() - t:.0f} s before; checkpoints then {complete_steps(out / 'learner_kill')}")
    return [killed, _finish(o, resumed, out / "learner_kill", shm)]


def _stop_by_signals(out: Path, name: str, label: str, first: int, then: int, then_after_s: float,
                     expect_rc: int, fault: str | None = None) -> list[Outcome]:
    shm = shm_entries()
    run = TrainProcess([*PIPELINE, "--max-steps", "5000", "--run-name", name], out, fault=fault)
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
    o = Outcome(label, took, rc == expect_rc and took < 10 and last in complete_steps(out / name))
    o.notes.append(f"exit {rc} after {took:.1f} s; checkpoints {complete_steps(out / name)}")
    return [_finish(o, run, out / name, shm)]


def sigint_twice(out: Path) -> list[Outcome]:
    """Ctrl-C, and Ctrl-C again 0.3 s later, while the checkpoint is written (slow_save: it takes 2 s more, as a
    large model's does; a tiny one's stop is over before 0.3 s): the checkpoint is still written; exit 130
    within 10 s."""
    return _stop_by_signals(out, "sigint", "SIGINT twice", signal.SIGINT, signal.SIGINT, 0.3, 130, "slow_save:2")


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
                and last in complete_steps(out / "owned")
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
                and complete_steps(out / name) == [0] and "[done]" not in run.output())
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
                and complete_steps(out / "disk_full") == [4, 6] and not list(d.glob("*tmp*")))
    return [_finish(o, run, out / "disk_full", shm)]


def learner_exception(out: Path) -> list[Outcome]:
    """An exception in the learner: traceback, checkpoint of the last completed step, no final eval, exit 1."""
    shm = shm_entries()
    run = TrainProcess([*PIPELINE, "--max-steps", "40", "--run-name", "exc"], out, fault="learner_step:6")
    rc = run.wait()
    run_dir = out / "exc"
    summary = json.loads((run_dir / "eval.json").read_text()) if (run_dir / "eval.json").exists() else {}
    t_err = run.seen("injected fault: learner_step 6")
    ok = (rc == 1 and "Traceback" in run.output() and t_err is not None and complete_steps(run_dir) == [5]
          and "after" not in summary and not (run_dir / "final_model").exists())
    o = Outcome("learner exception", t_err and time.monotonic() - t_err, ok)
    return [_finish(o, run, run_dir, shm)]


def judge_dies(out: Path) -> list[Outcome]:
    """The LLM judge goes away (connections refused) once it answered 2 steps' requests, in a 2-worker run scored
    by it alone: every later score is retried, then failed (`reward_failed`, reward/failed/judge), never a 0; the
    failed episodes' groups are dropped, no update trains on them, and past --max-skipped-frac (0.5 of 10 steps)
    the run stops as failed (exit 1, no final model) instead of training on zeros."""
    shm = shm_entries()
    judge = StubJudge(die_after=2 * TASKS_PER_STEP * SAMPLES)
    try:
        run = TrainProcess([*PIPELINE, "--judge", judge.url, "--judge-retries", "1", "--judge-timeout-s", "5",
                            "--eval-tasks", "", "--max-steps", "10", "--no-drop-zero-std-groups",
                            "--run-name", "judge_dies"], out)
        rc = run.wait()
    finally:
        judge.close()
    text, episodes = run.output(), read_rollouts(out / "judge_dies")
    failed = [e for e in episodes if e["termination_reason"] == "reward_failed"]
    scored = [e for e in episodes if e["termination_reason"] != "reward_failed"]
    t_seen = run.seen("no reply after 2 attempts", after=judge.closed_at or 0.0)
    o = Outcome("LLM judge gone mid-run", t_seen and t_seen - judge.closed_at,
                bool(failed) and rc == 1 and "updates trained nothing" in text
                and not (out / "judge_dies" / "final_model").exists() and len(scored) == judge.requests and all(e["reward_failed"] == ["judge"] for e in failed)
                and all(e["final_reward"] in (0.2, 0.8) for e in scored))
    o.notes.append(f"{len(scored)} episodes scored, {len(failed)} failed, exit {rc}")
    return [_finish(o, run, out / "judge_dies", shm)]


def judge_drips(out: Path) -> list[Outcome]:
    """An LLM judge that sends its replies one byte a second (never idle long enough for a per-read timeout), in a
    2-worker run scored by it alone: each request is cut at --judge-timeout-s 2, its connection closed, its score
    failed, never a 0; no worker is reported hung (the wait is bounded, so its beat is progress); past
    --max-skipped-frac the run stops as failed (exit 1) and every process exits, none kept by a request reading."""
    shm = shm_entries()
    judge = StubJudge(drip_s=1.0)
    try:
        run = TrainProcess([*PIPELINE, "--judge", judge.url, "--judge-retries", "0", "--judge-timeout-s", "2",
                            "--worker-timeout-s", "5", "--eval-tasks", "", "--max-steps", "4",
                            "--run-name", "judge_drips"], out)
        rc = run.wait()
    finally:
        judge.close()
    text, episodes = run.output(), read_rollouts(out / "judge_drips")
    t_seen = run.seen("no whole reply within --judge-timeout-s 2 s")
    o = Outcome("LLM judge drips one byte a second", t_seen and judge.first_at and t_seen - judge.first_at,
                rc == 1 and "updates trained nothing" in text and "hung" not in text and bool(episodes)
                and all(e["reward_failed"] == ["judge"] for e in episodes) and judge.hung_up > 0)
    o.notes.append(f"exit {rc}; {len(episodes)} episodes failed; {judge.hung_up} replies cut mid-drip")
    return [_finish(o, run, out / "judge_drips", shm)]


def judge_lies(out: Path) -> list[Outcome]:
    """A judge that answers `SCORE: 1e5` or `SCORE: 7.5.3` for half the prompts and `SCORE: 2` followed by the
    response quoted for the others (faultsuite/stub_judge.py lying_score): the garbage is a failed score (never read as
    1 or 7.5), the verdict is 0.2, the failed groups are dropped, the others train; the run finishes."""
    shm = shm_entries()
    judge = StubJudge(lying_score)
    try:
        run = TrainProcess([*PIPELINE, "--judge", judge.url, "--eval-tasks", "", "--max-steps", "3",
                            "--no-drop-zero-std-groups", "--run-name", "judge_lies"], out)
        rc = run.wait()
    finally:
        judge.close()
    episodes = read_rollouts(out / "judge_lies")
    failed = [e for e in episodes if e["termination_reason"] == "reward_failed"]
    scored = [e for e in episodes if e["termination_reason"] != "reward_failed"]
    o = Outcome("LLM judge lies (1e5, 7.5.3)", None, rc == 0 and "step 3/3" in run.output() and bool(failed)
                and bool(scored) and all(e["reward_failed"] == ["judge"] for e in failed)
                and all(e["final_reward"] == 0.2 for e in scored))
    o.notes.append(f"exit {rc}; {len(scored)} episodes scored 0.2, {len(failed)} failed")
    return [_finish(o, run, out / "judge_lies", shm)]


def judge_behind_proxy(out: Path) -> list[Outcome]:
    """Every proxy variable set (a cluster's), pointing at a listener that counts connections, and a judge on
    127.0.0.1 with an API key: the judge is reached directly, every episode is scored, the proxy is offered no
    connection (so never the key) and the judge got the key."""
    shm = shm_entries()
    judge, trap = StubJudge(), ProxyTrap()
    try:
        run = TrainProcess([*PIPELINE, "--judge", judge.url, "--judge-api-key-env", "NANORLLM_JUDGE_KEY",
                            "--eval-tasks", "", "--max-steps", "2", "--no-drop-zero-std-groups",
                            "--run-name", "judge_proxy"], out, env=trap.env() | {"NANORLLM_JUDGE_KEY": "sk-chaos"})
        rc = run.wait()
    finally:
        judge.close()
        trap.close()
    episodes = read_rollouts(out / "judge_proxy")
    o = Outcome("LLM judge on 127.0.0.1 behind a proxy", None,
                rc == 0 and "step 2/2" in run.output() and trap.connections == 0 and judge.keys == {"Bearer sk-chaos"}
                and bool(episodes) and all(e["final_reward"] in (0.2, 0.8) for e in episodes))
    o.notes.append(f"exit {rc}; {judge.requests} judge requests, {trap.connections} proxy connections")
    return [_finish(o, run, out / "judge_proxy", shm)]


def headless_reward_model(folder: Path) -> str:
    """tiny-random's causal-LM weights and tokenizer in `folder`, under a config naming a sequence classifier: loaded
    as one, it would score with a random head."""
    from nanorllm.policy.models import TINY, load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(TINY)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    config = json.loads((Path(folder) / "config.json").read_text())
    config["architectures"] = [a.replace("ForCausalLM", "ForSequenceClassification") for a in config["architectures"]]
    (Path(folder) / "config.json").write_text(json.dumps(config))
    return str(folder)


def reward_model_without_head(out: Path) -> list[Outcome]:
    """A --reward-model folder of causal-LM weights under a sequence-classifier config: refused at start in one line
    naming the head its weights lack (exit 2), before the run folder is made; nothing left running."""
    shm = shm_entries()
    folder = headless_reward_model(out / "headless_rm")
    t = time.monotonic()
    run = TrainProcess([*PIPELINE, "--reward-model", folder, "--max-steps", "2", "--run-name", "rm_headless"], out)
    rc = run.wait()
    errors = [line for line in run.output().splitlines() if "reward_model:" in line]
    o = Outcome("reward-model folder without its head", None, rc == 2 and len(errors) == 1
                and "its weights lack score.weight" in errors[0] and not (out / "rm_headless").exists())
    o.notes.append(f"exit {rc} after {time.monotonic() - t:.1f} s; {errors[0].strip()[:90] if errors else 'no error'!r}")
    return [_finish(o, run, out / "rm_headless", shm)]


# Envs a user might write, saved as files of the run (--env path/to/file.py:Name).
HANGING_ENV = """
import time
from nanorllm.envs.base import EnvBundle

class StuckEnv:
    def __init__(self, *, max_turns): pass
    def reset(self, task): return task["question"]
    def step(self, response):
        while True:  # an env whose step never returns
            time.sleep(1)

class Stuck(EnvBundle):
    env_class = StuckEnv
    default_tasks = "arith:max=20,terms=2,ops=+-,count=200,seed=1"  # math questions; the env grades none
"""
FORKING_ENV = """
import multiprocessing, subprocess
from nanorllm.envs.base import EnvBundle

class ForkingEnv:
    def __init__(self, *, max_turns): pass
    def reset(self, task): return task["question"]
    def step(self, response):
        if multiprocessing.current_process().name.startswith("nanorllm-worker"):
            subprocess.Popen(["sleep", "600"])  # a helper the env starts and never stops
        return None, 0.0, True, {}

class Forking(EnvBundle):
    env_class = ForkingEnv
    default_tasks = "arith:max=20,terms=2,ops=+-,count=200,seed=1"  # math questions; the env grades none
"""


def _env_file(out: Path, name: str, code: str) -> str:
    path = out / f"{name}.py"
    path.write_text(code)
    return f"{path}:{name.capitalize()}"


def serial_env_hang(out: Path) -> list[Outcome]:
    """--serial with an env whose step never returns: the serial watchdog reports a hang in the env with the
    task, the run stops (exit 1) with step 0 saved, nothing left running."""
    shm = shm_entries()
    env = _env_file(out, "stuck", HANGING_ENV)
    run = TrainProcess(["--serial", "--env", env, "--eval-tasks", "", "--max-steps", "4", "--worker-timeout-s", "3",
                        "--run-name", "serial_env_hang"], out)
    rc = run.wait()
    t_seen = run.seen("serial rollout hung: no progress")
    o = Outcome("serial rollout hung in the env", t_seen and t_seen - run.t0,
                rc == 1 and t_seen is not None and f"in the env {env}" in run.output()
                and complete_steps(out / "serial_env_hang") == [0] and "[done]" not in run.output())
    return [_finish(o, run, out / "serial_env_hang", shm)]


def env_forks(out: Path) -> list[Outcome]:
    """An env whose step starts a process it never stops, in 2 workers: the run finishes and, as each worker
    leads its own process group, stopping the workers ends those processes too (processes left: 0)."""
    shm = shm_entries()
    env = _env_file(out, "forking", FORKING_ENV)
    run = TrainProcess([*PIPELINE, "--env", env, "--max-steps", "3", "--eval-tasks", "", "--run-name", "env_forks"],
                       out)
    rc = run.wait()
    o = Outcome("env starts processes in the workers", None, rc == 0 and "step 3/3" in run.output())
    return [_finish(o, run, out / "env_forks", shm)]


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
    saved = complete_steps(out / name)
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
          "eval_grader_hang": eval_grader_hang, "disk_full": disk_full, "serial_env_hang": serial_env_hang,
          "env_forks": env_forks, "agent_worker_kill": agent_worker_kill,
          "agent_exits": agent_exits, "agent_hangs": agent_hangs, "agent_engine_error": agent_engine_error,
          "judge_dies": judge_dies, "judge_drips": judge_drips, "judge_lies": judge_lies,
          "judge_behind_proxy": judge_behind_proxy, "reward_model_without_head": reward_model_without_head,
          "tool_exits": tool_exits, "tool_floods": tool_floods, "tool_spins": tool_spins,
          "tool_holds_the_gil": tool_holds_the_gil, "reward_exits": reward_exits}


def run_suite(out: Path, names: list[str] | None = None) -> int:
    """Run the faults `names` (default: all) with their runs under `out`; print a line each and the table.
    Returns the exit code: 1 on any miss."""
    names = names or list(FAULTS)
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
