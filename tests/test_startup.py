"""A run's start-up line: every phase from the process's start to the first step, adding up to the whole."""

import re
import subprocess
import sys
import time

import pytest

from nanorllm.utils.startup import StartupClock, process_start

PHASES = r"\[startup\] ([\d.]+) s to the first step: (.*)"


def test_laps_give_each_phase_the_time_since_the_last_and_sum_to_the_whole(monkeypatch):
    now = iter([10.0, 10.5, 12.0, 12.25, 13.0])
    monkeypatch.setattr("nanorllm.utils.startup.time.time", lambda: next(now))
    clock = StartupClock(origin=9.0)
    for phase in ("imports", "model", "eval", "model"):
        clock.lap(phase)
    assert clock.phases == {"imports": 1.0, "model": 0.5 + 0.25, "eval": 1.5}
    assert clock.total == 3.25 and clock.line() == "[startup] 3.2 s to the first step: imports 1.0 | model 0.8 | eval 1.5"


def test_the_process_start_is_the_interpreters_start_not_the_clocks():
    script = ("import time; t = time.time(); time.sleep(0.5); from nanorllm.utils.startup import process_start; "
              "print(t - process_start())")
    before = time.time()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    interpreter_start = float(out.stdout)  # seconds from the process's start to the script's first line
    assert 0 <= interpreter_start < time.time() - before
    assert process_start() <= time.time()


@pytest.mark.slow
def test_a_launched_run_prints_every_phase_once_and_they_add_up_to_its_total(pipeline_run):
    (total, listed), = re.findall(PHASES, pipeline_run["output"])
    phases = {name: float(s) for name, s in (part.rsplit(" ", 1) for part in listed.split(" | "))}
    assert list(phases) == ["imports", "assembly", "model", "checks", "parity", "setup", "workers start", "eval",
                            "workers load"]
    assert abs(sum(phases.values()) - float(total)) <= 0.05 * len(phases) + 0.05  # each rounded to 0.1
    assert phases["imports"] > 0.5  # a fresh interpreter imports torch and transformers before its first line


@pytest.mark.slow
def test_a_run_started_from_python_counts_from_its_call_and_reaches_its_first_step_when_the_line_says(tmp_path):
    from nanorllm.config import TrainConfig
    from nanorllm.run.lifecycle import run_training

    reached = []
    cfg = TrainConfig(model="tiny-random", serial=True, max_steps=1, tasks_per_step=2, num_samples_per_task=2,
                      max_new_tokens=8, eval_limit=2, threads=1, output_dir=str(tmp_path), run_name="r")
    called = time.time()
    out = run_training(cfg, quiet=True, on_step=lambda run, n: reached.append(time.time()) if not reached else None)
    assert out.exit_code == 0 and list(out.startup) == ["assembly", "model", "checks", "parity", "setup", "engine",
                                                        "eval", "capture"]
    phases = sum(v for k, v in out.startup.items() if k != "capture")
    assert 0 <= (reached[0] - called) - phases < 1.0  # what is left: the line's own print, and the call's return
