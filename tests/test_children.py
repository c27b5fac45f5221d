"""Workers and learner ranks are forks of a fork server (utils/children.py): a child still runs in its caller's
environment and output streams as they were when it started, under its name, and the server's imports leave
CUDA untouched (a process that touched it must not be forked)."""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from nanorllm.faultsuite.proc_scan import name
from nanorllm.utils.children import process

ROOT = Path(__file__).resolve().parents[1]


def _report(tag: str) -> None:
    print(f"out {tag} {os.environ.get('CHILDREN_TEST')} {name(os.getpid())}", flush=True)
    print(f"err {tag} {os.getcwd()}", file=sys.stderr, flush=True)


@pytest.mark.slow
def test_a_child_runs_in_its_callers_environment_streams_and_name(capfd, monkeypatch, tmp_path):
    """Two children of one server: each sees the environment and cwd its caller had when it started, and
    writes to the caller's stdout and stderr of that moment (here the test's captured ones), not the server's
    (started first, on the uncaptured ones)."""
    with capfd.disabled():
        warm = process(int, name="warm", args=())
        warm.start()
        warm.join(timeout=120)
    for tag, cwd in (("first", tmp_path), ("second", tmp_path / "second")):
        cwd.mkdir(exist_ok=True)
        monkeypatch.setenv("CHILDREN_TEST", tag)
        monkeypatch.chdir(cwd)
        p = process(_report, name=f"nanorllm-worker-{tag}", args=(tag,))
        p.start()
        p.join(timeout=120)
        assert p.exitcode == 0
        out, err = capfd.readouterr()
        assert out == f"out {tag} {tag} nanorllm-worker\n"  # the name as ps shows it: 15 characters
        assert err == f"err {tag} {cwd}\n"


@pytest.mark.slow
@pytest.mark.parametrize("preload", ["nanorllm.utils.children", "tests.forked"])
def test_the_fork_servers_imports_call_no_cuda_function(preload):
    """Every torch.cuda function that would start the driver is watched while a fork server's PRELOAD (a run's,
    or the tests' warm launcher's) is imported in a fresh interpreter: none is called (a CUDA child forked from
    a server that had would fail to start)."""
    script = """
import importlib, torch, torch.cuda
calls = []
for fn in ("is_available", "device_count", "init", "_lazy_init", "current_device", "get_device_properties",
           "get_device_name", "get_device_capability", "is_bf16_supported", "mem_get_info", "set_device"):
    setattr(torch.cuda, fn, lambda *a, _fn=fn, **k: calls.append(_fn))
from {preload} import PRELOAD
for module in PRELOAD:
    importlib.import_module(module)
print(sorted(set(calls)), torch.cuda.is_initialized())
""".replace("{preload}", preload)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[] False"


@pytest.mark.slow
def test_a_killed_runs_fork_server_deletes_its_socket_folder_as_it_goes(tmp_path):
    """SIGKILL the launcher: nothing of it runs, yet its fork server, which exits with it, deletes the folder
    multiprocessing made for the server's socket (it deletes it only at an orderly exit of its caller)."""
    from tests.procs import processes_with_token, start_train

    tmp = Path(tempfile.mkdtemp(prefix="nanorllm-", dir="/tmp"))  # short: pytest's own folders can be too long
    try:
        proc, token = start_train(["--num-workers", "1", "--max-steps", "500", "--run-name", "k"], tmp_path,
                                  env={"TMPDIR": str(tmp)})
        for line in proc.stdout:
            if line.startswith("step 1/"):
                break
        assert [p.name[:5] for p in tmp.iterdir() if p.name.startswith("pymp-")] == ["pymp-"]  # the server's, in use
        proc.kill()
        assert proc.wait(timeout=60) == -9
        proc.stdout.close()
        deadline = time.monotonic() + 60  # the children exit by themselves once the launcher is gone
        while processes_with_token(token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_with_token(token) == []
        assert [p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_")] == []  # torch's own cache
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.slow
def test_a_temporary_folder_too_long_for_the_servers_socket_is_refused_by_name_and_serial_runs_need_none(tmp_path):
    from tests.procs import run_train

    tmp = tmp_path / ("t" * 120)
    tmp.mkdir()
    rc, out, _ = run_train(["--num-workers", "1", "--max-steps", "1", "--run-name", "p"], tmp_path,
                           env={"TMPDIR": str(tmp)})
    assert rc == 2, out
    [line] = [x for x in out.splitlines() if x.strip().startswith("TMPDIR:")]
    assert f"TMPDIR: '{tmp}' is too long for the fork server of the run's workers" in line and "Traceback" not in out
    assert not (tmp_path / "p").exists() and list(tmp.iterdir()) == []
    rc, out, _ = run_train(["--serial", "--learner-devices", "2", "--run-name", "r"], tmp_path,
                           env={"TMPDIR": str(tmp)})
    assert rc == 2 and "TMPDIR: " in out, out  # its learner rank 1 is a fork of the server too
    rc, out, _ = run_train(["--serial", "--max-steps", "1", "--run-name", "s"], tmp_path, env={"TMPDIR": str(tmp)})
    assert rc == 0, out
