"""The config's groups: each field declared once, composed per program, flat outside (flags, file keys,
config.json), and the specs the lower floors take defaulting to what their groups say."""

import dataclasses
import json
import textwrap
from pathlib import Path

import pytest
import torch
import tyro

from nanorllm.config import TrainConfig, parse_config
from nanorllm.config import fields as groups
from nanorllm.config.fields import Objective
from nanorllm.config.specs import env_spec, lora_spec
from nanorllm.envs.base import EpisodeSettings
from nanorllm.envs.registry import EnvSpec
from nanorllm.policy.lora import LoraSpec
from nanorllm.rewards.functions import RewardFunctionsSpec, reward_functions_spec
from nanorllm.rewards.judge import JudgeSpec, judge_spec
from nanorllm.rewards.model import RewardModelSpec, reward_model_spec
from nanorllm.rewards.sources import REWARD_SOURCES
from nanorllm.trainer.eval_model import EvalConfig
from nanorllm.trainer.loss import compute_policy_loss

# config.json's keys as runs saved them before the fields were grouped: every one still loads and parses
SAVED_KEYS = """
    model env agent agent_timeout_s tool_parser tools max_tool_calls tool_timeout_s tool_alarm_steps env_arg reward
    reward_weights reward_mode reward_timeout_s reward_model reward_model_weight reward_model_norm
    reward_model_batch_size reward_model_dtype reward_model_device reward_model_max_tokens env_timeout_s tasks
    eval_tasks task_fields limit eval_limit judge judge_model judge_api_key_env judge_rubric judge_mode judge_weight
    judge_concurrency judge_retries judge_timeout_s judge_max_tokens eval_set eval_samples eval_temperature eval_k
    max_prompt_tokens drop_long_prompts max_turns max_new_tokens temperature top_p system_prompt worked_example
    grader_timeout_s max_steps tasks_per_step num_samples_per_task min_group_size lr weight_decay max_grad_norm
    clip_low clip_high loss_agg kl_coef adv_estimator adv_normalize_std adv_std adv_eps drop_zero_std_groups
    turn_credit turn_gamma off_policy_correction is_cap is_band dual_clip ratio_level gspo_clip_low gspo_clip_high
    entropy_coef lr_schedule warmup_steps updates_per_batch epochs micro_batch_tokens max_pad_frac
    max_batch_episodes cuda_graphs dtype tf32 lora_rank lora_alpha lora_dropout lora_targets lora_merged
    disable_dropout mask_truncated fill_batch fill_batch_cap overlong_buffer overlong_penalty grad_checkpointing
    memory_plan_only serial num_workers max_policy_lag devices learner_devices learner_parallel learner_timeout_s
    threads queue_size output_dir run_name report_to exp_name seed resume_new_data eval_every sample_every
    save_every keep_checkpoints rollout_dump_size save_model save_every_minutes worker_timeout_s
    worker_start_timeout_s restart_backoff_s max_restarts_per_worker max_restarts_per_run max_skipped_frac
""".split()


def group_classes() -> list[type]:
    """The groups fields.py declares and the reward sources' own (each declared in its module in rewards/)."""
    declared = [c for c in vars(groups).values() if dataclasses.is_dataclass(c) and c.__module__ == groups.__name__]
    return declared + [kind.settings for kind in REWARD_SOURCES.values() if kind.settings is not None]


def test_no_field_is_declared_in_two_groups_or_again_by_a_program():
    declared = [name for cls in group_classes() for name in cls.__dict__.get("__annotations__", {})]
    assert len(declared) == len(set(declared)) == len(dataclasses.fields(TrainConfig))
    eval_own = set(EvalConfig.__annotations__)
    assert eval_own == {"tasks", "device", "api_concurrency"}  # the rest are training's groups
    shared = {f.name for f in dataclasses.fields(EvalConfig)} - eval_own
    assert {"eval_limit", "threads", "env_arg", "dtype", "grader_timeout_s", "max_batch_episodes"} <= shared
    assert shared < {f.name for f in dataclasses.fields(TrainConfig)}


def spec_defaults(spec: type) -> dict:
    return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(spec)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}


@pytest.mark.parametrize("program", [TrainConfig, EvalConfig])
def test_every_spec_default_is_its_groups_default(program):
    cfg = program(judge="http://127.0.0.1:9/v1")
    built = {EnvSpec: env_spec(cfg), EpisodeSettings: env_spec(cfg).settings, JudgeSpec: judge_spec(cfg)}
    if program is TrainConfig:
        cfg = TrainConfig(judge="http://127.0.0.1:9/v1", reward_model="rm", lora_rank=4, reward=("r.py:f",))
        built.update({RewardModelSpec: reward_model_spec(cfg), LoraSpec: lora_spec(cfg),
                      RewardFunctionsSpec: reward_functions_spec(cfg)})
    given = {"reward_sources", "specs", "settings", "task_fields"}  # set above, nested specs (each checked itself),
    # parsed (none: {})
    for spec, value in built.items():
        defaults = spec_defaults(spec)
        assert defaults, spec
        differ = {k: (getattr(value, k), v) for k, v in defaults.items() if k not in given and getattr(value, k) != v}
        assert differ == {}, spec.__name__


