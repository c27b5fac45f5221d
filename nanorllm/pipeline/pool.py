"""WorkerPool: starts, watches, restarts and stops the rollout worker processes.

Each worker has its own job queue and its own bounded result queue. Why not one shared result
queue: a process killed while writing a large message into a shared multiprocessing.Queue can
leave a half-written message, or its write lock held, for every other writer. With one queue per
worker a dead worker's queues are simply dropped with it; the learner reads all of them as one.
`spawn` start method: no fork of a process that holds threads and CUDA state.
"""

import queue
import time

import torch.multiprocessing as mp

from nanorllm.pipeline.worker import worker_main


class WorkerPool:
    def __init__(self, cfg, weights, devices: list[str], *, threads: int | None, num_processes: int):
        self.cfg, self.weights, self.devices = cfg, weights, devices
        self.threads, self.num_processes = threads, num_processes
        self.ctx = mp.get_context("spawn")
        self.stop_event = self.ctx.Event()
        self.procs, self.jobs, self.results = {}, {}, {}
        self.restarts = 0
        for wid in range(len(devices)):
            self._start(wid)

    def _start(self, wid: int) -> None:
        self.jobs[wid] = self.ctx.Queue()
        self.results[wid] = self.ctx.Queue(maxsize=self.cfg.queue_size)
        p = self.ctx.Process(target=worker_main, name=f"nanorllm-worker-{wid}", daemon=True,
                             args=(wid, self.cfg, self.devices[wid], self.threads, self.num_processes,
                                   self.jobs[wid], self.results[wid], self.weights, self.stop_event))
        p.start()
        self.procs[wid] = p

    def submit(self, wid: int, job: dict) -> None:
        self.jobs[wid].put(job)

    def dead(self) -> list[tuple[int, int | None]]:
        """(worker id, exit code) of every worker that is no longer running."""
        return [(wid, p.exitcode) for wid, p in self.procs.items() if not p.is_alive()]

    def restart(self, wid: int) -> None:
        self._discard(wid)
        self.restarts += 1
        self._start(wid)

    def poll(self, timeout: float) -> list[dict]:
        """Messages from any worker, waiting up to `timeout` seconds for the first one."""
        deadline = time.perf_counter() + timeout
        while True:
            msgs = []
            for wid, q in list(self.results.items()):
                if not self.procs[wid].is_alive():
                    continue  # a writer killed mid-message can leave a partial one: never read it
                try:
                    while True:
                        msgs.append(q.get_nowait())
                except queue.Empty:
                    pass
                except (EOFError, OSError, ValueError):  # a queue broken by a killed writer
                    pass
            if msgs or time.perf_counter() >= deadline:
                return msgs
            time.sleep(0.002)

    def queue_depth(self) -> int:
        total = 0
        for q in self.results.values():
            try:
                total += q.qsize()
            except NotImplementedError:
                pass
        return total

    def _discard(self, wid: int) -> None:
        p = self.procs.pop(wid)
        if p.is_alive():
            p.kill()
        p.join(timeout=5)
        for q in (self.jobs.pop(wid), self.results.pop(wid)):
            q.cancel_join_thread()
            q.close()

    def close(self, timeout_s: float = 5.0) -> None:
        """Ask every worker to stop, wait a little, then terminate / kill what is left."""
        self.stop_event.set()
        for q in self.jobs.values():
            try:
                q.put_nowait(None)
            except Exception:
                pass
        deadline = time.perf_counter() + timeout_s
        for p in self.procs.values():
            p.join(timeout=max(0.0, deadline - time.perf_counter()))
        for p in self.procs.values():
            if p.is_alive():
                p.terminate()  # a worker in the middle of a long generate call
        for p in self.procs.values():
            p.join(timeout=3)
            if p.is_alive():
                p.kill()
                p.join(timeout=2)
        for wid in list(self.procs):
            self.procs.pop(wid)
            for q in (self.jobs.pop(wid), self.results.pop(wid)):
                q.cancel_join_thread()
                q.close()
