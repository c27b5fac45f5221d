"""Learning benchmark: is an update on pipeline samples worth a serial one, and does a correction help?

    python launch/bench.py --learning                 # default model and task (hours on 2 CPU cores)
    python launch/bench.py --learning --quick         # tiny-random: checks the machinery in minutes

Every configuration trains the same number of updates from the same model, once per seed, and the
held-out greedy success is measured every `eval_every` updates on the same held-out tasks:

    serial                 the one-process loop (lag 0)
    lag1-none, lag1-<c>    pipeline, --max-policy-lag 1, no correction / correction <c>
    lag2-none, lag2-<c>    pipeline, --max-policy-lag 2
    lag4-none, lag4-<c>    pipeline, --max-policy-lag 4

The GRPO variants' table (docs/learning.md), every row the serial loop with one setting fixed in advance
(`VARIANTS`): `--configs default,rloo,reinforce++,dr-grpo,gspo,updates2,fill-batch,entropy,cosine`.

The lag is a bound, not a setting: samples are as stale as the workers manage to run ahead, which
they do only while rollout outpaces the learner (more workers, or a slow learner); otherwise every
bound >= 1 gives lag ~1. So the measured policy_lag_mean is reported beside every configuration.

Evaluation is kept out of the timing: at each eval point the weights are copied in memory (tens of
ms; the workers go on meanwhile), and every copy is evaluated after the run, when the workers are
gone. Wall time counts from the first request for a batch (for the pipeline: once its workers
have loaded their models, so no batch is made before the clock runs; start-up is recorded apart) to
each update, less the copies. Writes learning.json (per configuration: per-seed curves and gains,
mean, std, wall time, time to +10 points) and learning.png (mean curves with a min-max band over
seeds, success vs updates and vs wall time) after every run, so a benchmark cut short keeps what it
finished; `--resume` runs only what is missing.
"""

import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import torch

from nanorllm.bench.trial import checked
from nanorllm.config import TrainConfig
from nanorllm.run.lifecycle import run_training
from nanorllm.trainer.loop import TrainingRun

TARGET_POINTS = 0.10  # "time to +10 points" of held-out success

# The variants' table: name -> TrainConfig overrides, each run in the serial loop. One setting a row, fixed
# before any run (docs/learning.md says why each): nothing here is tuned against another row's result.
VARIANTS: dict[str, dict] = {
    "default": {},
    "rloo": {"adv_estimator": "rloo"},
    "reinforce++": {"adv_estimator": "reinforce++"},
    "dr-grpo": {"adv_normalize_std": False, "loss_agg": "seq-mean-token-sum-norm"},
    "gspo": {"ratio_level": "sequence", "loss_agg": "seq-mean"},  # the paper's clip: gspo_clip_* defaults
    "updates2": {"updates_per_batch": 2},
    "fill-batch": {"fill_batch": True},  # cap: 3 x tasks_per_step
    "entropy": {"entropy_coef": 1e-3},
    "cosine": {"lr_schedule": "cosine"},
}


@dataclass
class LearningConfig:
    quick: bool = False
    """tiny-random, few updates, a small held-out set: checks the machinery (tiny-random cannot learn arithmetic)."""
    model: str = "smollm2-135m-instruct"
    """Model (ignored with --quick)."""
    updates: int = 24
    """Learner updates per run (the main job's length: +15.0 points mean in 24 updates)."""
    eval_every: int = 8
    """Held-out greedy success every this many updates (and before the first)."""
    eval_limit: int = 200
    """Held-out tasks (the first N of the default held-out set)."""
    seeds: str = "0,1,2"
    """Comma-separated seeds; every configuration runs each."""
    workers: int = 2
    """Rollout workers in the pipeline configurations. A lag bound above 1 is reached only while the workers
    outpace the learner; with one worker the main job is rollout-bound (its learner waits 20-28%) and every
    bound gives lag ~1."""
    correction: str = "tis"
    """The off-policy correction compared with none."""
    turn_credit: str = "episode"
    """Credit assignment in every configuration (--turn-credit of launch/train.py); compare first-turn gains."""
    configs: str = "serial,lag1-none,lag1-corr,lag2-none,lag2-corr,lag4-none,lag4-corr"
    """Comma-separated subset of the configurations ('corr' = --correction), or of the variants' table's rows
    (VARIANTS: default, rloo, reinforce++, dr-grpo, gspo, updates2, fill-batch, entropy, cosine; serial)."""
    out: str = "runs/learning"
    """Folder for learning.json and learning.png."""
    devices: str = "auto"
    """Devices for the pipeline runs (see launch/train.py --devices)."""
    threads: int | None = None
    """Torch threads per process (None: the cores split across processes, two for a serial run on 2 cores).
    One lets two tables run side by side on 2 cores, each row's wall time then measured that way."""
    resume: bool = False
    """Keep the runs an earlier invocation wrote to --out with the same settings; run only the missing ones."""


