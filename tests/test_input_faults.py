"""Bad input and damaged files on the newer surfaces (run folder names, the final model's write, LoRA adapter
files, checkpoints kept, reward functions and task sources, conversational data, the memory plan's host
numbers): each is refused in one line naming what is wrong, or handled, and each is injected into a real run
where a run is what meets it."""

import json
from pathlib import Path

import pytest

from nanorllm.run.lifecycle import main
from tests.procs import TINY_ARGS


@pytest.mark.parametrize("exp_name", ["/../../../tmp/x", "a/b", "..\\..\\x", "a\0b"])
def test_an_exp_name_that_is_a_path_is_refused_before_any_folder_is_made(exp_name, tmp_path, capsys):
    assert main([*TINY_ARGS, "--serial", "--exp-name", exp_name, "--output-dir", str(tmp_path / "out")]) == 2
    assert f"exp_name: must be a plain name" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("lora", [[], ["--lora-rank", "4"]], ids=["full", "lora"])
def test_a_full_disk_while_the_final_model_is_written_leaves_no_final_model_that_looks_whole(
        lora, tmp_path, monkeypatch):
    monkeypatch.setenv("NANORLLM_FAULT", "disk_full:final")
    args = [*TINY_ARGS, "--serial", *lora, "--max-steps", "1", "--eval-tasks", "", "--output-dir", str(tmp_path)]
    assert main([*args, "--run-name", "full"]) == 1
    assert sorted(p.name for p in (tmp_path / "full").iterdir() if "final" in p.name) == []
    assert (tmp_path / "full" / "checkpoints" / "step_1").is_dir()  # the run's last step is still on disk
    monkeypatch.delenv("NANORLLM_FAULT")
    assert main([*args, "--run-name", "room"]) == 0
    written = sorted(p.name for p in (tmp_path / "room").iterdir() if "final" in p.name)
    assert written == ["final_model"]
    assert (tmp_path / "room" / "final_model" / "merged" / "config.json").is_file() == bool(lora)


# ---- LoRA adapter files --------------------------------------------------------------------------------
def saved_adapter(path: Path, *, rank: int = 4, targets: str = "q_proj") -> Path:
    from nanorllm.policy.hf_causal import HFCausalPolicy
    from nanorllm.policy.lora import LoraSpec

    HFCausalPolicy.from_name("tiny-random", lora=LoraSpec(rank=rank, alpha=8.0, targets=targets)).save(str(path))
    return path


def edit_config(path: Path, **fields) -> Path:
    config = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**config, **fields}))
    return path


