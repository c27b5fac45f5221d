"""The learning benchmark's machinery: configurations, summaries and one reduced --quick run."""

import json

import pytest

import tyro

from nanorllm.bench.learning import LearningConfig, configurations, run_learning, summarize, time_to_gain


def main(argv: list[str]) -> int:
    """The benchmark as `launch/bench.py --learning ARGV` runs it."""
    return run_learning(tyro.cli(LearningConfig, args=argv))


def curve(successes, dt=10.0):
    return [{"update": 2 * i, "wall_s": dt * i, "success": s, "first_turn_success": s / 2}
            for i, s in enumerate(successes)]


def test_configurations_cover_serial_and_each_lag_with_and_without_the_correction():
    cfgs = configurations(LearningConfig(correction="mis"))
    assert list(cfgs) == ["serial", "lag1-none", "lag1-mis", "lag2-none", "lag2-mis", "lag4-none", "lag4-mis"]
    assert cfgs["serial"] == {"serial": True}
    assert cfgs["lag4-mis"] == {"serial": False, "num_workers": 2, "max_policy_lag": 4, "off_policy_correction": "mis"}
    assert cfgs["lag2-none"]["off_policy_correction"] == "none"


def test_time_to_gain_is_the_first_eval_ten_points_up():
    assert time_to_gain(curve([0.40, 0.45, 0.50, 0.60])) == 20.0
    assert time_to_gain(curve([0.40, 0.45, 0.49])) is None


def test_summary_gains_and_time_to_target_need_every_seed():
    runs = [{"curve": curve([0.4, 0.5, 0.6]), "wall_s": 20.0, "policy_lag_mean": 1.0, "policy_lag_max": 1,
             "mismatch_kl_lagged": 0.01},
            {"curve": curve([0.5, 0.5, 0.55]), "wall_s": 22.0, "policy_lag_mean": 0.5, "policy_lag_max": 1,
             "mismatch_kl_lagged": None}]
    s = summarize(runs)
    assert s["gains"] == pytest.approx([0.2, 0.05])
    assert s["gain_mean"] == pytest.approx(0.125) and s["gain_std"] == pytest.approx(0.075)
    assert s["time_to_plus10_s"] == [10.0, None] and s["time_to_plus10_s_mean"] is None
    assert (s["wall_s_mean"], s["policy_lag_mean"], s["mismatch_kl_lagged"]) == (21.0, 0.75, 0.01)


