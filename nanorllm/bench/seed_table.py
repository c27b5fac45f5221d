"""Several runs of one setting (seeds) side by side: held-out figures before and after, their gains, and the mean
and sample standard deviation over the runs (`python launch/seed_table.py runs/a-0 runs/a-1 runs/a-2`).

Each run's figures come from its runs/<run>/eval.json ("before" and "after"); `--field` names which (any key of
them: success_rate, mean_reward, an env's own such as reasoning_gym/solved; with only --scalar given, no eval.json
is read). `--scalar TAG` adds a TensorBoard scalar's curve per run (its value at each step, from the run's event
files), its first and last values in the table and, with `--plot`, the curve's mean over the runs with a min-max
band. `--json` writes all of it.
A run without an eval.json, or whose eval.json lacks a field in "before" or "after" or holds it null (no episode was
scored), is refused naming the file.
"""

import json
import statistics
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated

import tyro


@dataclass
class SeedTableConfig:
    runs: tyro.conf.Positional[tuple[str, ...]]
    """Run folders (runs/<run>), one per seed."""
    field: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """eval.json keys to tabulate, one flag each (none: success_rate)."""
    scalar: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """TensorBoard scalars whose curves to read (e.g. reward/mean), one flag each."""
    json: str | None = None
    """Write the table and curves here."""
    plot: str | None = None
    """Plot each --scalar's curves (mean over runs, min-max band) to this PNG."""


class SeedTableError(ValueError):
    pass


def read_eval(run: Path, names: tuple[str, ...]) -> dict:
    if not names:
        return {}
    path = run / "eval.json"
    if not path.is_file():
        raise SeedTableError(f"{path}: no such file (a run with a held-out set writes it)")
    summary = json.loads(path.read_text())
    out = {}
    for name in names:
        for when in ("before", "after"):
            if name not in summary.get(when, {}):
                raise SeedTableError(f"{path}: no {when}.{name} (keys: {', '.join(sorted(summary.get(when, {})))})")
            if summary[when][name] is None:  # a rate over no scored episode
                why = summary[when].get("why_null", {}).get(name, "no value")
                raise SeedTableError(f"{path}: {when}.{name} is null ({why})")
        out[name] = {"before": summary["before"][name], "after": summary["after"][name],
                     "gain": summary["after"][name] - summary["before"][name]}
    return out


def read_curves(run: Path, tags: tuple[str, ...]) -> dict[str, list[tuple[int, float]]]:
    """Each tag's (step, value) points, from the run's event files."""
    if not tags:
        return {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
    acc.Reload()
    have = acc.Tags()["scalars"]
    missing = [t for t in tags if t not in have]
    if missing:
        raise SeedTableError(f"{run}: no scalar {', '.join(missing)} in its event files")
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in tags}


@dataclass
class Row:
    run: str
    seed: int | None
    figures: dict
    curves: dict = field(default_factory=dict)


def with_default_field(cfg: SeedTableConfig) -> SeedTableConfig:
    """`cfg` with no --field given read as success_rate, unless scalars are asked for alone (a run with no held-out
    set has no eval.json)."""
    return cfg if cfg.field or cfg.scalar else replace(cfg, field=("success_rate",))


def rows_of(cfg: SeedTableConfig) -> list[Row]:
    """One row per run, with the fields and scalars `cfg` names."""
    rows = []
    for name in cfg.runs:
        run = Path(name)
        config = run / "config.json"
        seed = json.loads(config.read_text()).get("seed") if config.is_file() else None
        rows.append(Row(name, seed, read_eval(run, cfg.field), read_curves(run, cfg.scalar)))
    return rows


def spread(xs: list[float]) -> dict:
    return {"mean": statistics.fmean(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else None,
            "min": min(xs), "max": max(xs)}


def summary(rows: list[Row], cfg: SeedTableConfig) -> dict:
    """{"fields": {name: {before, after, gain}}, "scalars": {tag: {first, last}}}, each a spread over the runs (a
    name can be both: an env's scalar is logged at evaluation and at every step)."""
    return {"fields": {name: {k: spread([r.figures[name][k] for r in rows]) for k in ("before", "after", "gain")}
                       for name in cfg.field},
            "scalars": {tag: {k: spread([r.curves[tag][i][1] for r in rows]) for k, i in (("first", 0), ("last", -1))}
                        for tag in cfg.scalar}}


def markdown(rows: list[Row], cfg: SeedTableConfig, summ: dict) -> str:
    head = ["run", "seed"] + [f"{n} before -> after (gain)" for n in cfg.field] + [f"{t} first -> last" for t in
                                                                                   cfg.scalar]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.run, str(r.seed)] + [f"{r.figures[n]['before']:.3f} -> {r.figures[n]['after']:.3f} "
                                        f"({r.figures[n]['gain']:+.3f})" for n in cfg.field]
        cells += [f"{r.curves[t][0][1]:.3f} -> {r.curves[t][-1][1]:.3f}" for t in cfg.scalar]
        lines.append("| " + " | ".join(cells) + " |")
    sd = lambda s: "" if s["sd"] is None else f" ± {s['sd']:.3f}"  # noqa: E731
    f, c = summ["fields"], summ["scalars"]
    cells = ["mean ± sd", ""] + [f"{f[n]['before']['mean']:.3f} -> {f[n]['after']['mean']:.3f} "
                                 f"({f[n]['gain']['mean']:+.3f}{sd(f[n]['gain'])})" for n in cfg.field]
    cells += [f"{c[t]['first']['mean']:.3f} -> {c[t]['last']['mean']:.3f}" for t in cfg.scalar]
    return "\n".join(lines + ["| " + " | ".join(cells) + " |"])


def plot(rows: list[Row], tags: tuple[str, ...], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tags), figsize=(6 * len(tags), 4), squeeze=False)
    for ax, tag in zip(axes[0], tags):
        n = min(len(r.curves[tag]) for r in rows)
        steps = [rows[0].curves[tag][i][0] for i in range(n)]
        values = [[r.curves[tag][i][1] for r in rows] for i in range(n)]
        for r in rows:
            ax.plot(steps, [v for _, v in r.curves[tag][:n]], lw=0.8, alpha=0.5, label=f"seed {r.seed}")
        ax.plot(steps, [statistics.fmean(v) for v in values], color="black", lw=2, label="mean")
        ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values], color="gray", alpha=0.2)
        ax.set_xlabel("step")
        ax.set_title(tag)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_seed_table(cfg: SeedTableConfig) -> int:
    cfg = with_default_field(cfg)
    try:
        rows = rows_of(cfg)
    except (SeedTableError, OSError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summ = summary(rows, cfg)
    print(markdown(rows, cfg, summ))
    if cfg.json:
        record = {"runs": [{"run": r.run, "seed": r.seed, "figures": r.figures, "curves": r.curves} for r in rows],
                  "summary": summ, "command": " ".join(["python launch/seed_table.py", *sys.argv[1:]])}
        Path(cfg.json).write_text(json.dumps(record, indent=1) + "\n")
    if cfg.plot and cfg.scalar:
        plot(rows, cfg.scalar, Path(cfg.plot))
    return 0
