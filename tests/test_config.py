import json

import pytest

from nanorllm.config import ConfigError, TrainConfig, parse_config, read_config_file


def test_defaults_are_valid():
    assert TrainConfig().validate() == []


def test_every_bad_field_is_reported_once_by_name():
    cfg = TrainConfig(max_turns=0, lr=0.0, top_p=1.5, loss_agg="sum", clip_low=1.0, dtype="float16",
                      num_samples_per_task=1, limit=0, kl_coef=-0.1)
    problems = cfg.validate()
    names = [p.split(":", 1)[0] for p in problems]
    assert sorted(names) == sorted(["max_turns", "lr", "top_p", "loss_agg", "clip_low", "dtype",
                                    "num_samples_per_task", "limit", "kl_coef"])
    assert "got 1.5" in problems[names.index("top_p")]
    assert "'sum'" in problems[names.index("loss_agg")]


def test_parse_flags_override_defaults():
    cfg = parse_config(["--max-steps", "3", "--lr", "0.1", "--loss-agg", "seq-mean", "--serial"])
    assert (cfg.max_steps, cfg.lr, cfg.loss_agg, cfg.serial) == (3, 0.1, "seq-mean", True)
    assert cfg.max_turns == TrainConfig().max_turns


def test_parse_no_args_gives_defaults():
    assert parse_config([]) == TrainConfig()


def test_parse_invalid_flag_value_raises_config_error():
    with pytest.raises(ConfigError) as err:
        parse_config(["--max-turns", "0", "--temperature", "0"])
    assert err.value.problems == ["max_turns: must be >= 1, got 0", "temperature: must be > 0, got 0.0"]
    assert "command-line flags" in str(err.value)


def test_choices_off_the_list_are_reported_with_the_other_problems(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"turn_credit": "step", "dtype": "half"}))
    with pytest.raises(ConfigError) as err:
        parse_config(["--config", str(path), "--max-turns", "0", "--loss-agg=sum", "--learner-parallel", "tp",
                      "--dtype", "bf16"])
    assert sorted(err.value.problems) == sorted([
        "max_turns: must be >= 1, got 0",
        f"turn_credit: must be 'episode' or 'turn', got 'step' ({path}:1)",
        "loss_agg: must be one of token-mean, seq-mean, seq-mean-token-sum-norm, got 'sum'",
        "learner_parallel: must be 'ddp' or 'fsdp', got 'tp'"])


def test_dtype_aliases_parse_and_help_lists_the_choices(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # help wraps to the terminal's width
    assert parse_config(["--dtype", "bf16"]).dtype == "bf16"
    assert parse_config(["--dtype=bfloat16"]).dtype == "bfloat16" and parse_config([]).dtype == "auto"
    with pytest.raises(SystemExit):
        parse_config(["--help"])
    out = capsys.readouterr().out
    for listed in ["{token-mean,seq-mean,seq-mean-token-sum-norm}", "{episode,turn}", "{none,tis,mis,decoupled}",
                   "{grpo,rloo,reinforce++,rae}", "{token,sequence}", "{constant,linear,cosine}",
                   "{auto,float32,bfloat16,fp32,bf16}", "{ddp,fsdp}"]:
        assert listed in out


def test_json_file_applies_and_flags_override(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"max_steps": 7, "lr": 0.5, "model": "tiny-random"}))
    cfg = parse_config(["--config", str(path)])
    assert (cfg.max_steps, cfg.lr, cfg.model) == (7, 0.5, "tiny-random")
    cfg = parse_config(["--config", str(path), "--lr", "0.25"])
    assert (cfg.max_steps, cfg.lr, cfg.model) == (7, 0.25, "tiny-random")
    cfg = parse_config(["--lr", "0.25", "--config", str(path)])
    assert cfg.lr == 0.25


def test_yaml_file_applies_and_flags_override(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("max_steps: 4\nnum_samples_per_task: 3\nclip_high: 0.1\nrun_name: demo\n")
    cfg = parse_config(["--config", str(path), "--max-steps", "9"])
    assert (cfg.max_steps, cfg.num_samples_per_task, cfg.clip_high, cfg.run_name) == (9, 3, 0.1, "demo")


def test_empty_yaml_file_is_defaults(tmp_path):
    path = tmp_path / "empty.yml"
    path.write_text("")
    assert parse_config(["--config", str(path)]) == TrainConfig()


def test_unknown_key_in_file_is_named(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("max_step: 4\nlr: 0.1\nlearning_rate: 2\n")
    with pytest.raises(ConfigError) as err:
        parse_config(["--config", str(path)])
    assert err.value.problems == [f"max_step: unknown field (did you mean max_steps?) ({path}:1)",
                                  f"learning_rate: unknown field ({path}:3)"]
    assert str(path) in str(err.value)


def test_non_mapping_file_is_rejected(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="expected a mapping"):
        read_config_file(str(path))


def test_invalid_value_in_file_names_the_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"micro_batch_tokens": 0}))
    with pytest.raises(ConfigError) as err:
        parse_config(["--config", str(path)])
    assert err.value.problems == [f"micro_batch_tokens: must be >= 1, got 0 ({path}:1)"]
    assert str(path) in str(err.value)


def test_gemini_model_cannot_be_trained():
    with pytest.raises(ConfigError) as err:
        parse_config(["--model", "gemini:foo"])
    (problem,) = err.value.problems
    assert problem.startswith("model: 'gemini:foo'")
    assert "not trained" in problem
