"""Fault injection for the fault suite (faultsuite/suite.py) and the tests; inert unless NANORLLM_FAULT is set.

Faults that come from outside (SIGKILL, SIGSTOP, Ctrl-C) need no hook. These are the ones that
must happen at a precise point inside a process. NANORLLM_FAULT is a comma-separated list of:

    worker_start     every worker process raises while starting, before it takes a job
    torn_result      worker 0's first process SIGKILLs itself halfway through writing its first
                     result, padded to 8 MB (a worker killed while it writes a large message)
    learner_step:N   the learner raises an exception when it is about to train step N
    disk_full:N      writing step N's checkpoint fails with ENOSPC after the model files are written
    disk_full:final  writing final_model/ fails with ENOSPC after the model files are written, before merged/
    slow_save:S      writing a checkpoint takes S seconds more after the model files are written (a large
                     model's save on a slow disk)
    nan_weights:N    one weight turns NaN as step N's update starts (an update that diverged)
    learner_oom:N    the learner raises torch.OutOfMemoryError as step N's update starts (a CUDA OOM there)
    worker_oom       worker 0's first process raises torch.OutOfMemoryError in its first job (a decode OOM)
    grader_hang      every env step sleeps for an hour (a grader stuck where no timeout reaches)
    agent_engine_error[:worker]  the first --agent rollout of each process (with `worker`: of each rollout
                     worker process) raises at its third decode step, agents waiting on requests (an
                     engine error mid-batch)
    fixed_answer:T   every response is graded as if it were T (a model that always answers T, e.g.
                     \\boxed{1}: the tiny random model never closes a box, so it never reaches the grader)

Each phase has one hook: `before_update` in the training loop, `env_response` where the rollout
engine hands a response to the env, `agent_engine_step` in the --agent loop, and the worker's and
checkpoint's own `fault(...)` checks.
"""

import os
import time


def fault(name: str) -> str | None:
    """The injected fault's argument ('' if it has none), or None when `name` is not injected."""
    for item in os.environ.get("NANORLLM_FAULT", "").split(","):
        key, _, arg = item.partition(":")
        if key.strip() == name:
            return arg.strip()
    return None


def before_update(step: int, params: list) -> None:
    """The training loop's hook, just before step `step`'s update: learner_step:N raises, nan_weights:N
    turns the first of the (name, parameter) pairs that train NaN."""
    if fault("learner_step") == str(step):
        raise RuntimeError(f"injected fault: learner_step {step}")
    if fault("learner_oom") == str(step):
        import torch

        raise torch.OutOfMemoryError(f"injected fault: learner_oom {step}")
    if fault("nan_weights") == str(step):
        import torch

        with torch.no_grad():
            params[0][1].view(-1)[0] = float("nan")


def env_response(response: str) -> str:
    """The rollout engine's hook on what the env is handed: fixed_answer:T replaces it, grader_hang never returns."""
    if fault("grader_hang") is not None:
        time.sleep(3600)
    return fault("fixed_answer") or response


_agent_steps = [0]  # decode steps of --agent rollouts in this process


def agent_engine_step() -> None:
    """The --agent loop's hook on every decode step: agent_engine_error raises once per process, at the third."""
    where = fault("agent_engine_error")
    if where is not None:
        import multiprocessing

        if where == "worker" and not multiprocessing.current_process().name.startswith("nanorllm-worker"):
            return
        _agent_steps[0] += 1
        if _agent_steps[0] == 3:
            raise RuntimeError("injected fault: agent_engine_error")
