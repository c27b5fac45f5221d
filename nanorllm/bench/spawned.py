"""A benchmark's measurement in fresh processes: each starts clean (its own peak RSS, its own threads, no
state of an earlier measurement), and the first answer one of them puts on the queue comes back."""

import queue

import torch.multiprocessing as mp


def spawned_answer(target, arg_tuples: list[tuple], *, join_s: float = 30.0):
    """Start target(*args, out) in a spawned process for each of `arg_tuples` and return the first value any
    of them puts on `out`; RuntimeError as soon as one exits before that (with a non-zero code, or all of
    them with none). Once there is an answer, a slow teardown is not a failure: each process gets `join_s`
    to exit, then is killed."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, out)) for args in arg_tuples]
    for p in procs:
        p.start()
    try:
        while True:
            codes = [p.exitcode for p in procs]  # read first: what a process put before it exited is in the pipe by now
            try:
                return out.get(timeout=1.0)
            except queue.Empty:
                if any(c not in (None, 0) for c in codes) or all(c is not None for c in codes):
                    raise RuntimeError(f"{target.__name__} exited with {codes} before answering") from None
    finally:
        for p in procs:
            p.join(timeout=join_s)
            if p.is_alive():
                p.kill()
