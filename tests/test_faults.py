"""Faults, injected into real 2-worker tiny runs (nanorllm/faultsuite/suite.py), and the pieces that make them safe."""

import contextlib
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque

import pytest
import torch.multiprocessing as mp

from nanorllm.faultsuite import suite
from nanorllm.faultsuite.ledger import groups_of, read_rollouts
from nanorllm.faultsuite.process import TrainProcess
from nanorllm.faultsuite.proc_scan import processes_with_token, shm_entries, shm_held
from nanorllm.pipeline.channel import Inbox, Outbox, frame
from nanorllm.pipeline.heartbeat import Heartbeat
from nanorllm.trainer.checkpoint import complete_steps
from nanorllm.utils.logger import RunLogger
from tests.helpers import WAIT_S, wait_until
from tests.procs import ROOT, read_scalars


def _assert_ok(outcome: suite.Outcome) -> None:
    assert outcome.ok, f"{outcome.row()} {outcome.notes}\n{outcome.output[-4000:]}"


# ---- whole runs ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_hung_worker_is_reported_killed_and_replaced_without_losing_a_group(tmp_path):
    o, = suite.worker_hang(tmp_path)  # SIGSTOP at step 3, --worker-timeout-s 3
    _assert_ok(o)
    assert o.detected_s is not None and o.detected_s >= 3  # the missed heartbeats, never before the limit
    report = next(line for line in o.output.splitlines() if "hung (no progress" in line)
    assert "[pipeline] worker 0 on cpu hung" in report and "re-issuing" in report
    assert ") while " in report  # what it was last doing
    assert read_scalars(tmp_path / "worker_hang")["pipeline/worker_hangs"][-1][1] == 1


@pytest.mark.slow
def test_an_agent_worker_killed_mid_request_is_restarted_and_its_episodes_re_run_once(tmp_path):
    o, = suite.agent_worker_kill(tmp_path)  # the agent SIGKILLs its worker while other requests decode there
    _assert_ok(o)
    assert read_scalars(tmp_path / "agent_kill")["pipeline/worker_restarts"][-1][1] == 1


@pytest.mark.slow
def test_worker_killed_while_writing_a_large_result_does_not_block_the_learner(tmp_path):
    o, = suite.torn_result(tmp_path)  # 8 MB message, SIGKILL halfway through the write
    _assert_ok(o)
    assert o.detected_s is not None  # the death was seen ("died (killed by SIGKILL)") ...
    assert "hung (no progress" not in o.output  # ... as a death, not by waiting out the hang limit


@pytest.mark.slow
def test_worker_failing_at_every_start_stops_the_run_with_its_traceback(tmp_path):
    o, = suite.worker_start_fails(tmp_path)  # back-off 0.2 s, at most 2 restarts in a row
    _assert_ok(o)
    assert "restarting it in 0.2 s" in o.output and "restarting it in 0.4 s" in o.output  # backs off
    assert o.output.count("restarting it in") <= 4  # two per worker, then the cap
    assert "Its last error:" in o.output and "RuntimeError: injected fault: worker_start" in o.output
    assert not (tmp_path / "worker_start" / "final_model").exists()


@pytest.mark.slow
def test_learner_sigkill_leaves_no_process_and_resume_trains_every_group_once(tmp_path):
    killed, resumed = suite.learner_kill(tmp_path)  # kill -9 at step 9 (checkpoint at 8), resume to 30
    _assert_ok(killed)
    assert killed.detected_s < 10
    _assert_ok(resumed)
    assert "[resume] from" in resumed.output and "step_8" in resumed.output


@pytest.mark.slow
def test_sigint_twice_still_saves_the_last_step_and_exits_130(tmp_path):
    o, = suite.sigint_twice(tmp_path)
    _assert_ok(o)
    assert "already stopping" in o.output


@pytest.mark.slow
def test_sigterm_saves_and_exits_143_within_a_container_grace(tmp_path):
    o, = suite.sigterm_then_kill(tmp_path)
    _assert_ok(o)
    assert o.detected_s < 10


@pytest.mark.slow
def test_sighup_is_a_stop_that_saves_first_and_exits_129(tmp_path):
    o, = suite.sighup(tmp_path)
    _assert_ok(o)
    assert "[signal] SIGHUP: " in o.output  # "stopping", or "noted" when it lands inside a committing step
    assert not (tmp_path / "sighup" / "rollouts.jsonl.tmp").exists()


