"""launch/bench.py baselines: every method gets RL's episode budget, distillation learns from the first seed's RL
model, wall time excludes held-out evaluations, RL's success at a baseline's seconds is read off its own curve, and
a rerun goes on from the ledger."""

import json
import sys

import pytest

from nanorllm.bench.baselines import (EVAL_LINE, BaselinesBenchConfig, at_seconds, budget, markdown, programs,
                                      rl_curve, run_baselines_bench)
from nanorllm.config import TrainConfig


def argv_of(plan, name):
    return dict(plan)[name]


def flag(argv, name):
    return argv[argv.index(name) + 1]


def test_every_method_gets_rls_episode_budget():
    cfg = TrainConfig()
    tasks, samples = budget(quick=False)
    assert (tasks, samples) == (cfg.max_steps * cfg.tasks_per_step, cfg.num_samples_per_task)
    plan = programs(BaselinesBenchConfig(seeds="3,4", out="o"))
    sample = argv_of(plan, "rft-sample-3")
    assert int(flag(sample, "--limit")) * int(flag(sample, "--samples-per-task")) == tasks * samples
    assert int(flag(argv_of(plan, "gold-4"), "--demos")) == tasks * samples


def test_distillation_learns_from_the_first_seeds_rl_model_which_alone_is_saved():
    plan = programs(BaselinesBenchConfig(seeds="3,4", out="o"))
    assert "--no-save-model" not in argv_of(plan, "rl-3") and "--no-save-model" in argv_of(plan, "rl-4")
    for s in (3, 4):
        opd = argv_of(plan, f"opd-{s}")
        assert flag(opd, "--teacher") == "o/rl-3/final_model" and "--distill-only" in opd
        assert flag(opd, "--seed") == str(s)
    names = [n for n, _ in plan]
    assert names.index("rl-3") < names.index("opd-3") and names.index("rft-sample-3") < names.index("rft-3") < \
        names.index("rft-eval-3")


def test_the_warm_start_trains_rl_from_the_same_seeds_gold_model_after_it_is_scored():
    plan = programs(BaselinesBenchConfig(seeds="3,4", out="o"))
    names = [n for n, _ in plan]
    for s in (3, 4):
        warm = argv_of(plan, f"gold-rl-{s}")
        assert flag(warm, "--model") == f"o/gold-{s}-model" and flag(warm, "--seed") == str(s)
        assert "--no-save-model" in warm and "--teacher" not in warm
        rl = argv_of(plan, f"rl-{s}")
        assert [a for a in warm if a not in (f"o/gold-{s}-model", f"gold-rl-{s}")] == \
            [a for a in rl if a not in ("smollm2-135m-instruct", f"rl-{s}", "--no-save-model")] + ["--no-save-model"]
        assert names.index(f"gold-{s}") < names.index(f"gold-eval-{s}") < names.index(f"gold-rl-{s}")


def test_the_env_reaches_every_program_that_plays_or_scores_it():
    plan = programs(BaselinesBenchConfig(env="reasoning-gym:letter_counting", seeds="0", out="o"))
    for name, argv in plan:
        assert argv[0] == sys.executable
        if name != "rft-0":  # SFT on sampled rows reads them from the file, not from an env
            assert flag(argv, "--env") == "reasoning-gym:letter_counting", name
    assert flag(argv_of(plan, "rft-eval-0"), "--model") == "o/rft-0-model"


def test_eval_lines_are_found_after_a_progress_bar_and_summed():
    text = ("[eval] step 0 | success 0.465 | first turn 0.440 | n 200 | 19.5 s\n"
            "train:  33%|###  | 8/24\r[eval] step 8 | success 0.500 | n 200 | 20.5 s\r"
            "[eval gsm8k] step 8 | success 0.100 | n 100 | 3.0 s\nstep 9/24 | reward 0.50 | 7.7 s\n")
    assert [float(x) for x in EVAL_LINE.findall(text)] == [19.5, 20.5, 3.0]


