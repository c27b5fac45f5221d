"""Rollout worker process: a policy replica that turns jobs (groups of tasks) into episodes.

Loop: take a job -> wait until the shared weights are at least the job's `min_version` (this is
how `max_policy_lag` is enforced before any token is sampled) -> reload weights only if the
version moved -> run every episode of the job in one RolloutEngine call -> hand the RolloutResults
(plain Python data), tagged with the weights version and timings, to a sender thread that writes
them to the learner, so the next job can start while a large result is still being written.

Staying honest with the learner, which must be able to tell a slow worker from a dead or hung one:
- it exits by itself when the learner dies (`lifeline`);
- it beats a shared heartbeat on every decode step (from the engine's loop: replayed CUDA graphs run
  no forward hooks), between graph captures and on every poll, with what it is doing (generating,
  or grading which task);
- the stop signal is a flag in shared memory, so there is no lock for a dying process to hold;
- any exception outside an episode is sent to the learner as a message and printed here, so a
  worker that cannot start still says why. An exception inside a job fails only that job; an out-of-memory
  error stops the worker (said as such), which restarts like any worker that died.
Workers ignore SIGINT: Ctrl-C goes to the launcher, which saves, then stops them. Each worker leads its
own process group, so the processes an env's code starts go with it when the pool stops it.
"""

import os
import pickle
import queue
import signal
import sys
import threading
import time
import traceback

import torch

from nanorllm.pipeline.channel import frame
from nanorllm.utils.lifeline import die_with_parent
from nanorllm.pipeline.messages import Fatal, Job, JobDone, JobFailed, JobTimes, Ready, WorkerStart
from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.envs.registry import load_bundle
from nanorllm.policy.lora import trainable_parameters
from nanorllm.trainer.training_engine import training_engine
from nanorllm.rollout.engine import EXAMPLE_TASK
from nanorllm.utils.devices import configure_threads
from nanorllm.utils.faults import fault


