"""The benchmarks' fresh-process measurement: the first answer comes back, a process that dies or exits
without answering is an error naming it, and no process outlives the call."""

import os
import sys

import pytest

from nanorllm.bench.spawned import spawned_answer


def answer_if_first(i, out):
    if i == 0:
        out.put({"pid": os.getpid(), "i": i})


def die(code, out):
    sys.exit(code)


@pytest.mark.slow
def test_the_first_answer_comes_back_and_every_process_is_gone():
    import psutil

    got = spawned_answer(answer_if_first, [(0,), (1,), (2,)])
    assert got["i"] == 0 and got["pid"] != os.getpid()
    spawned = [c for c in psutil.Process().children(recursive=True) if "--multiprocessing-fork" in c.cmdline()]
    assert spawned == []  # (the resource tracker multiprocessing starts stays, as it does for every spawn)


@pytest.mark.slow
@pytest.mark.parametrize("code", [3, 0])
def test_a_process_that_exits_before_answering_is_an_error(code):
    with pytest.raises(RuntimeError, match=rf"die exited with \[{code}\] before answering"):
        spawned_answer(die, [(code,)])