def test_config_json_keeps_every_saved_key_flat_and_round_trips(tmp_path):
    cfg = TrainConfig(model="tiny-random", max_steps=3, env_arg=("a=1",), is_band=(0.4, 3.0), reward=("r.py:f",))
    saved = json.loads(json.dumps(cfg.saved()))
    assert set(SAVED_KEYS) <= set(saved) and all(not isinstance(v, dict) for v in saved.values())
    assert TrainConfig(**saved) == dataclasses.replace(cfg, resume_new_data=False)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(reversed(list(saved.items())))))  # key order means nothing
    assert parse_config(["--config", str(path)]) == TrainConfig(**saved)
    path.write_text(json.dumps({"env_arg": {"a": 1, "b": "x"}, "is_band": [0.4, 3.0], "eval_k": [1, 2],
                                "eval_samples": 2}))  # a file may give env_arg as a mapping
    cfg = parse_config(["--config", str(path)])
    assert (cfg.env_arg, cfg.is_band, cfg.eval_k) == (("a=1", "b=x"), (0.4, 3.0), (1, 2))


def test_flags_stay_flat_and_eval_takes_trainings_names_for_the_same_settings():
    cfg = parse_config(["--clip-high", "0.3", "--eval-limit", "5", "--threads", "1", "--env-arg", "a=1",
                        "--env-arg", "b=2"])
    assert (cfg.clip_high, cfg.eval_limit, cfg.threads, cfg.env_arg) == (0.3, 5, 1, ("a=1", "b=2"))
    ev = tyro.cli(EvalConfig, args=["--eval-limit", "5", "--threads", "1", "--env-arg", "a=1", "--env-arg", "b=2",
                                    "--dtype", "bf16"])
    assert (ev.eval_limit, ev.threads, ev.env_arg, ev.dtype) == (5, 1, ("a=1", "b=2"), "bf16")
    with pytest.raises(SystemExit):
        tyro.cli(EvalConfig, args=["--limit", "5"])


def test_the_loss_reads_its_group_off_a_whole_config_as_off_the_group_alone():
    logits = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    batch = {"targets": torch.tensor([1, 2, 3]), "old_logprobs": torch.tensor([-1.6, -1.2, -2.0]),
             "advantages": torch.tensor([1.0, -1.0, 0.5]), "sample_index": torch.tensor([0, 0, 1])}
    cfg = TrainConfig(clip_high=0.1, loss_agg="seq-mean", dual_clip=3.0)
    group = Objective(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(Objective)})
    whole, _ = compute_policy_loss(logits, batch, cfg)
    alone, _ = compute_policy_loss(logits, batch, group)
    default, _ = compute_policy_loss(logits, batch, Objective())
    assert isinstance(cfg, Objective) and whole.item() == alone.item() != default.item()


def test_reward_sources_without_env_mean_one_turn_episodes_in_training_and_evaluation_alike():
    from nanorllm.config.episode_env import episode_env

    for program in (TrainConfig, EvalConfig):
        assert episode_env(program(reward=("r.py:f",)), env_given=False) == "single"
        assert episode_env(program(judge="http://127.0.0.1:9/v1"), env_given=False) == "single"
        assert episode_env(program(reward=("r.py:f",)), env_given=True) == "math"  # --env math, named
        assert episode_env(program(agent="a.py:fn", reward=("r.py:f",)), env_given=False) == "math"  # the agent
        assert episode_env(program(), env_given=False) == "math"
    assert episode_env(TrainConfig(reward_model="rm"), env_given=False) == "single"
    assert parse_config(["--reward", "r.py:f"], world=lambda cfg: []).env == "single"


def test_the_startup_check_builds_the_runs_env_once_and_the_assembly_runs_that_same_bundle(tmp_path):
    from nanorllm.run.args import parse_train_args
    from nanorllm.run.assembly import assemble

    (tmp_path / "counted_env.py").write_text(
        "from nanorllm.envs.math_env import MathSelfRefine\n\n\nclass Counted(MathSelfRefine):\n    built = []\n\n"
        "    def __init__(self, *args, **kwargs):\n        Counted.built.append(1)\n"
        "        super().__init__(*args, **kwargs)\n")
    (tmp_path / "rw.py").write_text("def zero(completions, **kw):\n    return [0.0] * len(completions)\n")
    cfg, _, _, env = parse_train_args(["--model", "tiny-random", "--env", f"{tmp_path / 'counted_env.py'}:Counted",
                                       "--reward", f"{tmp_path / 'rw.py'}:zero", "--output-dir", str(tmp_path)])
    parts = assemble(cfg, env=env)
    assert parts.env is env and [f.name for f in env.sources.functions] == ["zero"]  # its reward sources came with it
    assert type(env.inner).built == [1]  # the check's bundle is the run's: built once


