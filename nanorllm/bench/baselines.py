"""RL against the baselines it ships, on one env, at equal episodes and at equal wall time.

    python launch/bench.py baselines --seeds 0,1,2 --out runs/baselines-math --json docs/baselines-math.json \
        --plot docs/baselines-math.png
    python launch/bench.py baselines --env reasoning-gym:letter_counting --out runs/baselines-letter ...
    python launch/bench.py baselines --quick --out /tmp/b          # tiny-random: every part runs, in minutes

Each method runs as a user runs it: its own launch/ program in a fresh process, one after another (so each wall
time is its own), from the same base model, scored on the same held-out set, greedy:

- `rl`: launch/train.py with the main job's settings, evaluated every --eval-every updates. The first seed's final
  model is the teacher below.
- `opd`: on-policy distillation from that teacher (`--teacher ... --distill-only`), every other setting RL's.
- `rft`: rejection sampling + SFT: launch/sample.py on RL's episode budget (as many training tasks as RL draws, as
  many episodes each, at RL's temperature; the rewarded ones kept), launch/sft.py on what was kept (SFT's defaults),
  launch/eval.py.
- `gold`: launch/sft.py on as many of the env's own gold demonstrations as RL samples episodes
  (`--demos`), launch/eval.py.
- `gold-rl`: RL (`rl`'s settings) from the same seed's `gold` model: the warm start. Its episodes and seconds are
  gold's and RL's together; its curve starts where gold SFT ended.

Equal episodes: every method but `gold-rl` (twice as many: gold's, then RL's) sees RL's episode count. Equal wall: a
method's training seconds (its programs' wall times, held-out evaluations excluded) beside RL's held-out success at
that many seconds on the same seed's curve (linear between RL's evaluations; RL's last figure where the method took
longer than RL).

Each program's argv, wall time and exit code go to <out>/ledger.json as it ends, its output to <out>/logs/; a rerun
skips the programs the ledger holds as done, so a stopped bench goes on where it stopped. A program that fails stops
the bench naming its log. Checkpoint folders are deleted once a program ends (the bench never resumes one).
"""

import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from nanorllm.bench.record import record_run
from nanorllm.config import TrainConfig
from nanorllm.utils.files import write_atomic

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("rl", "opd", "rft", "gold", "gold-rl")
QUICK = {"train": ["--max-steps", "2", "--tasks-per-step", "2", "--num-samples-per-task", "2", "--eval-limit", "4",
                   "--max-new-tokens", "8", "--max-turns", "1", "--serial"],
         "sample": ["--max-new-tokens", "8", "--max-turns", "1", "--min-reward", "0"],
         "sft": ["--max-steps", "2"], "eval": ["--eval-limit", "4", "--max-new-tokens", "8", "--max-turns", "1"]}
EVAL_LINE = re.compile(r"\[eval[^\]]*\] step \d+ \|[^\r\n]*\| ([0-9.]+) s[\r\n]")  # after a progress bar's \r too


@dataclass
class BaselinesBenchConfig:
    env: str | None = None
    """The env (None: the main job's, math self-refine)."""
    seeds: str = "0,1,2"
    """Seeds, comma-separated; the first seed's RL model is the distillation teacher."""
    eval_every: int = 8
    """RL's and distillation's held-out evaluations, every this many updates (their curves' points)."""
    model: str = "smollm2-135m-instruct"
    """The base model every method starts from (ignored with --quick)."""
    out: str = "runs/baselines"
    """Folder of the runs, their logs and the ledger."""
    quick: bool = False
    """tiny-random, two updates of 2 x 2: checks that every part runs (its figures are not the reference)."""
    json: str | None = None
    """Also write the table and curves here."""
    plot: str | None = None
    """Held-out success against training seconds, every method and seed, to this PNG."""


class BaselinesError(RuntimeError):
    pass


def budget(quick: bool) -> tuple[int, int]:
    """(training tasks, episodes each) of RL's run: the main job's steps x tasks per step, and its samples."""
    cfg = TrainConfig()
    steps, tasks, samples = (2, 2, 2) if quick else (cfg.max_steps, cfg.tasks_per_step, cfg.num_samples_per_task)
    return steps * tasks, samples