@pytest.mark.slow
def test_a_second_process_on_a_live_run_folder_is_refused_naming_the_owner(tmp_path):
    o, = suite.second_owner(tmp_path)
    _assert_ok(o)
    assert o.detected_s < 60  # before it loads anything but the launcher's imports


@pytest.mark.slow
def test_learner_exception_is_not_a_finished_run(tmp_path):
    o, = suite.learner_exception(tmp_path)  # raises before step 6: checkpoint step_5, no final eval
    _assert_ok(o)
    assert "[done]" not in o.output and "[eval] step 5" not in o.output


@pytest.mark.slow
def test_golds_no_parser_finishes_train_in_a_pipeline_run_with_counted_timeouts(tmp_path):
    """A worker grading a nested power (and a 5,001-digit gold) goes on: each check is cut at the CPU
    budget and counted, the first step with one names its task; nothing is reported hung."""
    o, = suite.unbounded_golds(tmp_path)
    _assert_ok(o)
    scalars = read_scalars(tmp_path / "unbounded")
    assert sum(v for _, v in scalars["reward/grader_timeouts"]) >= 2
    assert scalars["eval/grader_timeouts"][0][1] >= 1


@pytest.mark.slow
def test_a_worker_hung_in_the_grader_is_reported_as_grading_with_its_task(tmp_path):
    o, = suite.worker_grader_hang(tmp_path)
    _assert_ok(o)
    report = next(line for line in o.output.splitlines() if "hung (no progress" in line)
    assert re.search(r"while grading \(job 0\.\d+, task arith-\S+\)", report), report


@pytest.mark.slow
def test_a_grader_hung_in_held_out_eval_stops_the_run_naming_the_task(tmp_path):
    o, = suite.eval_grader_hang(tmp_path)
    _assert_ok(o)
    assert re.search(r"held-out evaluation hung: .* while grading \(task \S+\)", o.output), o.output[-3000:]


@pytest.mark.slow
def test_a_full_disk_at_a_periodic_save_in_a_pipeline_run(tmp_path):
    o, = suite.disk_full(tmp_path)
    _assert_ok(o)


@pytest.mark.slow
def test_a_judge_gone_mid_pipeline_run_fails_its_scores_never_trains_them_as_zeros_and_stops_the_run(tmp_path):
    o, = suite.judge_dies(tmp_path)  # the stub judge answers 2 steps' 16 requests, then refuses connections
    _assert_ok(o)
    assert o.detected_s is not None  # its first failed score was reported, after the retry
    episodes = read_rollouts(tmp_path / "judge_dies")
    failed = sum(e["termination_reason"] == "reward_failed" for e in episodes)
    scalars = read_scalars(tmp_path / "judge_dies")
    assert sum(v for _, v in scalars["reward/failed/judge"]) == failed > 0
    assert all(v == 0 for _, v in scalars["train/skipped_nan"])  # dropped before the loss: no NaN reached it


@pytest.mark.slow
def test_a_judge_that_drips_its_replies_is_cut_at_its_deadline_and_the_run_stops_as_failed_with_nothing_left(tmp_path):
    o, = suite.judge_drips(tmp_path)  # one byte a second, --judge-timeout-s 2, --worker-timeout-s 5
    _assert_ok(o)
    assert o.procs_left == 0 and "hung" not in o.output  # bounded waits are progress, and nothing outlives the run
    assert o.detected_s is not None and o.detected_s < 10  # at the deadline, not at the reply's ~300th byte
    scalars = read_scalars(tmp_path / "judge_drips")
    assert sum(v for _, v in scalars["reward/failed/judge"]) == len(read_rollouts(tmp_path / "judge_drips")) > 0


@pytest.mark.slow
def test_a_judge_that_lies_fails_those_scores_and_its_verdicts_train(tmp_path):
    o, = suite.judge_lies(tmp_path)  # 'SCORE: 1e5' / 'SCORE: 7.5.3' for half the prompts, 'SCORE: 2' + a quote
    _assert_ok(o)
    assert "does not hold a plain number" in o.output
    assert [v for _, v in read_scalars(tmp_path / "judge_lies")["reward/judge"]] == [pytest.approx(0.2)] * 3