def foreign_adapters(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Adapter folders whose config and weights disagree, or whose base leads back to themselves, with the
    line each is refused with."""
    loop_a, loop_b = tmp_path / "loop_a", tmp_path / "loop_b"
    edit_config(saved_adapter(loop_a), base_model_name_or_path=str(loop_b))
    edit_config(saved_adapter(loop_b), base_model_name_or_path=str(loop_a))
    return {
        "other targets": (edit_config(saved_adapter(tmp_path / "t"), target_modules=["v_proj"]), "4 missing"),
        "more targets": (edit_config(saved_adapter(tmp_path / "m"), target_modules=["q_proj", "k_proj"]),
                         "4 missing (first: base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight)"),
        "fewer targets": (edit_config(saved_adapter(tmp_path / "f", targets="q_proj,v_proj"),
                                      target_modules=["q_proj"]), "4 not adapters of this model"),
        "other rank": (edit_config(saved_adapter(tmp_path / "r"), r=8), "4 of another shape"),
        "targets it lacks": (edit_config(saved_adapter(tmp_path / "n"), target_modules=["wq"]),
                             "do not apply to LlamaForCausalLM"),
        "itself as base": (edit_config(saved_adapter(tmp_path / "s"), base_model_name_or_path=str(tmp_path / "s")),
                           "base_model_name_or_path leads back to"),
        "a loop of two": (loop_a, "base_model_name_or_path leads back to"),
    }


def test_an_adapter_whose_weights_do_not_fill_its_own_config_or_whose_base_is_itself_is_a_lora_error(tmp_path):
    from nanorllm.policy.lora import LoraError
    from nanorllm.policy.models import load_model_and_tokenizer

    for case, (path, line) in foreign_adapters(tmp_path).items():
        with pytest.raises(LoraError) as e:
            load_model_and_tokenizer(str(path))
        assert line in str(e.value), case
        assert str(path) in str(e.value), case


def test_a_stacked_adapter_loads_every_adapter_of_its_chain(tmp_path):
    """The loop check follows the chain without flattening it: an adapter on an adapter keeps both."""
    import torch

    from nanorllm.policy.hf_causal import HFCausalPolicy
    from nanorllm.policy.lora import LoraSpec
    from nanorllm.policy.models import load_model_and_tokenizer

    first = saved_adapter(tmp_path / "first")
    with torch.no_grad():
        p = HFCausalPolicy.from_name(str(first), lora=LoraSpec(rank=4, alpha=8.0, targets="v_proj"))
        for n, w in p.model.named_parameters():
            if "lora_B" in n:
                w.fill_(0.1)
        p.save(str(tmp_path / "second"))
        edit_config(tmp_path / "second", base_model_name_or_path=str(first))
        ids = torch.tensor([[5, 6, 7, 8]])
        stacked = load_model_and_tokenizer(str(tmp_path / "second"))[0](input_ids=ids).logits
        alone = load_model_and_tokenizer(str(first))[0](input_ids=ids).logits
    assert float((stacked - alone).abs().max()) > 1e-4


def test_resuming_into_adapters_of_another_rank_is_a_lora_error_not_a_size_mismatch(tmp_path):
    from nanorllm.policy.hf_causal import HFCausalPolicy
    from nanorllm.policy.lora import LoraError, LoraSpec

    path = saved_adapter(tmp_path / "a", rank=4)
    with pytest.raises(LoraError, match=r"adapter_model.safetensors: the weights do not fit .* of another shape"):
        HFCausalPolicy.from_name("tiny-random", lora=LoraSpec(rank=8, alpha=8.0, targets="q_proj"), adapter=str(path))


def test_eval_of_a_foreign_adapter_exits_2_naming_the_file(tmp_path, capsys):
    from nanorllm.run import evaluation

    for case, (path, line) in foreign_adapters(tmp_path).items():
        assert evaluation.main(["--model", str(path), "--tasks", "arith:count=2,seed=1", "--max-new-tokens", "2"]
                                ) == 2, case
        assert line in capsys.readouterr().err, case


# ---- checkpoints kept ----------------------------------------------------------------------------------
def cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def overwrite_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2:len(data) // 2 + 64] = b"\1" * 64
    path.write_bytes(bytes(data))


@pytest.mark.slow
@pytest.mark.parametrize("damage", [cut_short, overwrite_middle], ids=["cut short", "overwritten"])
def test_keep_checkpoints_counts_only_whole_ones_after_a_resume_past_a_damaged_one(damage, tmp_path, capsys):
    args = [*TINY_ARGS, "--serial", "--eval-tasks", "", "--keep-checkpoints", "2", "--output-dir", str(tmp_path)]
    assert main([*args, "--max-steps", "4", "--save-every", "2", "--run-name", "k"]) == 0
    ckpts = tmp_path / "k" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_2", "step_4"]
    damage(ckpts / "step_4" / "optimizer.pt")
    assert main(["--resume", str(tmp_path / "k"), "--max-steps", "3"]) == 0
    assert sorted(p.name for p in ckpts.iterdir()) == ["damaged-step_4", "step_2", "step_3"]
    assert "set aside as damaged-step_4" in capsys.readouterr().out


@pytest.mark.slow
def test_a_save_sets_aside_a_checkpoint_cut_short_since_instead_of_counting_it(tmp_path, capsys):
    from nanorllm.trainer import checkpoint

    args = [*TINY_ARGS, "--serial", "--eval-tasks", "", "--keep-checkpoints", "3", "--output-dir", str(tmp_path)]
    assert main([*args, "--max-steps", "3", "--save-every", "1", "--run-name", "k"]) == 0
    ckpts = tmp_path / "k" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_1", "step_2", "step_3"]
    cut_short(ckpts / "step_3" / "rng.pt")
    checkpoint.prune(tmp_path / "k", keep=2)
    assert sorted(p.name for p in ckpts.iterdir()) == ["damaged-step_3", "step_1", "step_2"]
    assert "step_3: rng.pt is" in capsys.readouterr().out


# ---- reward functions and task sources -----------------------------------------------------------------
REWARDS = '''
def some(completions, task_id, **kw):
    """TRL's way of saying a function does not apply: None for those samples."""
    return [None if int(t[-1]) % 2 else float(len(c) % 2) for c, t in zip(completions, task_id)]

def never(completions, **kw):
    return [None] * len(completions)

def half(completions, **kw):
    return [0.5] * len(completions)

def needs_solution(completions, solution):
    return [0.0] * len(completions)

def maybe_solution(completions, solution=None):
    return [0.0] * len(completions)

def by_level(completions, level, **kw):
    return [1.0 if lv == "easy" else 0.0 for lv in level]

def by_length(completions, **kw):
    return [float(len(c) % 2) for c in completions]

def trl_conversational(completions, **kw):
    """Copied from TRL's docs for conversational datasets."""
    contents = [completion[0]["content"] for completion in completions]
    return [float(len(c) % 2) for c in contents]

def shapes(completions, prompts, **kw):
    shapes.seen = (completions, prompts)
    return [0.0] * len(completions)
'''


@pytest.fixture
def rewards(tmp_path):
    path = tmp_path / "rw.py"
    path.write_text(REWARDS)
    return str(path)


def scored(rewards, names, *, env="single", mode="add"):
    from nanorllm.envs.base import EpisodeSettings
    from nanorllm.envs.registry import load_env
    from nanorllm.envs.scored import RewardBundle
    from nanorllm.rewards.functions import load_reward_functions

    return RewardBundle(load_env(env, EpisodeSettings()), load_reward_functions(tuple(f"{rewards}:{n}" for n in names)),
                        mode)


def episodes(questions: list, responses: list[str], env_reward: float = 0.0):
    from nanorllm.core.types import RolloutResult, Step, StepSample, Trajectory

    out = []
    for i, (q, text) in enumerate(zip(questions, responses)):
        task = {"task_id": f"t{i}", "question": q}
        traj = Trajectory(task_id=task["task_id"], task=task, final_reward=env_reward, termination_reason="max_turns",
                          steps=[Step(observation="q", model_response=text, reward=env_reward)])
        out.append(RolloutResult(trajectory=traj, step_samples=[StepSample(
            task_id=task["task_id"], episode_id="e", turn=0, prompt_ids=[1], response_ids=[7], rollout_logprobs=[0.0])]))
    return out


def test_a_reward_of_none_leaves_that_function_out_of_that_sample_as_trl_sums_with_nansum(rewards, capsys):
    batch = episodes(["a", "b", "c"], ["xx", "x", "x"], env_reward=1.0)
    scored(rewards, ["some", "half"], env="math").score_batch(batch)  # add: the env's reward stands
    assert [r.trajectory.final_reward for r in batch] == [1.0 + 0.0 + 0.5, 1.0 + 0.5, 1.0 + 1.0 + 0.5]
    assert [r.trajectory.termination_reason for r in batch] == ["max_turns"] * 3
    assert "reward/some" not in batch[1].trajectory.steps[-1].info
    b = scored(rewards, ["some"], env="math")
    assert b.metrics(batch) == {"reward/some": 0.5, "reward/failed/some": 0}  # over the samples it scored


@pytest.mark.parametrize("env, mode", [("single", "add"), ("math", "replace")])
def test_an_episode_no_function_scores_with_no_env_reward_to_stand_in_is_an_env_error(rewards, capsys, env, mode):
    batch = episodes(["a", "b", "c"], ["xx", "x", "x"], env_reward=1.0)
    scored(rewards, ["some", "never"], env=env, mode=mode).score_batch(batch)
    assert [r.trajectory.termination_reason for r in batch] != ["error"] * 3
    assert batch[1].trajectory.termination_reason == "error"  # t1: `some` says None, `never` too
    assert "no reward function scored episode t1" in capsys.readouterr().err


@pytest.mark.slow
def test_a_run_whose_function_skips_half_the_tasks_trains_on_the_rest_and_counts_them(rewards, tmp_path):
    from tests.procs import read_scalars

    assert main([*TINY_ARGS, "--serial", "--reward", f"{rewards}:some", "--max-steps", "2", "--eval-tasks", "",
                 "--output-dir", str(tmp_path), "--run-name", "n"]) == 0
    scalars = read_scalars(tmp_path / "n")
    assert sum(v for _, v in scalars["rollout/env_errors"]) > 0  # the tasks with an odd last digit
    assert all(0 <= v <= 1 for _, v in scalars["reward/some"])


@pytest.mark.parametrize("extra", [[], ["--eval-set", "x={eval}"]], ids=["training tasks", "an eval set"])
def test_a_reward_function_that_takes_a_column_the_tasks_lack_is_refused_at_start(rewards, tmp_path, capsys, extra):
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"task_id": "a", "question": "1+1?", "answer": "2"}\n')
    with_solution = tmp_path / "sol.jsonl"
    with_solution.write_text('{"task_id": "a", "question": "1+1?", "answer": "2", "solution": "2"}\n')
    tasks = str(with_solution) if extra else str(plain)
    flags = [f.replace("{eval}", str(plain)) for f in extra]
    assert main([*TINY_ARGS, "--serial", "--reward", f"{rewards}:needs_solution", "--tasks", tasks, "--eval-tasks", "",
                 *flags, "--output-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{plain}: reward function {rewards}:needs_solution takes 'solution', which is no column" in err
    assert "(columns: answer, question, task_id)" in err
    assert not (tmp_path / "out").exists()


def test_a_column_a_function_takes_with_a_default_or_that_the_tasks_have_is_accepted(rewards, tmp_path):
    path = tmp_path / "sol.jsonl"
    path.write_text('{"task_id": "a", "question": "1+1?", "answer": "2", "solution": "2"}\n')
    assert len(scored(rewards, ["maybe_solution"]).load_tasks(str(path))) == 1
    assert len(scored(rewards, ["maybe_solution"]).load_tasks("arith:count=2,seed=1")) == 2
    assert scored(rewards, ["needs_solution"]).load_tasks(str(path))[0]["solution"] == "2"


def test_jsonl_and_parquet_keep_a_rows_other_columns_with_or_without_task_fields(tmp_path):
    import pandas as pd

    from nanorllm.datasets.tasks import load_tasks

    rows = [{"task_id": "a", "question": "1+1?", "answer": "2", "level": "easy"},
            {"task_id": "b", "question": "2+2?", "answer": "4", "level": "hard"}]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "gsm.jsonl").write_text("".join(json.dumps({"question": r["question"], "answer": f"#### {r['answer']}",
                                                            "level": r["level"]}) + "\n" for r in rows))
    pd.DataFrame(rows).to_parquet(tmp_path / "t.parquet")
    for source in ("t.jsonl", "gsm.jsonl", "t.parquet"):
        for fields in (None, {"question": "question"}):
            tasks = load_tasks(str(tmp_path / source), fields=fields)
            assert [(t["answer"], t["level"]) for t in tasks] == [("2", "easy"), ("4", "hard")], (source, fields)


@pytest.mark.slow
def test_a_run_reads_a_jsonl_files_own_column_through_a_reward_function(rewards, tmp_path):
    from tests.procs import read_scalars

    path = tmp_path / "levels.jsonl"
    path.write_text("".join(json.dumps({"task_id": f"t{i}", "question": f"{i}+1?", "answer": str(i + 1),
                                        "level": "easy" if i % 2 else "hard"}) + "\n" for i in range(8)))
    assert main([*TINY_ARGS, "--serial", "--reward", f"{rewards}:by_level", "--tasks", str(path), "--eval-tasks", "",
                 "--max-steps", "1", "--output-dir", str(tmp_path), "--run-name", "l"]) == 0
    assert 0 < read_scalars(tmp_path / "l")["reward/by_level"][0][1] < 1


def prompt_only_sources(tmp_path) -> list[str]:
    import pandas as pd

    rows = [{"prompt": f"Write {i} words."} for i in range(6)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pd.DataFrame(rows).to_parquet(tmp_path / "p.parquet")
    (tmp_path / "q.jsonl").write_text("".join(json.dumps({"task_id": f"q{i}", "question": r["prompt"]}) + "\n"
                                              for i, r in enumerate(rows)))
    return [str(tmp_path / n) for n in ("p.jsonl", "p.parquet", "q.jsonl")]


def test_a_prompt_only_dataset_loads_for_reward_functions_alone_and_is_refused_where_an_env_grades(tmp_path, rewards):
    from nanorllm.datasets.errors import TaskFileError
    from nanorllm.envs.base import EpisodeSettings
    from nanorllm.envs.registry import load_env

    for source in prompt_only_sources(tmp_path):
        tasks = scored(rewards, ["by_length"]).load_tasks(source)
        assert len(tasks) == 6 and tasks[0]["question"] == "Write 0 words." and "answer" not in tasks[0], source
        with pytest.raises(TaskFileError, match="answer"):
            load_env("math", EpisodeSettings()).load_tasks(source)


@pytest.mark.slow
def test_a_run_on_a_prompt_only_parquet_file_scored_by_a_function_trains(rewards, tmp_path):
    source = prompt_only_sources(tmp_path)[1]
    assert main([*TINY_ARGS, "--serial", "--reward", f"{rewards}:by_length", "--tasks", source, "--eval-tasks", "",
                 "--max-steps", "1", "--output-dir", str(tmp_path), "--run-name", "p"]) == 0
    assert (tmp_path / "p" / "final_model").is_dir()


def test_a_source_with_an_at_in_its_path_splits_at_the_last_at_everywhere(tmp_path):
    import datasets
    import pandas as pd

    from nanorllm.datasets.hf_tasks import is_datasets_source, split_spec
    from nanorllm.datasets.tasks import load_tasks

    folder = tmp_path / "team@lab" / "gsm"
    frame = lambda a: pd.DataFrame({"question": ["1+1?", "2+2?"], "answer": [a, "4"]})  # noqa: E731
    datasets.DatasetDict({"train": datasets.Dataset.from_pandas(frame("2")),
                          "test": datasets.Dataset.from_pandas(frame("7"))}).save_to_disk(str(folder))
    assert split_spec(f"{folder}@test") == (str(folder), "test")
    assert split_spec(str(folder)) == (str(folder), "")
    assert is_datasets_source(f"{folder}@test") and is_datasets_source(str(folder))
    test = load_tasks(f"{folder}@test")
    assert [t["answer"] for t in test] == ["7", "4"] and test[0]["task_id"] == "gsm-00000"
    assert [t["answer"] for t in load_tasks(str(folder))] == ["2", "4"]  # train, the default split
    named = tmp_path / "v@2"  # a folder whose own name has an @ is that folder
    datasets.Dataset.from_pandas(frame("5")).save_to_disk(str(named))
    assert split_spec(str(named)) == (str(named), "")
    assert load_tasks(str(named))[0]["answer"] == "5"


def test_a_limit_on_a_parquet_file_reads_only_that_many_rows(tmp_path):
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from nanorllm.datasets.errors import TaskFileError
    from nanorllm.datasets.tasks import load_tasks

    frame = pd.DataFrame({"question": [f"{i}+1?" for i in range(40)] + [" "], "answer": [str(i + 1) for i in range(41)],
                          "level": ["easy"] * 41})
    path = tmp_path / "big.parquet"
    pq.write_table(pa.Table.from_pandas(frame), path, row_group_size=8)  # the bad last row in the last group
    with pytest.raises(TaskFileError, match="row 40: column 'question' is empty"):
        load_tasks(str(path))
    part = load_tasks(str(path), limit=10)
    assert part == load_tasks(str(path), limit=40)[:10] and len(part) == 10 and part[3]["level"] == "easy"


@pytest.mark.slow
def test_a_run_loads_each_task_source_once(tmp_path, monkeypatch):
    import pandas as pd

    from nanorllm.datasets import hf_tasks

    loads = []
    real = hf_tasks.load_dataset_tasks
    monkeypatch.setattr(hf_tasks, "load_dataset_tasks", lambda spec, **kw: loads.append(spec) or real(spec, **kw))
    for name, seed in (("train", 0), ("held", 100), ("other", 200)):
        pd.DataFrame({"question": [f"{i}+{seed}?" for i in range(8)],
                      "answer": [str(i + seed) for i in range(8)]}).to_parquet(tmp_path / f"{name}.parquet")
    assert main([*TINY_ARGS, "--serial", "--tasks", str(tmp_path / "train.parquet"), "--eval-tasks",
                 str(tmp_path / "held.parquet"), "--eval-set", f"o={tmp_path / 'other.parquet'}", "--max-steps", "1",
                 "--output-dir", str(tmp_path), "--run-name", "once"]) == 0
    assert sorted(loads) == sorted(str(tmp_path / f"{n}.parquet") for n in ("train", "held", "other"))


# ---- conversational data, as TRL holds it ---------------------------------------------------------------
CHAT = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Name a colour."}]


def conversational_file(tmp_path: Path, n: int = 8) -> Path:
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"prompt": [CHAT[0], {"role": "user", "content": f"Name colour {i}."}]}) + "\n"
                            for i in range(n)))
    return path


def test_a_prompt_of_chat_messages_is_the_conversation_as_it_stands_system_turn_included(tmp_path, rewards):
    from nanorllm.policy.hf_causal import HFCausalPolicy

    bundle = scored(rewards, ["trl_conversational"])
    task = bundle.load_tasks(str(conversational_file(tmp_path)))[0]
    assert task["question"] == [CHAT[0], {"role": "user", "content": "Name colour 0."}]
    agent = bundle.make_agent()
    agent.reset(task, bundle.make_env().reset(task))
    assert agent.messages == task["question"]  # no system prompt or worked example of ours
    policy = HFCausalPolicy.from_name("tiny-random")
    want = policy.tokenizer.apply_chat_template(task["question"], tokenize=False, add_generation_prompt=True)
    assert policy.tokenizer.decode(policy.first_prompt_ids(agent.messages)) == want
    assert "Answer in one word." in want
    text = scored(rewards, ["by_length"]).load_tasks("arith:count=1,seed=1")[0]
    agent.reset(text, bundle.make_env().reset(text))
    assert agent.messages[0]["role"] == "system" and agent.messages[-1]["content"] == text["question"]


def test_reward_functions_get_completions_and_prompts_in_trls_shape_for_each_kind_of_prompt(rewards):
    import sys

    batch = episodes([CHAT, "What is 1+1?"], ["blue", "2"])
    scored(rewards, ["shapes"]).score_batch(batch)
    module = next(m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == str(Path(rewards).resolve()))
    completions, prompts = module.shapes.seen
    assert completions == [[{"role": "assistant", "content": "blue"}], "2"]
    assert prompts == [CHAT, "What is 1+1?"]
    chat = episodes([CHAT, CHAT], ["blue", "red!"])
    scored(rewards, ["trl_conversational"]).score_batch(chat)  # TRL's docs' function, as copied
    assert [r.trajectory.final_reward for r in chat] == [0.0, 0.0] and chat[0].trajectory.termination_reason != "error"


def test_a_prompt_of_chat_messages_is_refused_where_an_env_grades_and_bad_messages_name_the_line(tmp_path):
    from nanorllm.datasets.errors import TaskFileError
    from nanorllm.datasets.tasks import load_tasks
    from nanorllm.envs.base import EpisodeSettings
    from nanorllm.envs.registry import load_env

    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"task_id": "a", "question": CHAT, "answer": "red"}) + "\n")
    with pytest.raises(TaskFileError, match=r"c.jsonl:1: field 'question' holds chat messages .* --env single"):
        load_env("math", EpisodeSettings()).load_tasks(str(path))
    path.write_text(json.dumps({"question": [{"role": "robot", "content": "x"}]}) + "\n")
    with pytest.raises(TaskFileError, match=r"c.jsonl:1: field 'question' message 0 is not"):
        load_tasks(str(path), gold=False, chat=True)


@pytest.mark.slow
def test_a_conversational_run_scored_by_trls_docs_function_trains_every_update(rewards, tmp_path):
    from tests.procs import read_scalars

    assert main([*TINY_ARGS, "--serial", "--reward", f"{rewards}:trl_conversational", "--tasks",
                 str(conversational_file(tmp_path)), "--eval-tasks", "", "--max-steps", "2", "--lr", "1e-3",
                 "--no-drop-zero-std-groups", "--output-dir", str(tmp_path), "--run-name", "c"]) == 0
    scalars = read_scalars(tmp_path / "c")
    assert [v for _, v in scalars["rollout/env_errors"]] == [0.0, 0.0]
    assert [s for s, _ in scalars["reward/trl_conversational"]] == [1, 2]


@pytest.mark.slow
def test_eval_of_a_runs_own_model_takes_the_runs_settings_unless_flags_say_otherwise(rewards, tmp_path, capsys):
    from nanorllm.run import evaluation

    assert main([*TINY_ARGS, "--serial", "--reward", f"{rewards}:by_length", "--max-steps", "1",
                 "--output-dir", str(tmp_path), "--run-name", "s"]) == 0
    capsys.readouterr()
    model = str(tmp_path / "s" / "final_model")

    def run_eval(*flags):
        assert evaluation.main(["--model", model, "--eval-limit", "4", *flags]) == 0
        out = capsys.readouterr()
        return json.loads(out.out.splitlines()[0]), out.err

    own, err = run_eval()
    assert own["mean_turns"] == 1.0 and own["n"] == 4 and "reward/by_length" in own  # scored by the run's function
    assert f"{tmp_path / 's' / 'config.json'}: the run's settings where no flag gives them" in err
    assert "env='single'" in err and "reward=(" in err and "max_new_tokens=8" in err
    saved = json.loads((tmp_path / "s" / "config.json").read_text())
    explicit = ["--env", "single", "--reward", f"{rewards}:by_length", "--max-new-tokens", "8", "--tasks",
                saved["eval_tasks"]]
    assert run_eval(*explicit)[0] == own
    math, err = run_eval("--env", "math", "--max-new-tokens", "4")
    assert "max_new_tokens" not in err and "env=" not in err  # flags win
    plain = evaluation.main(["--model", "tiny-random", "--eval-limit", "2", "--max-new-tokens", "4"])
    assert plain == 0 and "the run's settings" not in capsys.readouterr().err  # no run wrote it


def test_eval_settings_come_from_the_run_that_wrote_the_model_and_flags_win(tmp_path):
    from nanorllm.trainer.eval_model import EvalConfig, given_fields, with_run_settings

    run = tmp_path / "r"
    for d in ("final_model/merged", "checkpoints/step_2/model"):
        (run / d).mkdir(parents=True)
    (run / "final_model" / "config.json").write_text('{"model_type": "llama"}')  # the HF model's own config
    (run / "config.json").write_text(json.dumps({
        "max_steps": 2, "tasks_per_step": 4, "env": "single", "reward": ["rw.py:f"], "max_turns": 1,
        "max_new_tokens": 64, "eval_tasks": "held.jsonl", "eval_limit": 10, "worked_example": False,
        "model": "base", "dtype": "bfloat16", "seed": 7, "lr": 1e-5}))
    for model in ("final_model", "final_model/merged", "checkpoints/step_2/model"):
        argv = ["--model", str(run / model), "--max-turns", "3", "--no-worked-example"]
        cfg, line = with_run_settings(EvalConfig(model=str(run / model), max_turns=3, worked_example=False),
                                      given_fields(argv))
        assert (cfg.env, cfg.reward, cfg.max_new_tokens, cfg.tasks, cfg.eval_limit) == (
            "single", ("rw.py:f",), 64, "held.jsonl", 10), model
        assert (cfg.max_turns, cfg.worked_example, cfg.dtype, cfg.seed) == (3, False, "auto", 0), model
        assert str(run / "config.json") in line
    cfg, line = with_run_settings(EvalConfig(model="tiny-random", reward=("rw.py:f",)), set())
    assert line is None and cfg.env == "single"  # --reward without --env, as in training
    assert given_fields(["--env=math", "--max-new-tokens", "4", "--no-worked-example"]) == {
        "env", "max_new_tokens", "worked_example"}


def test_eval_of_a_run_scored_only_by_its_reward_model_is_refused_naming_the_env_to_grade_it_with(tmp_path, capsys):
    from nanorllm.run import evaluation

    run = tmp_path / "rm"
    (run / "final_model").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"max_steps": 2, "tasks_per_step": 4, "env": "single",
                                                 "reward": [], "reward_model": "runs/rm/model"}))
    assert evaluation.main(["--model", str(run / "final_model")]) == 2  # before any model loads
    err = capsys.readouterr().err
    assert "env='single'" in err and "error: env: 'single' episodes are scored by --reward functions" in err
    assert "--env math" in err


# ---- the host's memory, as a container sees it ---------------------------------------------------------
GiB = 2**30


def fake_host(tmp_path: Path, monkeypatch, *, cgroup: str, meminfo: str, files: dict[str, str]) -> Path:
    """/proc/self/cgroup, /proc/meminfo and a /sys/fs/cgroup tree of our own, read in their place."""
    from nanorllm.policy import slot_cache

    root = tmp_path / "sys_fs_cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    root.mkdir(exist_ok=True)
    (tmp_path / "cgroup").write_text(cgroup)
    (tmp_path / "meminfo").write_text(meminfo)
    monkeypatch.setattr(slot_cache, "CGROUP_ROOT", str(root))
    monkeypatch.setattr(slot_cache, "PROC_SELF_CGROUP", str(tmp_path / "cgroup"))
    monkeypatch.setattr(slot_cache, "MEMINFO", str(tmp_path / "meminfo"))
    return root


HOST_64 = f"MemTotal: {64 * GiB // 1024} kB\nMemFree: {2 * GiB // 1024} kB\nMemAvailable: {60 * GiB // 1024} kB\n"


@pytest.mark.parametrize("layout", ["v2", "v2 parent", "v1", "v1 namespaced"])
def test_a_memory_cgroup_on_a_bigger_host_is_what_the_host_has_for_this_process(tmp_path, monkeypatch, layout):
    from nanorllm.policy.slot_cache import host_memory

    cgroup, files, limit_file = {
        "v2": ("0::/job\n", {"job/memory.max": str(8 * GiB), "job/memory.current": str(GiB),
                             "job/memory.stat": f"anon 1\ninactive_file {GiB // 2}\n", "memory.max": "max"}, "job/memory.max"),
        "v2 parent": ("0::/a/b\n", {"a/b/memory.max": "max", "a/memory.max": str(8 * GiB),
                                    "a/memory.current": str(GiB // 2)}, "a/memory.max"),
        "v1": ("4:memory:/docker/x\n3:cpu:/\n", {"memory/docker/x/memory.limit_in_bytes": str(8 * GiB),
                                                 "memory/docker/x/memory.usage_in_bytes": str(GiB // 2)},
               "memory/docker/x/memory.limit_in_bytes"),
        "v1 namespaced": ("4:memory:/docker/x\n", {"memory/memory.limit_in_bytes": str(8 * GiB),
                                                   "memory/memory.usage_in_bytes": str(GiB // 2)},
                          "memory/memory.limit_in_bytes"),
    }[layout]
    root = fake_host(tmp_path, monkeypatch, cgroup=cgroup, meminfo=HOST_64, files=files)
    assert host_memory() == (int(7.5 * GiB), str(root / limit_file))


@pytest.mark.parametrize("limit", ["max", "9223372036854771712", str(100 * GiB)])
def test_no_cgroup_limit_or_one_above_the_hosts_leaves_the_hosts_figure(tmp_path, monkeypatch, limit):
    from nanorllm.policy.slot_cache import host_memory

    fake_host(tmp_path, monkeypatch, cgroup="0::/\n4:memory:/\n", meminfo=HOST_64,
              files={"memory.max": limit, "memory/memory.limit_in_bytes": limit})
    assert host_memory() == (60 * GiB, "MemAvailable")


def test_without_memavailable_free_memory_is_estimated_never_taken_as_unlimited(tmp_path, monkeypatch):
    from nanorllm.memory.plan import plan_run
    from nanorllm.config import TrainConfig
    from nanorllm.policy import slot_cache
    from nanorllm.run.assembly import assemble

    old_kernel = f"MemTotal: {64 * GiB // 1024} kB\nMemFree: {GiB // 1024} kB\nBuffers: {GiB // 1024} kB\nCached: {GiB // 1024} kB\n"
    fake_host(tmp_path, monkeypatch, cgroup="0::/\n", meminfo=old_kernel, files={})
    assert slot_cache.host_memory() == (3 * GiB, "MemFree + Buffers + Cached")
    (tmp_path / "meminfo").unlink()
    pages = slot_cache.host_memory()
    assert 0 < pages[0] < slot_cache.UNKNOWN and pages[1] == "free physical pages"

    def no_sysconf(name):
        raise ValueError(name)

    monkeypatch.setattr(slot_cache.os, "sysconf", no_sysconf)
    assert slot_cache.host_memory() == (slot_cache.UNKNOWN, "unknown")
    plan = plan_run(assemble(TrainConfig(model="tiny-random", serial=True)))
    assert "machine free memory unknown (not checked)" in plan.table()


def test_a_cuda_learner_with_cpu_workers_holds_the_shm_block_and_every_runtime_on_the_host():
    from nanorllm.config import TrainConfig
    from nanorllm.memory.plan import CUDA_CONTEXT_BYTES, RUNTIME_BYTES, plan_run
    from nanorllm.run.assembly import assemble
    from nanorllm.utils.devices import DeviceMap

    def plan(devices):
        parts = assemble(TrainConfig(model="preset:qwen2.5-0.5b", dtype="bf16"))
        parts.devices = devices
        return plan_run(parts, free={"cpu": 200 * 10**9, "cuda:0": 80 * 10**9, "cuda:1": 80 * 10**9},
                        shm_free=100 * 10**9)

    mixed = plan(DeviceMap(["cuda:0"], ["cpu", "cpu"]))
    on_gpu = {part.name: part.nbytes for d, p, part in mixed.held() if d == "cuda:0"}
    assert "shm block" not in on_gpu and "runtime" not in on_gpu and on_gpu["cuda context"] == CUDA_CONTEXT_BYTES
    host = [(p.name, part.name) for d, p, part in mixed.held() if d == "cpu"]
    assert ("learner", "shm block") in host and ("learner", "runtime") in host
    assert mixed.need()["cpu"] - mixed.need()["cuda:0"] != 0
    gpus = plan(DeviceMap(["cuda:0"], ["cuda:1", "cuda:1"]))
    cuda1 = [part for d, p, part in gpus.held() if d == "cuda:1"]
    assert sum(part.nbytes for part in cuda1 if part.name == "cuda context") == 2 * CUDA_CONTEXT_BYTES  # one a worker
    assert sum(part.nbytes for d, p, part in gpus.held() if d == "cpu" and part.name == "runtime") == 3 * RUNTIME_BYTES


def test_a_run_in_a_small_cgroup_is_refused_by_the_plan_naming_the_limit(tmp_path, monkeypatch, capsys):
    root = fake_host(tmp_path, monkeypatch, cgroup="0::/job\n", meminfo=HOST_64,
                     files={"job/memory.max": str(300 * 2**20), "job/memory.current": str(100 * 2**20)})
    assert main([*TINY_ARGS, "--serial", "--max-steps", "1", "--output-dir", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert f"machine 0.2 GB free ({root / 'job' / 'memory.max'})" in captured.out
    assert f"the plan needs" in captured.err and f"the host (all CPU processes, every runtime; {root / 'job' / 'memory.max'})" in captured.err
    assert not (tmp_path / "out").exists()