def programs(b: BaselinesBenchConfig) -> list[tuple[str, list[str]]]:
    """(name, argv) of every program, in the order they run."""
    out, model = Path(b.out), "tiny-random" if b.quick else b.model
    env = ["--env", b.env] if b.env else []
    extra = QUICK if b.quick else {}
    seeds = [int(s) for s in b.seeds.split(",")]
    tasks, samples = budget(b.quick)
    py = lambda script, *args, kind: [sys.executable, str(ROOT / "launch" / script), *args, *extra.get(kind, [])]  # noqa: E731
    train = lambda s, name, start=model: py("train.py", "--model", start, *env, "--seed", str(s),  # noqa: E731
                                            "--output-dir", str(out), "--run-name", name, "--eval-every",
                                            str(b.eval_every), "--report-to", "tensorboard,jsonl", kind="train")
    sft = lambda s, name, *src: py("sft.py", "--model", model, *src, "--out", str(out / f"{name}-model"), "--seed",  # noqa: E731
                                   str(s), "--output-dir", str(out), "--run-name", name, "--report-to", "jsonl",
                                   kind="sft")
    evaluate = lambda name: py("eval.py", "--model", str(out / f"{name}-model"), *env, kind="eval")  # noqa: E731
    teacher = str(out / f"rl-{seeds[0]}" / "final_model")
    plan = [("base", py("eval.py", "--model", model, *env, kind="eval"))]
    plan += [(f"rl-{s}", train(s, f"rl-{s}") + ([] if s == seeds[0] else ["--no-save-model"])) for s in seeds]
    plan += [(f"opd-{s}", train(s, f"opd-{s}") + ["--no-save-model", "--teacher", teacher, "--distill-only"])
             for s in seeds]
    for s in seeds:
        plan += [(f"rft-sample-{s}", py("sample.py", "--model", model, *env, "--limit", str(tasks), "--samples-per-task",
                                        str(samples), "--seed", str(s), "--out", str(out / f"rft-{s}.jsonl"),
                                        kind="sample")),
                 (f"rft-{s}", sft(s, f"rft-{s}", "--data", str(out / f"rft-{s}.jsonl"))),
                 (f"rft-eval-{s}", evaluate(f"rft-{s}")),
                 (f"gold-{s}", sft(s, f"gold-{s}", *env, "--demos", str(tasks * samples))),
                 (f"gold-eval-{s}", evaluate(f"gold-{s}")),
                 (f"gold-rl-{s}", train(s, f"gold-rl-{s}", str(out / f"gold-{s}-model")) + ["--no-save-model"])]
    return plan


def read_ledger(out: Path) -> dict:
    path = out / "ledger.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def run_program(out: Path, name: str, argv: list[str], ledger: dict) -> None:
    """Run one program to its end, its output to logs/<name>.txt; its entry joins the ledger (written at once)."""
    log = out / "logs" / f"{name}.txt"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[baselines] {name}: {' '.join(argv[1:])}", flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        code = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    wall = time.perf_counter() - t0
    shutil.rmtree(out / name / "checkpoints", ignore_errors=True)
    if code != 0:
        raise BaselinesError(f"{name} exited with code {code} after {wall:.0f} s; its output: {log}")
    ledger[name] = {"argv": argv[1:], "wall_s": wall, "eval_s": sum(map(float, EVAL_LINE.findall(log.read_text())))}
    write_atomic(out / "ledger.json", json.dumps(ledger, indent=1) + "\n")
    print(f"[baselines] {name}: {wall:.0f} s", flush=True)


def eval_line(out: Path, name: str) -> dict:
    """The held-out set's JSON line that launch/eval.py printed."""
    log = out / "logs" / f"{name}.txt"
    for line in log.read_text().splitlines():
        if line.startswith("{") and '"set"' in line:
            return json.loads(line)
    raise BaselinesError(f"{log}: no result line")


def rl_curve(out: Path, name: str, entry: dict, start: float = 0.0) -> list[tuple[float, float]]:
    """(training seconds, held-out success) at each evaluation of a launch/train.py run, from `start` seconds (what
    trained its --model): its program's time outside evaluations and steps (start-up, the final write) counted
    first, then each step's seconds."""
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    step_s = [r.get("perf/step_s", 0.0) for r in rows]
    clock, points = entry["wall_s"] - entry["eval_s"] - sum(step_s), []
    for r, s in zip(rows, step_s):
        clock += s
        if "eval/success_rate" in r:
            points.append((start + (clock if r["step"] else 0.0), r["eval/success_rate"]))
    return points


def at_seconds(curve: list[tuple[float, float]], seconds: float) -> float | None:
    """The curve's success at `seconds`, linear between its points (its last beyond its end; None before its
    start: a warm start's curve begins where its first program ended)."""
    if seconds < curve[0][0]:
        return None
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x0 <= seconds <= x1:
            return y0 + (y1 - y0) * (seconds - x0) / max(x1 - x0, 1e-9)
    return curve[-1][1]


def kept_episodes(out: Path, seed: int) -> int:
    match = re.search(r"\[sample\] kept (\d+) of", (out / "logs" / f"rft-sample-{seed}.txt").read_text())
    return int(match.group(1)) if match else 0