def base_config(b: LearningConfig) -> TrainConfig:
    common = {"max_steps": b.updates, "eval_limit": b.eval_limit, "devices": b.devices, "turn_credit": b.turn_credit,
              "threads": b.threads}
    if b.quick:
        return TrainConfig(model="tiny-random", tasks_per_step=2, num_samples_per_task=2, max_new_tokens=8, **common)
    return TrainConfig(model=b.model, **common)


def configurations(b: LearningConfig) -> dict[str, dict]:
    """name -> TrainConfig overrides."""
    out = {}
    for name in b.configs.split(","):
        if name == "serial":
            out[name] = {"serial": True}
            continue
        if name in VARIANTS:
            out[name] = {"serial": True, **VARIANTS[name]}
            continue
        lag, corr = name.split("-")
        out[name.replace("corr", b.correction)] = {
            "serial": False, "num_workers": b.workers, "max_policy_lag": int(lag.removeprefix("lag")),
            "off_policy_correction": b.correction if corr == "corr" else "none"}
    return out


class Snapshots:
    """The run's hooks (run/lifecycle.py). `take_due`, after every eval_every-th update (and before
    the first): a copy of the weights and the training wall time so far, the copies' own time left
    out. `evaluate`, once training is over and the workers are gone: every copy on the held-out set,
    with no worker competing and no time counted."""

    def __init__(self, eval_every: int, max_steps: int, initial: dict):
        self.eval_every, self.max_steps, self.initial = eval_every, max_steps, initial
        self.points: list[dict] = []  # {"update", "wall_s", "state"}
        self.t0, self.excluded = None, 0.0

    def take_due(self, run: TrainingRun, update: int) -> None:
        if self.t0 is None:  # before the first batch is asked for: the clock starts now
            self.take(run, update)
            self.t0 = time.perf_counter()
        elif update % self.eval_every == 0 or update == self.max_steps:
            self.take(run, update)

    def take(self, run: TrainingRun, update: int) -> None:
        t = time.perf_counter()
        state = {k: v.detach().clone() for k, v in run.policy.model.state_dict().items()}
        wall = 0.0 if self.t0 is None else t - self.t0 - self.excluded
        self.points.append({"update": update, "wall_s": wall, "state": state})
        self.excluded += time.perf_counter() - t

    def evaluate(self, run: TrainingRun) -> dict:
        """{"curve": [{"update", "wall_s", "success", "first_turn_success"}, ...]}. `initial` caches the
        evaluation before the first update: greedy, from the same weights, it is the same for every run."""
        curve = []
        for p in self.points:
            state = p.pop("state")
            if p["update"] == 0 and self.initial:
                res = self.initial
            else:
                run.policy.model.load_state_dict(state)
                res = run.held_out.evaluate(p["update"])
                if p["update"] == 0:
                    self.initial.update(res)
            curve.append({**p, "success": res["success_rate"], "first_turn_success": res["first_turn_success"]})
        return {"curve": curve}


