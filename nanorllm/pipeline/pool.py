"""WorkerPool: starts, watches, restarts (after a back-off) and stops the rollout worker processes.

Each worker slot has its own pipes (see channel.py) and a row of the shared heartbeat; a restarted
worker gets fresh pipes, so nothing a dead process half-wrote is ever read. The stop signal is a
flag in shared memory, not a multiprocessing.Event: an Event has a lock that a worker killed while
checking it would hold forever. Nothing here creates a named semaphore, so a SIGKILLed learner
leaves no /dev/shm entry behind. Workers are forks of a fork server that imported their code once
(utils/children.py): no fork of a process that holds threads and CUDA state.
"""

import os
import signal
import time
from multiprocessing.connection import Pipe, wait

import torch

from nanorllm.pipeline.channel import Inbox, Outbox
from nanorllm.pipeline.heartbeat import Heartbeat
from nanorllm.pipeline.messages import Job, Stop, WorkerMessage, WorkerStart
from nanorllm.pipeline.worker import worker_main
from nanorllm.rewards.sources import reward_source_names
from nanorllm.utils.children import process


def kill_group(pgid: int) -> None:
    """SIGKILL every process left in the process group `pgid` (none, or one that is not ours: nothing)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class WorkerPool:
    def __init__(self, start: WorkerStart, weights, devices: list[str], *, threads: int | None, num_processes: int):
        self.start, self.cfg, self.weights, self.devices = start, start.cfg, weights, devices
        self.threads, self.num_processes = threads, num_processes
        self.stop_flag = torch.zeros(1, dtype=torch.int64).share_memory_()
        self.heartbeat = Heartbeat(len(devices), env_name=self.cfg.env,
                                   reward_names=tuple(reward_source_names(start.env.reward_sources)))
        self.procs, self.outbox, self.inbox = {}, {}, {}
        self.started = {wid: 0 for wid in range(len(devices))}  # processes started per slot
        self.start_at: dict[int, float] = {}  # slots waiting out a back-off: wid -> when to start
        for wid in range(len(devices)):
            self._start(wid)

    def _start(self, wid: int) -> None:
        job_r, job_w = Pipe(duplex=False)
        res_r, res_w = Pipe(duplex=False)
        p = process(worker_main, name=f"nanorllm-worker-{wid}",
                    args=(wid, self.started[wid], self.start, self.devices[wid], self.threads, self.num_processes,
                          job_r, res_w, self.weights.reader(self.devices[wid]), self.heartbeat, self.stop_flag,
                          os.getpid()))
        self.heartbeat.reset(wid)
        p.start()
        job_r.close()  # only the worker holds these ends: its death closes the pipes
        res_w.close()
        self.procs[wid], self.outbox[wid], self.inbox[wid] = p, Outbox(job_w), Inbox(res_r)
        self.started[wid] += 1

    def up(self) -> list[int]:
        """Slots with a process (alive, or dead and not yet handled)."""
        return sorted(self.procs)

    def submit(self, wid: int, job: Job) -> None:
        self.outbox[wid].put(job)

    def dead(self) -> list[tuple[int, int | None]]:
        """(worker id, exit code) of every worker process that is no longer running."""
        return [(wid, p.exitcode) for wid, p in self.procs.items() if not p.is_alive()]

    def remove(self, wid: int) -> list[WorkerMessage]:
        """Kill slot `wid`'s process if alive; returns the complete messages it sent before it died."""
        p = self.procs.pop(wid)
        if p.is_alive():
            p.kill()
        p.join(timeout=5)
        kill_group(p.pid)  # what the worker's env started (the worker leads its group: worker_main)
        inbox, outbox = self.inbox.pop(wid), self.outbox.pop(wid)
        msgs = inbox.read()
        inbox.close()
        outbox.close()
        return msgs

    def restart_later(self, wid: int, delay_s: float) -> None:
        self.start_at[wid] = time.monotonic() + delay_s

    def start_due(self) -> list[int]:
        """Start every slot whose back-off has passed; returns them."""
        due = [wid for wid, t in self.start_at.items() if t <= time.monotonic()]
        for wid in due:
            del self.start_at[wid]
            self._start(wid)
        return due

    def poll(self, timeout: float) -> list[WorkerMessage]:
        """Messages from any worker, waiting up to `timeout` seconds for the first bytes."""
        for box in self.outbox.values():
            box.flush()
        conns = {self.inbox[wid].conn: wid for wid in self.procs if not self.inbox[wid].eof}
        msgs = []
        for conn in wait(list(conns), timeout) if conns else []:
            msgs.extend(self.inbox[conns[conn]].read())
        if not conns:
            time.sleep(timeout)
        return msgs

    def close(self, grace_s: float = 2.0) -> None:
        """Ask every worker to stop, give them `grace_s`, then SIGKILL what is left.

        By the time this runs the learner has saved what it needs; a worker holds nothing worth
        waiting for."""
        self.stop_flag[0] = 1
        self.start_at.clear()
        for box in self.outbox.values():
            box.put(Stop())
        deadline = time.monotonic() + grace_s
        for p in self.procs.values():
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for wid in list(self.procs):
            self.remove(wid)