def results(b: BaselinesBenchConfig, ledger: dict) -> dict:
    """Each method's seeds: held-out success after, training seconds, RL's success at those seconds and (a method
    with a curve) its own at RL's seconds; RL's and distillation's curves."""
    out, seeds = Path(b.out), [int(s) for s in b.seeds.split(",")]
    tasks, samples = budget(b.quick)
    base = eval_line(out, "base")["success_rate"]
    runs: dict = {m: {} for m in METHODS}
    for s in seeds:
        for m in ("rl", "opd"):
            curve = rl_curve(out, f"{m}-{s}", ledger[f"{m}-{s}"])
            runs[m][s] = {"after": curve[-1][1], "seconds": curve[-1][0], "curve": curve}
        runs["rft"][s] = {"after": eval_line(out, f"rft-eval-{s}")["success_rate"], "kept": kept_episodes(out, s),
                          "seconds": ledger[f"rft-sample-{s}"]["wall_s"] + ledger[f"rft-{s}"]["wall_s"]}
        runs["gold"][s] = {"after": eval_line(out, f"gold-eval-{s}")["success_rate"],
                           "seconds": ledger[f"gold-{s}"]["wall_s"]}
        curve = rl_curve(out, f"gold-rl-{s}", ledger[f"gold-rl-{s}"], start=runs["gold"][s]["seconds"])
        runs["gold-rl"][s] = {"after": curve[-1][1], "seconds": curve[-1][0], "curve": curve}
        for m in METHODS:
            run, rl = runs[m][s], runs["rl"][s]
            run["rl_at_seconds"] = at_seconds(rl["curve"], run["seconds"])
            run["at_rl_seconds"] = at_seconds(run["curve"], rl["seconds"]) if "curve" in run else None
    return {"base": base, "episodes": tasks * samples, "env": b.env or "math", "runs": runs}


def spread(xs: list[float]) -> str:
    return f"{statistics.fmean(xs):.3f}" + (f" ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else "")


def markdown(res: dict) -> str:
    """One row a method: held-out success per seed and its mean, the gain, training seconds, points a minute, RL's
    success at each seed's seconds, and the method's own at RL's seconds where it has a curve."""
    lines = ["| method | held-out after, per seed | mean ± sd | gain | training s, mean | points/min | "
             "RL at those seconds, mean | it at RL's seconds, mean |", "|---|---|---|---|---|---|---|---|"]
    for m in METHODS:
        seeds = res["runs"][m]
        after = [r["after"] for r in seeds.values()]
        secs = [r["seconds"] for r in seeds.values()]
        gain = 100 * (statistics.fmean(after) - res["base"])
        own = [r.get("at_rl_seconds") for r in seeds.values()]
        own = "-" if None in own else f"{statistics.fmean(own):.3f}"
        lines.append(f"| {m} | {' / '.join(f'{a:.3f}' for a in after)} | {spread(after)} | {gain:+.1f} | "
                     f"{statistics.fmean(secs):.0f} | {gain / (statistics.fmean(secs) / 60):.2f} | "
                     f"{statistics.fmean(r['rl_at_seconds'] for r in seeds.values()):.3f} | {own} |")
    return "\n".join(lines)


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = dict(zip(METHODS, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")))
    for m in METHODS:
        for i, r in enumerate(res["runs"][m].values()):
            label = m if i == 0 else None
            if "curve" in r:
                xs, ys = zip(*r["curve"])
                ax.plot(xs, ys, marker="o", ms=3, lw=1, color=colors[m], alpha=0.8, label=label)
            else:
                ax.plot([0, r["seconds"]], [res["base"], r["after"]], ls=":", marker="s", ms=5, color=colors[m],
                        alpha=0.8, label=label)
    ax.set_xlabel("training seconds (held-out evaluations excluded)")
    ax.set_ylabel("held-out greedy success")
    ax.set_title(f"{res['env']}: {res['episodes']} episodes a method (gold-rl: gold's, then RL's), every seed")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_baselines_bench(b: BaselinesBenchConfig) -> int:
    t_start = time.perf_counter()
    out = Path(b.out)
    out.mkdir(parents=True, exist_ok=True)
    ledger = read_ledger(out)
    try:
        for name, argv in programs(b):
            if name not in ledger:
                run_program(out, name, argv, ledger)
        res = results(b, ledger)
    except BaselinesError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(markdown(res))
    if b.plot:
        plot(res, Path(b.plot))
    record_run(res, t_start, b.json, env=res["env"], seeds=b.seeds, model="tiny-random" if b.quick else b.model,
               ledger={k: {"wall_s": v["wall_s"], "eval_s": v["eval_s"]} for k, v in ledger.items()})
    return 0