def run_one(cfg: TrainConfig, eval_every: int, initial: dict) -> dict:
    """Train cfg.max_steps updates; returns the success curve and the measured policy lag."""
    with tempfile.TemporaryDirectory(prefix="nanorllm-learning-") as tmp:
        cfg = replace(cfg, output_dir=tmp, run_name="run", save_model=False, sample_every=0, eval_every=0,
                      save_every=0, save_every_minutes=0)
        snapshots = Snapshots(eval_every, cfg.max_steps, initial)
        outcome = run_training(cfg, quiet=True, evaluate_first=False, checkpoints=False,
                               on_step=snapshots.take_due, finish=snapshots.evaluate)
    checked(outcome.exit_code, "the learning run")
    curve, history = outcome.summary["curve"], outcome.history
    lags = [h.get("pipeline/policy_lag_mean", 0.0) for h in history]
    return {"curve": curve, "policy_lag_mean": sum(lags) / max(len(lags), 1),
            "policy_lag_max": max((h.get("pipeline/policy_lag_max", 0) for h in history), default=0),
            "mismatch_kl_lagged": _mean([h["mismatch/kl_lagged"] for h in history if "mismatch/kl_lagged" in h]),
            "wall_s": curve[-1]["wall_s"], "startup_s": outcome.startup_s,
            "grad_norm": [h.get("grad_norm") for h in history],  # before --max-grad-norm clips it
            "train_samples": [h.get("train/samples") for h in history],  # samples in each update
            "extra_groups": [h.get("rollout/extra_groups", 0) for h in history]}  # --fill-batch's draws past the step's


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _std(xs: list[float]) -> float | None:
    m = _mean(xs)
    return None if m is None else (sum((x - m) ** 2 for x in xs) / len(xs)) ** 0.5


def time_to_gain(curve: list[dict], points: float = TARGET_POINTS) -> float | None:
    """Training wall time at the first eval point >= `points` above the start; None if never."""
    start = curve[0]["success"]
    return next((p["wall_s"] for p in curve if p["success"] - start >= points - 1e-9), None)


def summarize(runs: list[dict]) -> dict:
    gains = [r["curve"][-1]["success"] - r["curve"][0]["success"] for r in runs]
    first = [r["curve"][-1]["first_turn_success"] - r["curve"][0]["first_turn_success"] for r in runs]
    times = [time_to_gain(r["curve"]) for r in runs]
    return {
        "gains": gains, "gain_mean": _mean(gains), "gain_std": _std(gains),
        "first_turn_gain_mean": _mean(first),
        "wall_s": [r["wall_s"] for r in runs], "wall_s_mean": _mean([r["wall_s"] for r in runs]),
        "time_to_plus10_s": times,  # per seed; the mean only when every seed got there
        "time_to_plus10_s_mean": None if None in times else _mean(times),
        "policy_lag_mean": _mean([r["policy_lag_mean"] for r in runs]),
        "policy_lag_max": max(r["policy_lag_max"] for r in runs),
        "mismatch_kl_lagged": _mean([r["mismatch_kl_lagged"] for r in runs if r["mismatch_kl_lagged"] is not None]),
        "runs": runs,
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for name, s in results.items():
        curves = [r["curve"] for r in s["runs"]]
        n = min(len(c) for c in curves)
        success = [[c[i]["success"] for c in curves] for i in range(n)]
        mean = [sum(x) / len(x) for x in success]
        lo, hi = [min(x) for x in success], [max(x) for x in success]
        for ax, key in zip(axes, ("update", "wall_s")):
            xs = [sum(c[i][key] for c in curves) / len(curves) for i in range(n)]
            (line,) = ax.plot(xs, mean, marker="o", ms=3, label=f"{name} (lag {s['policy_lag_mean']:.2f})")
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15)
    axes[0].set_xlabel("updates")
    axes[1].set_xlabel("training wall time (s, evaluation excluded)")
    axes[0].set_ylabel("held-out greedy success")
    axes[0].legend(fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle("held-out success: mean over seeds, band = min..max")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_record(b: LearningConfig, base: TrainConfig, seeds: list[int], done: dict[str, list[dict]],
                 total_s: float) -> dict:
    """learning.json from the runs finished so far (written after every run, atomically), and the plot."""
    out = Path(b.out)
    results = {name: summarize(runs) for name, runs in done.items() if runs}
    record = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "quick": b.quick,
              "model": base.model, "settings": vars(b), "seeds": seeds,
              "complete": all(len(done.get(n, [])) == len(seeds) for n in configurations(b)),
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                         f"torch {torch.__version__}, cuda {torch.cuda.is_available()}",
              "command": " ".join(sys.argv), "total_s": total_s, "configurations": results}
    tmp = out / "learning.json.tmp"
    tmp.write_text(json.dumps(record, indent=2, default=float) + "\n")
    os.replace(tmp, out / "learning.json")
    plot(results, out / "learning.png")
    return record