@pytest.mark.slow
def test_a_loopback_judge_behind_a_proxy_scores_every_episode_and_the_proxy_sees_nothing(tmp_path):
    o, = suite.judge_behind_proxy(tmp_path)  # every proxy variable set to a listener that counts connections
    _assert_ok(o)
    assert "proxy connections" in o.notes[0] and ", 0 proxy connections" in o.notes[0]


@pytest.mark.slow
def test_a_reward_model_folder_without_its_head_is_refused_at_start_in_one_line(tmp_path):
    o, = suite.reward_model_without_head(tmp_path)  # tiny-random's causal-LM weights under a classifier config
    _assert_ok(o)
    assert "exit 2" in o.notes[0]


@pytest.mark.slow
def test_a_serial_rollout_hung_in_the_env_stops_the_run_naming_the_env_and_task(tmp_path):
    o, = suite.serial_env_hang(tmp_path)  # --serial, an env.step that never returns, --worker-timeout-s 3
    _assert_ok(o)
    report = next(line for line in o.output.splitlines() if "[watchdog] serial rollout hung" in line)
    assert re.search(r"\(limit 3 s\) while grading \(task arith-s1-\d+\) in the env \S+stuck.py:Stuck$", report), report
    assert "[checkpoint]" in o.output and "[failed]" in o.output


@pytest.mark.slow
def test_processes_an_env_starts_in_a_worker_end_with_the_worker(tmp_path):
    o, = suite.env_forks(tmp_path)  # each step starts a `sleep 600`; processes left is counted by the token
    _assert_ok(o)
    assert o.procs_left == 0


# ---- the pieces ----------------------------------------------------------------------------------
def test_a_first_stop_signal_raises_only_inside_the_interruptible_window_and_never_while_committing(capsys):
    """Where the run may be cut short, the first signal raises KeyboardInterrupt unless a step is committing; outside
    that window, and after the first, a signal is only noted, and a window opened once one came stays shut."""
    from nanorllm.trainer.signals import StopSignals, StopState

    def raised(*, committing: bool, window: bool) -> bool:
        stop = StopState(committing=committing)
        signals = StopSignals(stop)
        try:
            with signals.interruptible() if window else contextlib.nullcontext():
                signal.raise_signal(signal.SIGHUP)
            with signals.interruptible():
                signal.raise_signal(signal.SIGHUP)  # a later one is only noted
            return False
        except KeyboardInterrupt:
            return True
        finally:
            signals.restore()
            assert stop.requested and signals.exit_code == 129 and not signals.may_raise

    assert raised(committing=False, window=True)
    assert not raised(committing=True, window=True) and not raised(committing=False, window=False)
    out = capsys.readouterr().out
    assert out.count("[signal] SIGHUP: stopping;") == 1 and out.count("[signal] SIGHUP: noted;") == 2
    assert out.count("already stopping") == 2


def _pipe():
    r, w = mp.get_context("spawn").Pipe(duplex=False)
    return r, w


def _returns(call):
    """call()'s result from a thread, or a failure if it still blocks after WAIT_S (not a hung test)."""
    out = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    thread.join(WAIT_S)
    assert out, f"still blocked after {WAIT_S:.0f} s"
    return out[0]


@pytest.mark.slow
def test_inbox_returns_whole_messages_and_never_waits_for_a_torn_one():
    r, w = _pipe()
    inbox = Inbox(r)
    w.send({"n": 1})
    payload = pickle.dumps({"n": 2, "pad": b"x" * 100_000})
    os.write(w.fileno(), frame(payload) + payload[:5000])  # a writer that died halfway
    assert _returns(lambda: [inbox.read(), inbox.read()]) == [[{"n": 1}], []]  # a read that waited would wait forever
    w.close()
    assert inbox.read() == [] and inbox.eof


@pytest.mark.slow
def test_outbox_never_blocks_on_a_full_pipe_and_delivers_in_order():
    r, w = _pipe()
    outbox = Outbox(w)
    _returns(lambda: [outbox.put({"i": i, "pad": b"x" * 50_000}) for i in range(20)])  # 1 MB into a 64 KB pipe
    assert outbox.pending  # nobody reads it yet: a put that waited would wait forever
    got = []
    reader = threading.Thread(target=lambda: got.extend(r.recv()["i"] for _ in range(20)), daemon=True)
    reader.start()  # a worker: blocking reads, while the learner flushes when it can

    def delivered():
        outbox.flush()
        return not reader.is_alive()

    assert wait_until(delivered)
    assert got == list(range(20))


