"""Pick a worker count (`python launch/tune_workers.py`): a short timed trial for N = 1..K rollout
workers, then a recommendation.

Each trial is the real pipeline (same code as launch/train.py) for a few learner updates; the first
update is warm-up and not timed. Any other training flag (--model, --tasks, --tasks-per-step ...)
is passed through.

With D devices (`--device-count`, default: the GPUs in --devices) it also suggests how many to give
the learner ranks and how many to the workers, from the best trial's two costs per step: the
learner's update (one rank; L data-parallel ranks take about 1/L of it) and the rollout work (the
slowest worker's share x N: W workers take about 1/W of it). The step takes the slower of the two,
so L is the count that makes max(update / L, rollout / (D - L)) smallest.
"""

from dataclasses import replace

import torch

from nanorllm.bench.trial import run_trial
from nanorllm.config import TrainConfig


def recommend(rows: list[dict], *, flags: str = "", tolerance: float = 0.05) -> str:
    """One line: which N to use and what limits it.

    The smallest N within `tolerance` of the best throughput wins: a worker that adds less than
    trial noise only adds memory, lag and stale samples."""
    top = max(r["episodes_per_s"] for r in rows)
    best = min((r for r in rows if r["episodes_per_s"] >= (1 - tolerance) * top), key=lambda r: r["num_workers"])
    n = best["num_workers"]
    if best["learner_wait_frac"] < 0.1:
        why = f"learner-bound at N={n} (learner waits {best['learner_wait_frac']:.0%} for data): " \
              "add learner compute (a faster learner device, bf16), not workers"
    elif n == rows[-1]["num_workers"]:
        why = f"rollout-bound up to N={n}: more workers (or devices) may still help"
    else:
        why = f"throughput peaks at N={n}; more workers only compete for the same cores/devices"
    return f"{why}. Use: --num-workers {n} --max-policy-lag 1{flags}"


def suggest_split(row: dict, devices: int) -> tuple[int, str]:
    """(learner ranks, one line) for `devices` devices, from one trial row (see the module doc)."""
    update, rollout = row["train_s"], row["rollout_s"] * row["num_workers"]
    step = lambda n: max(update / n, rollout / (devices - n))  # noqa: E731
    n = min(range(1, devices), key=lambda k: (step(k), k))
    return n, (f"{devices} devices: {n} learner rank(s) + {devices - n} worker device(s), step ~{step(n):.2f} s "
               f"(update {update:.2f} s / {n}, rollout {rollout:.2f} s / {devices - n}). "
               f"Use: --learner-devices {n} --num-workers {devices - n}")


def tune_workers(base: TrainConfig, *, max_workers: int = 3, trial_steps: int = 4, device_count: int = 0) -> int:
    """A trial for N = 1..max_workers, a line each, then the recommendation (and a device split with >= 2)."""
    rows = []
    for n in range(1, max_workers + 1):
        r = run_trial(replace(base, num_workers=n, serial=False, max_steps=trial_steps + 1))
        r["num_workers"] = n
        rows.append(r)
        print(f"N={n}: {r['episodes_per_s']:.2f} episodes/s | learner wait {r['learner_wait_frac']:.2f} | "
              f"worker wait {r['worker_wait_frac']:.2f} | lag {r['policy_lag_mean']:.2f} | "
              f"step {r['step_s']:.1f} s", flush=True)
    print(recommend(rows, flags="" if base.devices == "auto" else f" --devices {base.devices}"))
    gpus = sum(d.strip().startswith("cuda") for d in base.devices.split(","))
    devices = device_count or (gpus if base.devices != "auto" else torch.cuda.device_count())
    if devices >= 2:
        print(suggest_split(max(rows, key=lambda r: r["episodes_per_s"]), devices)[1])
    return 0