class _Sender:
    """The one thread that writes this worker's messages to the learner, in order."""

    def __init__(self, conn, maxsize: int, torn: bool):
        self.conn, self.torn = conn, torn
        self.q: queue.Queue = queue.Queue(maxsize=maxsize)
        threading.Thread(target=self._run, name="sender", daemon=True).start()

    def _run(self) -> None:
        while True:
            msg = self.q.get()
            try:
                if self.torn and isinstance(msg, JobDone):
                    self._die_mid_write(msg)
                self.conn.send(msg)
            except OSError:
                os._exit(1)  # the learner closed its end: it is gone
            self.q.task_done()

    def _die_mid_write(self, msg: JobDone) -> None:
        payload = pickle.dumps((msg, b"x" * (8 << 20)))
        print("[fault] worker 0: SIGKILL halfway through writing a result", file=sys.stderr, flush=True)
        os.write(self.conn.fileno(), frame(payload) + payload[:len(payload) // 2])
        os.kill(os.getpid(), signal.SIGKILL)

    def put(self, msg, *, waiting) -> None:
        """Queue a message; while the queue is full, call `waiting()` every 0.1 s."""
        while True:
            try:
                return self.q.put(msg, timeout=0.1)
            except queue.Full:
                waiting()

    def drain(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.q.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)


def worker_main(worker_id: int, incarnation: int, start: WorkerStart, device: str, threads: int | None,
                num_processes: int, jobs, results, weights, heartbeat, stop: torch.Tensor, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    os.setpgid(0, 0)  # its own process group: stopping it also ends whatever an env started (WorkerPool.remove)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sender = _Sender(results, start.cfg.queue_size, torn=fault("torn_result") is not None and worker_id == 0
                     and incarnation == 0)
    try:
        _serve(worker_id, start, device, threads, num_processes, jobs, sender, weights, heartbeat, stop,
               inject_oom=fault("worker_oom") is not None and worker_id == 0 and incarnation == 0)
    except BaseException as e:
        error = traceback.format_exc()
        if isinstance(e, torch.OutOfMemoryError):  # the whole process restarts: its memory goes back
            error = f"out of memory on {device}; the run's plan: see its [memory] line\n{error}"
        print(f"[worker {worker_id}] stopped by an error:\n{error}", file=sys.stderr, flush=True)
        sender.put(Fatal(worker_id, error), waiting=lambda: None)
        sender.drain(timeout_s=5.0)
        sys.exit(1)


def _serve(wid: int, start: WorkerStart, device: str, threads, num_processes: int, jobs, sender: _Sender, weights,
           hb, stop: torch.Tensor, *, inject_oom: bool = False) -> None:
    cfg = start.cfg
    hb.doing(wid, "starting")
    if device.startswith("cuda"):
        torch.cuda.set_device(device)  # this process's default device, for allocations we do not place
    configure_threads(device, threads, num_processes)
    if fault("worker_start") is not None:
        raise RuntimeError("injected fault: worker_start")
    # stored in the compute dtype (bf16 replicas sample in bf16); under LoRA with the learner's adapters
    policy = HFCausalPolicy.from_name(cfg.model, device=device, dtype=cfg.dtype, seed=cfg.seed, replica=True,
                                      lora=start.lora)
    policy.graphs_enabled = cfg.cuda_graphs
    # the replica's published parameters (all, or its LoRA adapters) as one block: a load is one copy
    block = weights.attach(policy.model, params=trainable_parameters(policy.model))
    policy.version, load_s = weights.load_into(block)  # in place: captured graphs read the new weights
    engine = training_engine(policy, cfg, load_bundle(start.env), pool_dir=start.pool_dir)
    engine.on_step = lambda: hb.beat(wid)  # progress inside a long generation
    hb.doing(wid, "capturing decode graphs")
    capture_s = engine.prepare(EXAMPLE_TASK, cfg.tasks_per_step * cfg.num_samples_per_task,  # at most one step a job
                               on_progress=lambda: hb.beat(wid))
    if capture_s:
        print(f"[worker {wid}] decode graphs captured in {capture_s:.1f} s", flush=True)
    sender.put(Ready(wid, policy.version, load_s, capture_s or 0.0), waiting=lambda: hb.beat(wid))
    # Time since the last report, by what the worker was doing: the learner reads the shares.
    acc, t_mark = JobTimes(load_s=load_s, loads=1), time.perf_counter()
    while not stop[0]:
        hb.doing(wid, "waiting for a job")
        t0 = time.perf_counter()
        if not jobs.poll(0.05):
            acc.idle_s += time.perf_counter() - t0
            continue
        job = jobs.recv()
        acc.idle_s += time.perf_counter() - t0
        if not isinstance(job, Job):  # Stop
            break
        hb.doing(wid, "waiting for weights", job.job_id)
        t0 = time.perf_counter()
        while weights.version < job.min_version and not stop[0]:
            time.sleep(0.002)
            hb.beat(wid)
        acc.weight_wait_s += time.perf_counter() - t0
        if stop[0]:
            break
        if weights.version != policy.version:
            hb.doing(wid, "loading weights", job.job_id)
            policy.version, s = weights.load_into(block)
            acc.load_s += s
            acc.loads += 1
        hb.doing(wid, "generating", job.job_id)
        engine.watch = lambda activity, task, jid=job.job_id: hb.doing(wid, activity, jid, task)
        t_run = time.perf_counter()
        try:
            if inject_oom:
                raise torch.OutOfMemoryError("injected fault: worker_oom")
            out = engine.run(job.tasks, num_samples=job.num_samples, group_ids=job.group_ids, seed=job.seed)
            for r in out.results:
                r.worker_id = wid
            msg = JobDone(job.job_id, wid, policy.version, out.results, acc, out.timings)
        except torch.OutOfMemoryError:
            raise  # not this job's fault: the process restarts (its allocator's memory with it), the job is re-issued
        except Exception:
            msg = JobFailed(job.job_id, wid, policy.version, traceback.format_exc(), acc)
        now = time.perf_counter()
        acc.rollout_s, acc.wall_s = now - t_run, now - t_mark
        hb.doing(wid, "waiting to hand a result to the learner", job.job_id)
        t0 = time.perf_counter()
        sender.put(msg, waiting=lambda: hb.beat(wid))  # bounded: waits (and counts it) when the learner is behind
        acc, t_mark = JobTimes(queue_wait_s=time.perf_counter() - t0), now
    hb.doing(wid, "stopping")