def test_heartbeat_silence_grows_until_the_next_beat():
    hb = Heartbeat(2)
    hb.reset(1)
    hb.doing(1, "generating", "3.1")
    assert hb.silence(1) == 0.0
    time.sleep(0.2)
    assert hb.silence(1) >= 0.2
    hb.beat(1)
    assert hb.silence(1) == 0.0
    assert hb.describe(1) == "generating (job 3.1)"
    hb.doing(1, "grading", "3.1", task=1)
    assert hb.describe(1, {"3.1": ["a", "b"]}) == "grading (job 3.1, task b)"
    assert hb.describe(1) == "grading (job 3.1)"


def test_a_live_processs_queue_semaphores_count_as_held_and_go_with_the_queue():
    """A run's "nothing left in /dev/shm" check must not count a test running beside it: a spawn-context Queue's
    three named semaphores are mapped under glibc's temporary names, and are held by inode."""
    q = mp.get_context("spawn").Queue()
    made = {"sem" + lock._semlock.name.replace("/", ".") for lock in (q._rlock, q._wlock, q._sem)}  # this Queue's own
    assert made <= shm_entries() and made <= shm_held()
    del q
    assert not made & shm_entries()


@pytest.mark.slow
def test_a_child_exits_by_itself_when_its_parent_is_killed():
    """The child says when die_with_parent has returned (its line comes through the parent's pipe, which
    it shares), and only then is the parent killed; the test then waits for the last process to go.
    The 60 s bound is a net under a child that never exits, not a guess at how fast it goes."""
    token = f"lifeline-{os.getpid()}-{time.time()}"
    child = ("import os, time; from nanorllm.utils.lifeline import die_with_parent; "
             "die_with_parent(os.getppid()); print('armed', flush=True); time.sleep(120)")
    parent = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); "
              "print('started', flush=True); time.sleep(120)")  # then EOF: a child that never arms fails the test
    env = {**os.environ, "NANORLLM_TEST_TOKEN": token, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", parent], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "started"
        assert proc.stdout.readline().strip() == "armed"  # the child is past die_with_parent
        assert len(processes_with_token(token)) == 2
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 60
        while processes_with_token(token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with_token(token) == []
    finally:
        for pid in processes_with_token(token):  # a failed test leaves nothing running
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("purge_step, kept", [(None, [1, 2, 3, 4]), (3, [1, 2])])
def test_resumed_logger_cuts_rollouts_back_to_the_checkpoint(tmp_path, purge_step, kept):
    recs = [{"step": s, "group_id": f"t@{s}"} for s in (1, 2, 3, 4)]
    (tmp_path / "rollouts.jsonl").write_text("".join(f'{{"step": {r["step"]}, "group_id": "{r["group_id"]}"}}\n'
                                                      for r in recs))
    logger = RunLogger(tmp_path, purge_step=purge_step)
    logger.close()
    assert [r["step"] for r in read_rollouts(tmp_path)] == kept
    assert isinstance(logger.recent, deque)


@pytest.mark.slow
def test_serial_stop_mid_rollout_then_resume_trains_every_group_once(tmp_path):
    """Serial mode draws a step's tasks just before its rollout: a stop in that rollout must checkpoint
    the position *before* the draw, or the resumed run skips (or repeats) those groups. The run is asked
    for far more steps than it reaches, so however late the signal lands on a busy machine it stops the
    run; the resume then trains 8 steps past the checkpoint."""
    args = ["--serial", "--max-steps", "5000", "--rollout-dump-size", "100000", "--run-name", "serial_stop"]
    run = TrainProcess(args, tmp_path)  # far more steps than it reaches: the stop, not the end, ends it
    run.wait_for("step 4/")
    run.signal(signal.SIGINT)
    assert run.wait() == 130, run.output()
    saved = complete_steps(tmp_path / "serial_stop")
    assert saved and saved[-1] >= 4, saved
    end = saved[-1] + 8
    resumed = TrainProcess(["--resume", str(tmp_path / "serial_stop"), "--max-steps", str(end)], tmp_path,
                           token=run.token)
    assert resumed.wait() == 0, resumed.output()
    assert f"step_{saved[-1]}" in resumed.output() and f"step {end}/{end}" in resumed.output()
    lost, doubled, steps = groups_of(tmp_path / "serial_stop")
    assert (lost, doubled, steps) == (0, 0, end)
