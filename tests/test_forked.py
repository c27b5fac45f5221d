"""tests/forked.py: a script run as a fork of a warm interpreter behaves, to its caller, as `python script.py` does."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests import forked

SCRIPT = textwrap.dedent("""
    import atexit, os, subprocess, sys, tempfile, threading, time
    mode = sys.argv[1]
    if mode == "show":
        import forked_probe_helper  # on PYTHONPATH only
        print(repr(sys.argv), os.getcwd(), os.environ.get("FORKED_TEST"), sys.path[0] == os.path.dirname(__file__),
              __name__, forked_probe_helper.NAME, tempfile.gettempdir())
        print(subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('FORKED_TEST'))"],
                             capture_output=True, text=True).stdout.strip())
        print("to stderr", file=sys.stderr)
    elif mode == "import":
        try:
            import forked_probe_helper
            print("importable")
        except ImportError:
            print("not importable")
    elif mode == "exit":
        sys.exit(int(sys.argv[2]) if sys.argv[2].isdigit() else sys.argv[2])
    elif mode == "raise":
        raise ValueError("boom")
    elif mode == "interrupt":
        raise KeyboardInterrupt
    elif mode == "wait":
        print("waiting", flush=True)
        time.sleep(60)
    elif mode == "drip":
        print("first")  # no flush: -u or PYTHONUNBUFFERED must send it before the script ends
        time.sleep(float(sys.argv[2]))
    elif mode == "ending":
        atexit.register(lambda: print("atexit ran"))
        threading.Thread(target=lambda: (time.sleep(0.3), print("thread finished"))).start()
""")


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "scripts" / "probe.py"
    path.parent.mkdir()
    path.write_text(SCRIPT)
    return path


def both(script, *args, **kw):
    """The same command run both ways: (fresh interpreter, fork)."""
    cmd = [sys.executable, str(script), *args]
    return (subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw),
            forked.run(cmd, capture_output=True, text=True, timeout=120, **kw))


@pytest.mark.slow
def test_a_forked_script_sees_its_argv_cwd_environment_and_streams_as_a_fresh_one_does(script, tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "forked_probe_helper.py").write_text("NAME = 'helper'\n")
    env = {**os.environ, "FORKED_TEST": "carried", "TMPDIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(filter(None, ["lib", os.environ.get("PYTHONPATH")]))}
    fresh, fork = both(script, "show", "a b", cwd=tmp_path, env=env)
    assert fork.returncode == fresh.returncode == 0, fork.stderr + fresh.stderr
    assert fork.stdout == fresh.stdout
    assert fork.stdout.splitlines() == [f"['{script}', 'show', 'a b'] {tmp_path} carried True __main__ helper "
                                        f"{tmp_path}", "carried"]
    assert fork.stderr == fresh.stderr == "to stderr\n"
    # what one run had on its path is not on the next one's
    fresh, fork = both(script, "import", cwd=tmp_path)
    assert fork.stdout == fresh.stdout == "not importable\n"


@pytest.mark.slow
@pytest.mark.parametrize("args, code", [(["exit", "3"], 3), (["exit", "bad"], 1), (["raise"], 1),
                                        (["interrupt"], -signal.SIGINT)])
def test_exit_codes_and_uncaught_errors_match_a_fresh_interpreter(script, args, code):
    fresh, fork = both(script, *args)
    assert fork.returncode == fresh.returncode == code
    assert fork.stderr.splitlines()[-1:] == fresh.stderr.splitlines()[-1:]  # "bad", "ValueError: boom", ...


@pytest.mark.slow
def test_the_interpreter_exit_joins_threads_then_runs_atexit(script):
    fresh, fork = both(script, "ending")
    assert fork.stdout == fresh.stdout == "thread finished\natexit ran\n"


@pytest.mark.slow
def test_unbuffered_output_arrives_while_the_run_lives_and_a_signal_ends_it(script):
    proc = forked.Popen([sys.executable, "-u", str(script), "drip", "60"], stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True)
    assert proc.stdout.readline() == "first\n"
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    proc.kill()
    assert proc.wait(timeout=60) == -signal.SIGKILL
    proc.stdout.close()


@pytest.mark.slow
def test_two_runs_at_once_each_get_their_own_exit_code_and_a_timeout_kills(script):
    slow = forked.Popen([sys.executable, str(script), "wait"], stdout=subprocess.PIPE, text=True)
    assert slow.stdout.readline() == "waiting\n"
    quick = forked.run([sys.executable, str(script), "exit", "7"], capture_output=True, text=True, timeout=60)
    assert quick.returncode == 7 and slow.poll() is None
    slow.terminate()
    assert slow.wait(timeout=60) == -signal.SIGTERM
    slow.stdout.close()
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        forked.run([sys.executable, str(script), "wait"], capture_output=True, timeout=1)
    assert time.monotonic() - t0 < 30


def test_only_a_python_script_or_module_can_be_forked(script):
    with pytest.raises(ValueError, match="not \\['bash'\\]"):
        forked.Popen(["bash", "-c", "true"])
    with pytest.raises(ValueError, match="-c"):
        forked.Popen([sys.executable, "-c", "print(1)"])


@pytest.mark.slow
def test_a_forked_training_run_writes_what_a_fresh_one_writes(tmp_path):
    """The launcher itself: the same tiny serial run, fresh and forked, leaves byte-identical weights and episodes."""
    from tests.procs import ROOT, child_env
    from tests.runs import SERIAL

    runs = {}
    for name, start in (("fresh", subprocess.run), ("forked", forked.run)):
        cmd = [sys.executable, str(ROOT / "launch" / "train.py"), *SERIAL, "--max-steps", "2",
               "--output-dir", str(tmp_path), "--run-name", name]
        done = start(cmd, capture_output=True, text=True, timeout=600, env=child_env())
        assert done.returncode == 0, done.stderr[-3000:]
        run = tmp_path / name
        runs[name] = {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*"))
                      if p.is_file() and (p.parent.name == "final_model" or p.name == "rollouts.jsonl")}
    assert len(runs["fresh"]) >= 3 and runs["forked"] == runs["fresh"]


def test_a_missing_working_folder_is_refused_in_the_caller_as_subprocess_refuses_it(script, tmp_path):
    for start in (subprocess.run, forked.run):
        with pytest.raises(FileNotFoundError):
            start([sys.executable, str(script), "exit", "0"], cwd=tmp_path / "missing")