def finished_runs(b: LearningConfig) -> dict[str, list[dict]]:
    """Runs a previous invocation with the same settings wrote to b.out (--resume)."""
    path = Path(b.out) / "learning.json"
    if not path.exists():
        return {}
    old = json.loads(path.read_text())
    keep = ("quick", "model", "updates", "eval_every", "eval_limit", "workers", "turn_credit", "devices", "threads")
    changed = [k for k in keep if old["settings"].get(k) != getattr(b, k)]
    if changed:
        raise SystemExit(f"error: {path} was made with other settings ({', '.join(changed)}); "
                         "resume with the same ones or choose another --out")
    return {name: s["runs"] for name, s in old["configurations"].items()}


def run_learning(b: LearningConfig) -> int:
    """Every configuration x seed not yet in b.out (with b.resume), the record after each, then the table."""
    if b.quick:
        b = replace(b, updates=min(b.updates, 4), eval_every=min(b.eval_every, 2), eval_limit=min(b.eval_limit, 8))
    torch.set_flush_denormal(True)
    base = base_config(b)
    seeds = [int(s) for s in b.seeds.split(",")]
    Path(b.out).mkdir(parents=True, exist_ok=True)
    done = finished_runs(b) if b.resume else {}
    t_start = time.perf_counter() - (json.loads((Path(b.out) / "learning.json").read_text())["total_s"] if done else 0.0)
    initial = {}
    for name, overrides in configurations(b).items():
        runs = done.setdefault(name, [])
        for seed in seeds:
            if any(r["seed"] == seed for r in runs):
                continue
            r = run_one(replace(base, seed=seed, **overrides), b.eval_every, initial)
            r["seed"] = seed
            runs.append(r)
            c = r["curve"]
            print(f"[learning] {name} seed {seed}: success {c[0]['success']:.3f} -> {c[-1]['success']:.3f} | "
                  f"{r['wall_s']:.1f} s | lag {r['policy_lag_mean']:.2f} (max {r['policy_lag_max']})", flush=True)
            write_record(b, base, seeds, done, time.perf_counter() - t_start)
    record = write_record(b, base, seeds, done, time.perf_counter() - t_start)
    print(f"\n{'configuration':16s} {'gain':>13s} {'first turn':>10s} {'wall s':>8s} {'to +10 s':>9s} {'lag':>5s}")
    for name, s in record["configurations"].items():
        t10 = s["time_to_plus10_s_mean"]
        print(f"{name:16s} {s['gain_mean']:+7.3f} ±{s['gain_std']:.3f} {s['first_turn_gain_mean']:+10.3f} "
              f"{s['wall_s_mean']:8.1f} "
              f"{'-' if t10 is None else f'{t10:.1f}':>9s} {s['policy_lag_mean']:5.2f}")
    print(markdown_table(record))
    print(f"[learning] {Path(b.out) / 'learning.json'}, {Path(b.out) / 'learning.png'} | {record['total_s']:.0f} s")
    return 0


def markdown_table(record: dict) -> str:
    """learning.json's configurations as docs/learning.md's rows; a row with fewer seeds than the record's is
    marked and gets no comparison (its mean is printed, not ranked)."""
    n_seeds = len(record["seeds"])
    lines = ["| row | seeds | held-out gain (mean ± sd) | wall s (mean) | to +10 points s (mean) |", "|---|---|---|---|---|"]
    for name, s in record["configurations"].items():
        n = len(s["runs"])
        t10 = s["time_to_plus10_s_mean"]
        mark = "" if n == n_seeds else f" (only {n} of {n_seeds} seeds: not compared)"
        lines.append(f"| {name}{mark} | {n} | {s['gain_mean']:+.3f} ± {s['gain_std']:.3f} | {s['wall_s_mean']:.0f} | "
                     f"{'not reached by every seed' if t10 is None else f'{t10:.0f}'} |")
    return "\n".join(lines)

