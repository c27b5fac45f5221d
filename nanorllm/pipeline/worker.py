"""Rollout worker process: a policy replica that turns jobs (groups of tasks) into episodes.

Loop: take a job -> wait until the shared weights are at least the job's `min_version` (this is
how `max_policy_lag` is enforced before any token is sampled) -> reload weights only if the
version moved -> run every episode of the job in one RolloutEngine call -> put the RolloutResults
(plain Python data) on this worker's result queue, tagged with the weights version and timings.

Workers ignore SIGINT: Ctrl-C goes to the launcher, which stops them with a message / event and
joins them with a timeout. An exception outside an episode is reported to the learner as a failed
job (it re-issues it) and the worker goes on.
"""

import queue
import signal
import time
import traceback

from nanorllm.policy.hf_causal import HFCausalPolicy
from nanorllm.utils.devices import configure_threads


def worker_main(worker_id: int, cfg, device: str, threads: int | None, num_processes: int,
                jobs: "queue.Queue", results: "queue.Queue", weights, stop) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from nanorllm.trainer.loop import training_engine

    configure_threads(device, threads, num_processes)
    policy = HFCausalPolicy.from_name(cfg.model, device=device, dtype=cfg.dtype, seed=cfg.seed)
    block = weights.attach(policy.model)  # the replica's parameters as one block: a load is one copy
    policy.version, load_s = weights.load_into(block)
    engine = training_engine(policy, cfg)
    results.put({"kind": "ready", "worker_id": worker_id, "version": policy.version, "load_s": load_s})
    # Time since the last message, by what the worker was doing: the learner reads the shares.
    acc, loads, t_mark = {"idle_s": 0.0, "weight_wait_s": 0.0, "queue_wait_s": 0.0}, [load_s], time.perf_counter()
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            job = jobs.get(timeout=0.05)
        except queue.Empty:
            acc["idle_s"] += time.perf_counter() - t0
            continue
        if job is None:
            break
        acc["idle_s"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        while weights.version < job["min_version"] and not stop.is_set():
            time.sleep(0.002)
        acc["weight_wait_s"] += time.perf_counter() - t0
        if stop.is_set():
            break
        if weights.version != policy.version:
            policy.version, s = weights.load_into(block)
            loads.append(s)
        t_run = time.perf_counter()
        try:
            out = engine.run(job["tasks"], num_samples=job["num_samples"], group_ids=job["group_ids"],
                             seed=job["seed"])
            for r in out:
                r.worker_id = worker_id
            msg = {"kind": "result", "job_id": job["job_id"], "results": out}
        except Exception:
            msg = {"kind": "error", "job_id": job["job_id"], "error": traceback.format_exc()}
        now = time.perf_counter()
        msg.update({"worker_id": worker_id, "version": policy.version, "rollout_s": now - t_run,
                    "wall_s": now - t_mark, **acc, "load_s": sum(loads), "loads": len(loads)})
        t0 = time.perf_counter()
        while not stop.is_set():  # bounded queue: block here (and count it) when the learner is behind
            try:
                results.put(msg, timeout=0.1)
                break
            except queue.Full:
                continue
        acc = {"idle_s": 0.0, "weight_wait_s": 0.0, "queue_wait_s": time.perf_counter() - t0}
        loads, t_mark = [], now