@pytest.mark.slow
def test_quick_run_writes_json_and_plot(tmp_path):
    """A reduced --quick (one seed, serial and one corrected pipeline run): every file, field and shape."""
    assert main(["--quick", "--seeds", "0", "--configs", "serial,lag2-corr", "--updates", "2", "--eval-every", "1",
                 "--eval-limit", "4", "--workers", "1", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "learning.json").read_text())
    assert record["model"] == "tiny-random" and record["seeds"] == [0]
    assert list(record["configurations"]) == ["serial", "lag2-tis"]
    for name, s in record["configurations"].items():
        assert len(s["gains"]) == len(s["wall_s"]) == len(s["time_to_plus10_s"]) == len(s["runs"]) == 1
        points = s["runs"][0]["curve"]
        assert [p["update"] for p in points] == [0, 1, 2]
        assert all(0 <= p["success"] <= 1 for p in points)
        walls = [p["wall_s"] for p in points]
        assert walls[0] == 0.0 and walls == sorted(walls)
        assert 0 <= s["policy_lag_mean"] <= (0 if name == "serial" else 2)
    assert (tmp_path / "learning.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_every_run_is_written_at_once_and_resume_runs_only_the_missing_ones(tmp_path, monkeypatch):
    import nanorllm.bench.learning as learning

    calls = []

    def fake_run(cfg, eval_every, initial):
        calls.append((cfg.serial, cfg.seed))
        if len(calls) == 3:
            raise KeyboardInterrupt  # the benchmark is cut short during its third run
        curve = [{"update": 0, "wall_s": 0.0, "success": 0.5, "first_turn_success": 0.4},
                 {"update": 2, "wall_s": 9.0, "success": 0.5 + 0.1 * cfg.seed, "first_turn_success": 0.5}]
        return {"curve": curve, "policy_lag_mean": 0.0, "policy_lag_max": 0, "mismatch_kl_lagged": None,
                "wall_s": 9.0, "startup_s": 0.0}

    monkeypatch.setattr(learning, "run_one", fake_run)
    args = ["--quick", "--seeds", "0,1", "--configs", "serial,lag1-none", "--out", str(tmp_path)]
    with pytest.raises(KeyboardInterrupt):
        main(args)
    record = json.loads((tmp_path / "learning.json").read_text())
    assert not record["complete"] and list(record["configurations"]) == ["serial"]
    assert record["configurations"]["serial"]["gains"] == pytest.approx([0.0, 0.1])
    assert main(args + ["--resume"]) == 0
    assert calls == [(True, 0), (True, 1), (False, 0), (False, 0), (False, 1)]  # serial is not run again
    record = json.loads((tmp_path / "learning.json").read_text())
    assert record["complete"] and [len(s["runs"]) for s in record["configurations"].values()] == [2, 2]
    with pytest.raises(SystemExit, match="updates"):
        main(args + ["--resume", "--updates", "3"])
    with pytest.raises(SystemExit, match="threads"):  # wall times measured with other threads do not mix
        main(args + ["--resume", "--threads", "1"])


def test_the_variants_table_runs_every_row_serially_with_its_one_setting():
    from nanorllm.bench.learning import VARIANTS

    rows = "default,rloo,reinforce++,dr-grpo,gspo,updates2,fill-batch,entropy,cosine"
    cfgs = configurations(LearningConfig(configs=rows))
    assert list(cfgs) == rows.split(",") and all(c["serial"] for c in cfgs.values())
    assert cfgs["dr-grpo"] == {"serial": True, "adv_normalize_std": False, "loss_agg": "seq-mean-token-sum-norm"}
    assert cfgs["gspo"] == {"serial": True, "ratio_level": "sequence", "loss_agg": "seq-mean"}
    assert cfgs["default"] == {"serial": True} and set(VARIANTS) == set(rows.split(","))
    from nanorllm.config import TrainConfig

    for name, overrides in cfgs.items():  # every row passes the config's checks
        assert TrainConfig(**overrides).validate() == [], name
    from nanorllm.bench.learning import base_config

    assert base_config(LearningConfig(threads=1)).threads == 1 and base_config(LearningConfig()).threads is None


def test_markdown_table_marks_a_row_with_fewer_seeds():
    from nanorllm.bench.learning import markdown_table

    run = {"curve": curve([0.4, 0.5, 0.6]), "wall_s": 20.0, "policy_lag_mean": 0.0, "policy_lag_max": 0,
           "mismatch_kl_lagged": None}
    record = {"seeds": [0, 1], "configurations": {"rloo": summarize([run, run]), "gspo": summarize([run])}}
    table = markdown_table(record).splitlines()
    assert table[2] == "| rloo | 2 | +0.200 ± 0.000 | 20 | 10 |"
    assert table[3] == "| gspo (only 1 of 2 seeds: not compared) | 1 | +0.200 ± 0.000 | 20 | 10 |"


@pytest.mark.slow
def test_quick_variants_table_runs_at_tiny_size(tmp_path, capsys):
    """Two variant rows at tiny-random size, one seed, two updates: the table the docs' command fills."""
    assert main(["--quick", "--seeds", "0", "--configs", "dr-grpo,fill-batch", "--updates", "2", "--eval-every", "1",
                 "--eval-limit", "4", "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "learning.json").read_text())
    assert list(record["configurations"]) == ["dr-grpo", "fill-batch"]
    assert all(len(s["runs"]) == 1 for s in record["configurations"].values())
    for s in record["configurations"].values():  # each update's norm before the clip, to see where it binds
        [run] = s["runs"]
        assert len(run["grad_norm"]) == 2 and all(n is None or n > 0 for n in run["grad_norm"])
        assert len(run["train_samples"]) == 2 and all(n >= 0 for n in run["train_samples"])
    # what fill-batch paid: tiny-random scores 0, no group is mixed, so every step draws to the cap (3 x 2 tasks)
    assert record["configurations"]["fill-batch"]["runs"][0]["extra_groups"] == [4, 4]
    assert record["configurations"]["dr-grpo"]["runs"][0]["extra_groups"] == [0, 0]
    assert "| dr-grpo | 1 |" in capsys.readouterr().out
