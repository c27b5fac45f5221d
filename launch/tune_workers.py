"""Pick a worker count: a short timed trial for N = 1..K rollout workers, then a recommendation.

    python launch/tune_workers.py --max-workers 3                      # CPU: cores split across processes
    python launch/tune_workers.py --max-workers 7 --devices cuda:0,cuda:1,cuda:2,cuda:3,cuda:4,cuda:5,cuda:6,cuda:7

Each trial is the real pipeline (same code as launch/train.py) for a few learner updates; the first
update is warm-up and not timed. Any other training flag (--model, --tasks, --tasks-per-step ...)
is passed through.
"""

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launch.trial import run_trial  # noqa: E402
from nanorllm.config import ConfigError, parse_config  # noqa: E402


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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    k, steps = 3, 4
    for flag in ("--max-workers", "--trial-steps"):
        if flag in argv:
            i = argv.index(flag)
            value = int(argv[i + 1])
            del argv[i:i + 2]
            k, steps = (value, steps) if flag == "--max-workers" else (k, value)
    try:
        base = parse_config(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = []
    for n in range(1, k + 1):
        r = run_trial(replace(base, num_workers=n, serial=False, max_steps=steps + 1))
        r["num_workers"] = n
        rows.append(r)
        print(f"N={n}: {r['episodes_per_s']:.2f} episodes/s | learner wait {r['learner_wait_frac']:.2f} | "
              f"worker wait {r['worker_wait_frac']:.2f} | lag {r['policy_lag_mean']:.2f} | "
              f"step {r['step_s']:.1f} s", flush=True)
    print(recommend(rows, flags="" if base.devices == "auto" else f" --devices {base.devices}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
