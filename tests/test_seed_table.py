"""launch/seed_table.py: runs of one setting side by side, read from their eval.json and event files."""

import json
import re
import sys
from pathlib import Path

import pytest
import tyro

from nanorllm.bench.seed_table import (SeedTableConfig, SeedTableError, rows_of, run_seed_table, summary,
                                     with_default_field)
from tests import forked

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path, name, seed, before, after, curve):
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / name
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"seed": seed}))
    (run / "eval.json").write_text(json.dumps({"before": {"success_rate": before, "n": 4},
                                               "after": {"success_rate": after, "n": 4}}))
    w = SummaryWriter(str(run))
    for step, v in enumerate(curve, 1):
        w.add_scalar("reward/mean", v, step)
    w.close()
    return str(run)


def test_gains_mean_and_sample_sd_over_the_runs(tmp_path, capsys):
    runs = (_run(tmp_path, "a-0", 0, 0.25, 0.5, [0.1, 0.3]), _run(tmp_path, "a-1", 1, 0.25, 0.75, [0.2, 0.6]),
            _run(tmp_path, "a-2", 2, 0.25, 0.25, [0.3, 0.3]))
    cfg = SeedTableConfig(runs=runs, field=("success_rate",), scalar=("reward/mean",), json=str(tmp_path / "t.json"),
                          plot=str(tmp_path / "t.png"))
    assert run_seed_table(cfg) == 0
    out = capsys.readouterr().out
    assert "| " + runs[1] + " | 1 | 0.250 -> 0.750 (+0.500) | 0.200 -> 0.600 |" in out
    assert "| mean ± sd |  | 0.250 -> 0.500 (+0.250 ± 0.250) | 0.200 -> 0.400 |" in out
    record = json.loads((tmp_path / "t.json").read_text())
    gain = record["summary"]["fields"]["success_rate"]["gain"]
    assert gain == {"mean": 0.25, "sd": 0.25, "min": 0.0, "max": 0.5}
    assert record["runs"][0]["curves"]["reward/mean"] == [[1, pytest.approx(0.1)], [2, pytest.approx(0.3)]]
    assert (tmp_path / "t.png").stat().st_size > 1000


def test_a_missing_eval_file_or_field_is_refused_naming_it(tmp_path):
    run = _run(tmp_path, "b-0", 0, 0.1, 0.2, [0.0])
    with pytest.raises(SeedTableError, match=r"b-0/eval.json: no before.mean_reward \(keys: n, success_rate\)"):
        rows_of(SeedTableConfig(runs=(run,), field=("mean_reward",)))
    with pytest.raises(SeedTableError, match="no scalar loss/x"):
        rows_of(SeedTableConfig(runs=(run,), scalar=("loss/x",)))


@pytest.mark.slow
def test_the_program_exits_2_naming_a_run_without_its_eval_file(tmp_path):
    (tmp_path / "c-0").mkdir()
    proc = forked.run([sys.executable, str(ROOT / "launch/seed_table.py"), str(tmp_path / "c-0")],
                      capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "c-0/eval.json: no such file" in proc.stderr and proc.stdout == ""


def test_a_field_null_in_eval_json_is_refused_with_the_reason_written_beside_it(tmp_path):
    run = _run(tmp_path, "n-0", 0, 0.1, 0.2, [0.0])
    why = "no episode was scored (2 not scored: the env raised or a reward source failed)"
    (tmp_path / "n-0" / "eval.json").write_text(json.dumps({
        "before": {"success_rate": None, "n": 0, "failed": 2, "why_null": {"success_rate": why}},
        "after": {"success_rate": 0.5, "n": 2}}))
    with pytest.raises(SeedTableError, match=re.escape(f"n-0/eval.json: before.success_rate is null ({why})")):
        rows_of(SeedTableConfig(runs=(run,), field=("success_rate",)))


def test_fields_named_on_the_command_line_replace_the_default_once_each(tmp_path, capsys):
    run = _run(tmp_path, "e-0", 0, 0.5, 0.75, [1.0])
    run_seed_table(tyro.cli(SeedTableConfig, args=[run, "--field", "n", "--field", "success_rate"]))
    head = capsys.readouterr().out.splitlines()[0]
    assert head == "| run | seed | n before -> after (gain) | success_rate before -> after (gain) |"
    run_seed_table(tyro.cli(SeedTableConfig, args=[run]))
    assert capsys.readouterr().out.splitlines()[0] == "| run | seed | success_rate before -> after (gain) |"


def test_one_run_has_no_sd(tmp_path):
    cfg = with_default_field(SeedTableConfig(runs=(_run(tmp_path, "d-0", 0, 0.5, 0.5, [1.0]),)))
    assert summary(rows_of(cfg), cfg)["fields"]["success_rate"]["gain"]["sd"] is None


def test_a_name_both_field_and_scalar_keeps_both(tmp_path):
    run = _run(tmp_path, "f-0", 0, 0.5, 0.75, [0.2, 0.4])
    (tmp_path / "f-0" / "eval.json").write_text(json.dumps({"before": {"reward/mean": 0.5},
                                                            "after": {"reward/mean": 0.75}}))
    cfg = SeedTableConfig(runs=(run,), field=("reward/mean",), scalar=("reward/mean",))
    s = summary(rows_of(cfg), cfg)
    assert s["fields"]["reward/mean"]["gain"]["mean"] == 0.25
    assert s["scalars"]["reward/mean"]["last"]["mean"] == pytest.approx(0.4)


def test_scalars_alone_read_no_eval_file(tmp_path):
    run = _run(tmp_path, "g-0", 0, 0.5, 0.75, [0.2, 0.4])
    (tmp_path / "g-0" / "eval.json").unlink()  # a run with --eval-tasks ''
    cfg = SeedTableConfig(runs=(run,), scalar=("reward/mean",))
    (row,) = rows_of(cfg)
    assert row.figures == {} and row.curves["reward/mean"][-1] == (2, pytest.approx(0.4))