def test_eval_refuses_the_tool_and_timeout_values_training_refuses_naming_each_field():
    from nanorllm.trainer.eval_model import evaluate_model

    with pytest.raises(ValueError) as err:
        evaluate_model(EvalConfig(model="tiny-random", tools="", max_tool_calls=0, tool_timeout_s=0.0,
                                  reward_timeout_s=-1.0))
    for field in ("tools: empty", "max_tool_calls: must be >= 1", "tool_timeout_s: must be > 0",
                  "reward_timeout_s: must be > 0"):
        assert field in str(err.value)


def test_a_new_program_composes_its_config_as_the_fields_module_shows():
    snippet = groups.__doc__.split("same way, adding only the fields no group holds:")[1].split("\n\n")[1]
    space = dict(vars(groups))
    exec(textwrap.dedent(snippet), space)  # the documented pattern, as written
    sft = space["SFTConfig"]
    cfg = tyro.cli(sft, args=["--model", "tiny-random", "--lr", "1e-4", "--epochs", "2", "--lora-rank", "8"])
    assert (cfg.model, cfg.lr, cfg.epochs, cfg.lora_rank, cfg.threads) == ("tiny-random", 1e-4, 2, 8, None)
    assert lora_spec(cfg).rank == 8  # the specs take any program that composes their group


def test_all_of_says_every_group_is_needed_and_a_whole_config_is_one():
    from nanorllm.config.fields import AllOf, EnvSource, EpisodeShape, RewardFunctions, Sampling, ToolSettings, Turns

    assert AllOf[Sampling, Turns] is AllOf[Sampling, Turns]
    assert isinstance(TrainConfig(), AllOf[Sampling, Turns]) and not isinstance(Turns(), AllOf[Sampling, Turns])
    needs = AllOf[EnvSource, ToolSettings, RewardFunctions, EpisodeShape]
    assert isinstance(TrainConfig(), needs) and isinstance(EvalConfig(), needs)
    assert env_spec.__annotations__["cfg"] is needs


def test_no_function_takes_a_union_of_config_groups():
    """`A | B` of two groups says either will do; a function that reads both takes AllOf[A, B]."""
    import re
    from pathlib import Path

    import nanorllm

    names = "|".join(c.__name__ for c in group_classes())
    union = re.compile(rf"\b(cfg|config)\s*:\s*({names})\s*\|\s*({names})\b")
    root = Path(nanorllm.__file__).resolve().parent
    found = [f"{p.relative_to(root)}: {m.group(0)}" for p in sorted(root.rglob("*.py"))
             for m in union.finditer(p.read_text())]
    # the one union left is an either: evaluation's episode shape alone, or the whole Episodes with its prompt limit
    assert found == ["config/specs.py: cfg: EpisodeShape | Episodes"]


FIXTURES = Path(__file__).parent / "fixtures"


def saved_before() -> dict:
    """A tiny serial run's config.json, as the code wrote it before its groups were renamed and split
    (tests/runs.py SERIAL, --max-steps 1 --save-every 1)."""
    return json.loads((FIXTURES / "saved_config.json").read_text())


ADDED_SINCE = {"pool_every": 4, "pool_size": 3}  # fields added after the fixture was written, at their defaults


def test_a_config_json_saved_before_loads_with_every_field_as_it_was():
    saved = saved_before()
    cfg = TrainConfig.from_saved(saved)
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    assert [n for n in names if n not in ADDED_SINCE] == [k for k in saved if k != "dtype_choice"]  # none lost
    assert json.loads(json.dumps(cfg.saved())) == {**{k: v for k, v in saved.items() if k != "dtype_choice"},
                                                   **ADDED_SINCE}
    assert cfg.validate() == []


@pytest.mark.slow
def test_a_run_whose_config_json_was_saved_before_resumes_and_evaluates(tmp_path):
    from nanorllm.run.lifecycle import main
    from nanorllm.trainer.eval_model import evaluate_model, with_run_settings
    from tests.runs import length_rule_grading, train_in_process

    train_in_process(tmp_path, "run", ["--max-steps", "1", "--save-every", "1"])
    run = tmp_path / "run"
    saved = {**saved_before(), "output_dir": str(tmp_path), "run_name": "run"}  # where this copy of it lies
    (run / "config.json").write_text(json.dumps(saved, indent=2))
    with length_rule_grading():
        assert main(["--resume", str(run), "--max-steps", "2"]) == 0
        result = evaluate_model(with_run_settings(EvalConfig(model=str(run / "final_model")), set())[0])
    assert json.loads((run / "config.json").read_text())["max_steps"] == 2
    assert result["n"] == saved["eval_limit"]