def test_rls_curve_counts_start_up_first_then_each_steps_seconds(tmp_path):
    rows = [{"step": 0, "eval/success_rate": 0.4}, {"step": 1, "perf/step_s": 10.0},
            {"step": 2, "perf/step_s": 20.0, "eval/success_rate": 0.5}, {"step": 3, "perf/step_s": 30.0},
            {"step": 4, "perf/step_s": 40.0, "eval/success_rate": 0.7}]
    (tmp_path / "rl-0").mkdir()
    (tmp_path / "rl-0" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # 150 s of program: 30 s of evaluations, 100 s of steps, 20 s of start-up and write-out
    curve = rl_curve(tmp_path, "rl-0", {"wall_s": 150.0, "eval_s": 30.0})
    assert curve == [(0.0, 0.4), (50.0, 0.5), (120.0, 0.7)]
    # a warm start's curve begins where the program that trained its model ended
    assert rl_curve(tmp_path, "rl-0", {"wall_s": 150.0, "eval_s": 30.0}, start=100.0) == \
        [(100.0, 0.4), (150.0, 0.5), (220.0, 0.7)]


def test_rls_success_at_a_baselines_seconds_is_linear_between_evaluations_and_its_last_beyond():
    curve = [(0.0, 0.4), (50.0, 0.5), (120.0, 0.7)]
    assert at_seconds(curve, 25.0) == pytest.approx(0.45)
    assert at_seconds(curve, 85.0) == pytest.approx(0.6)
    assert at_seconds(curve, 500.0) == 0.7
    assert at_seconds([(100.0, 0.6), (150.0, 0.7)], 99.0) is None  # before a warm start's curve: unknown


def test_the_table_has_a_row_per_method_with_gain_over_the_base_and_points_a_minute():
    own = {"rl": (0.6, 0.6), "opd": (0.4, 0.5), "rft": (None, None), "gold": (None, None), "gold-rl": (0.7, None)}
    runs = {m: {0: {"after": a, "seconds": 120.0, "rl_at_seconds": 0.6, "at_rl_seconds": own[m][0]},
                1: {"after": a, "seconds": 60.0, "rl_at_seconds": 0.5, "at_rl_seconds": own[m][1]}}
            for m, a in (("rl", 0.6), ("opd", 0.55), ("rft", 0.5), ("gold", 0.45), ("gold-rl", 0.7))}
    table = markdown({"base": 0.45, "runs": runs}).splitlines()
    assert len(table) == 7
    assert table[2] == "| rl | 0.600 / 0.600 | 0.600 ± 0.000 | +15.0 | 90 | 10.00 | 0.550 | 0.600 |"
    assert table[3].endswith("| 0.450 |") and table[4].endswith("| - |")
    assert "| +0.0 |" in table[5]
    assert table[6].startswith("| gold-rl | 0.700 / 0.700 |") and table[6].endswith("| - |")  # a seed before


@pytest.mark.slow
def test_the_quick_bench_runs_every_program_once_and_a_rerun_goes_on_from_the_ledger(tmp_path, capsys):
    b = BaselinesBenchConfig(quick=True, seeds="0", out=str(tmp_path / "b"), json=str(tmp_path / "b.json"))
    assert run_baselines_bench(b) == 0
    ledger = json.loads((tmp_path / "b" / "ledger.json").read_text())
    assert sorted(ledger) == sorted(n for n, _ in programs(b))
    assert all(v["wall_s"] > 0 for v in ledger.values())
    assert not (tmp_path / "b" / "rl-0" / "checkpoints").exists()
    assert (tmp_path / "b" / "rl-0" / "final_model").is_dir()
    figures = json.loads((tmp_path / "b.json").read_text())["figures"]
    assert sorted(figures["runs"]) == ["gold", "gold-rl", "opd", "rft", "rl"] and figures["episodes"] == 8
    warm = figures["runs"]["gold-rl"]["0"]
    assert warm["curve"][0][0] == pytest.approx(ledger["gold-0"]["wall_s"])  # starts where gold SFT ended
    assert [x for x, _ in figures["runs"]["rl"]["0"]["curve"]][0] == 0.0
    capsys.readouterr()
    # the ledger holds every program: a rerun runs none and prints the same table
    (tmp_path / "b" / "logs" / "rl-0.txt").touch()
    assert run_baselines_bench(b) == 0
    out = capsys.readouterr().out
    assert "[baselines] rl-0:" not in out and "| rl |" in out


@pytest.mark.slow
def test_a_failing_program_stops_the_bench_naming_its_log_and_is_not_in_the_ledger(tmp_path, capsys):
    b = BaselinesBenchConfig(quick=True, seeds="0", out=str(tmp_path / "b"), model="unused",
                             env="no.such.module:Env")
    assert run_baselines_bench(b) == 1
    err = capsys.readouterr().err
    assert "base exited with code" in err and str(tmp_path / "b" / "logs" / "base.txt") in err
    assert not (tmp_path / "b" / "ledger.json").exists()
