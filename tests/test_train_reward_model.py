"""The reward-model program (launch/train_reward_model.py): fits a tiny classifier on labelled rows or preference
pairs (the loss falls, the folder it saves is a --reward-model), makes labelled rows from a policy, and refuses bad
rows by file, line, field."""

import json
import random
from pathlib import Path

import pytest

from nanorllm.supervised.data import pairs_from_labelled, read_rows
from nanorllm.rewards.model import RewardModel, reward_model_problems
from nanorllm.supervised.reward_model import main
from tests.test_reward_model import episodes


def write_rows(path: Path, rows: list) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def labelled(n: int = 32) -> list[dict]:
    return [{"prompt": f"is {i} even?", "response": "yes" if i % 2 else "no", "label": i % 2} for i in range(n)]


@pytest.mark.parametrize("rows, expected", [
    ([{"prompt": "q", "response": "a", "label": 1}, {"prompt": "q", "response": "a", "label": "yes"}],
     "rows.jsonl:2: field 'label': must be 0 or 1, got 'yes'"),
    ([{"prompt": "q", "response": "a"}], "rows.jsonl:1: field 'label': missing"),
    ([{"prompt": "q", "chosen": "a", "rejected": 3}], "rows.jsonl:1: field 'rejected': must be text, got int"),
    ([{"prompt": 5, "response": "a", "label": 0}], "rows.jsonl:1: field 'prompt': must be text or a list"),
    ([{"prompt": "q", "response": "a", "label": 0}, "{not json"], "rows.jsonl:2: invalid JSON"),
    ([{"prompt": "q", "chosen": "same", "rejected": "same"}],
     "rows.jsonl:1: fields 'chosen' and 'rejected' are the same text"),
    ([{"prompt": "q", "response": "a", "label": 0}, {"prompt": "q", "chosen": "a", "rejected": "b"}],
     "rows.jsonl:2: a pairs row in a file of labelled rows"),
])
def test_bad_rows_are_refused_naming_file_line_and_field_and_nothing_is_written(tmp_path, capsys, rows, expected):
    data = write_rows(tmp_path / "rows.jsonl", rows)
    assert main(["--data", data, "--model", "tiny-random", "--out", str(tmp_path / "rm")]) == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "rm").exists()


def test_a_line_separator_inside_a_string_is_text_and_bytes_that_are_not_utf8_are_named_by_line(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "one\u2028two", "response": "a", "label": 1}, ensure_ascii=False) + "\n",
                    encoding="utf-8")
    assert read_rows(str(rows)) == ("labelled", [{"prompt": "one\u2028two", "response": "a", "label": 1}])
    with rows.open("ab") as f:
        f.write(b'{"prompt": "q\xff", "response": "a", "label": 0}\n')
    assert main(["--data", str(rows), "--model", "tiny-random", "--out", str(tmp_path / "rm")]) == 2
    assert "rows.jsonl:2: not valid UTF-8 (byte 0xff at offset 13)" in capsys.readouterr().err
    assert not (tmp_path / "rm").exists()


@pytest.mark.parametrize("flags, expected", [
    (["--lr", "inf"], "lr: must be a finite number > 0, got inf"),
    (["--lr", "nan"], "lr: must be a finite number > 0, got nan"),
    (["--out", "{d}/notes"], "is a folder of other files (no fit.json)"),
])
def test_non_finite_settings_and_a_folder_a_fit_would_replace_are_refused(tmp_path, capsys, flags, expected):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep me")
    data = write_rows(tmp_path / "rows.jsonl", labelled(4))
    flags = [f.replace("{d}", str(tmp_path)) for f in flags]
    assert main(["--data", data, "--model", "tiny-random", "--out", str(tmp_path / "rm"), *flags]) == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "rm").exists() and (tmp_path / "notes" / "mine.txt").read_text() == "keep me"


def test_a_folder_written_atomically_is_whole_or_the_old_one_after_a_full_disk(tmp_path):
    import errno

    from nanorllm.utils.files import write_folder_atomic

    def full_disk(tmp: Path):
        (tmp / "config.json").write_text("{}")
        raise OSError(errno.ENOSPC, "No space left on device")

    out = tmp_path / "rm"
    with pytest.raises(OSError):
        write_folder_atomic(out, full_disk)
    assert list(tmp_path.iterdir()) == []  # neither a folder with config.json only nor its .tmp
    write_folder_atomic(out, lambda tmp: (tmp / "weights").write_text("old"))
    with pytest.raises(OSError):
        write_folder_atomic(out, full_disk)
    assert [p.name for p in tmp_path.iterdir()] == ["rm"] and (out / "weights").read_text() == "old"


@pytest.mark.slow
def test_a_fit_whose_weights_go_non_finite_saves_nothing(tmp_path, capsys):
    data = write_rows(tmp_path / "rows.jsonl", labelled(8))
    assert main(["--data", data, "--model", "tiny-random", "--out", str(tmp_path / "rm"), "--lr", "1e30",
                        "--batch-size", "2", "--eval-frac", "0", "--max-tokens", "32"]) == 1  # finite, far too large
    assert "weights non-finite (first: " in capsys.readouterr().err
    assert not list(tmp_path.glob("rm*"))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["labelled", "pairs"])
def test_a_fit_lowers_the_loss_and_saves_a_folder_that_loads_as_a_reward_model(tmp_path, capsys, kind):
    rows = labelled() if kind == "labelled" else [
        {"prompt": f"is {i} even?", "chosen": "yes it is", "rejected": "no"} for i in range(32)]
    data = write_rows(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "rm"
    assert main(["--data", data, "--model", "tiny-random", "--out", str(out), "--epochs", "8", "--lr", "1e-2",
                        "--batch-size", "8", "--eval-frac", "0.25", "--max-tokens", "64"]) == 0
    summary = json.loads((out / "fit.json").read_text())
    losses = summary["losses"]
    assert len(losses) == 8 * 3 and sum(losses[-3:]) < sum(losses[:3])  # 24 rows to fit, 8 a step
    assert summary["held_out_rows"] == 8 and summary["held_out_accuracy"] >= 0.75
    assert "held-out" in capsys.readouterr().out
    assert reward_model_problems(str(out)) == []
    scores = RewardModel(path=str(out))(episodes([("is 3 even?", "yes"), ("is 3 even?", "no")]), "math")
    assert scores[0] > scores[1]  # what it learnt is what it serves


@pytest.mark.slow
def test_sampling_labels_the_policys_responses_by_the_grader_on_the_training_tasks(tmp_path):
    out = tmp_path / "data.jsonl"
    assert main(["--sample-from", "tiny-random", "--out", str(out), "--limit", "3", "--samples-per-task", "2",
                        "--max-new-tokens", "4"]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 6 and all(r["label"] in (0, 1) and isinstance(r["response"], str) for r in rows)
    from nanorllm.envs.base import EpisodeSettings
    from nanorllm.envs.registry import load_env

    env = load_env("math", EpisodeSettings())
    held = {t["question"] for t in env.load_tasks(env.default_eval_tasks)}
    assert not {r["prompt"] for r in rows} & held
    assert main(["--sample-from", "tiny-random", "--out", str(tmp_path / "again.jsonl"), "--limit", "3",
                        "--samples-per-task", "2", "--max-new-tokens", "4"]) == 0
    assert (tmp_path / "again.jsonl").read_text() == out.read_text()  # a fixed seed: the same rows


def test_labelled_rows_become_pairs_of_the_same_prompt_capped_and_without_repeats(tmp_path, capsys):
    rows = [{"prompt": "a?", "response": r, "label": l} for r, l in [("1", 1), ("2", 0), ("1", 1), ("3", 0), ("4", 1)]]
    rows += [{"prompt": "b?", "response": "x", "label": 0}, {"prompt": [{"role": "user", "content": "c?"}],
                                                            "response": "y", "label": 1}]
    rows += [{"prompt": [{"role": "user", "content": "c?"}], "response": "z", "label": 0}]
    assert pairs_from_labelled(rows, per_prompt=3) == [  # b? has no response labelled 1: no pair
        {"prompt": "a?", "chosen": "1", "rejected": "2"}, {"prompt": "a?", "chosen": "1", "rejected": "3"},
        {"prompt": "a?", "chosen": "4", "rejected": "2"},
        {"prompt": [{"role": "user", "content": "c?"}], "chosen": "y", "rejected": "z"}]
    out = tmp_path / "pairs.jsonl"
    assert main(["--data", write_rows(tmp_path / "rows.jsonl", rows), "--to-pairs", "--out", str(out),
                        "--pairs-per-prompt", "1"]) == 0
    assert [json.loads(x)["chosen"] for x in out.read_text().splitlines()] == ["1", "y"]
    assert "[pairs] 2 pairs from 2 prompts (8 labelled rows)" in capsys.readouterr().out
    one_label = write_rows(tmp_path / "one.jsonl", rows[5:6])
    assert main(["--data", one_label, "--to-pairs", "--out", str(tmp_path / "none.jsonl")]) == 2
    assert "no prompt has both" in capsys.readouterr().err and not (tmp_path / "none.jsonl").exists()


def test_score_without_a_reward_model_folder_or_with_to_pairs_is_refused(tmp_path, capsys):
    data = write_rows(tmp_path / "rows.jsonl", labelled(4))
    assert main(["--score", str(tmp_path / "nothing"), "--data", data]) == 2
    assert "error: score: " in capsys.readouterr().err
    assert main(["--score", str(tmp_path), "--to-pairs", "--data", data, "--out", "x"]) == 2
    assert "one of them" in capsys.readouterr().err


@pytest.mark.slow
def test_score_gives_the_accuracy_a_fit_reports_on_the_same_rows(tmp_path, capsys):
    rows = labelled()
    data, out = write_rows(tmp_path / "rows.jsonl", rows), tmp_path / "rm"
    assert main(["--data", data, "--model", "tiny-random", "--out", str(out), "--epochs", "2", "--lr", "1e-2",
                        "--eval-frac", "0.25", "--max-tokens", "64", "--seed", "3"]) == 0
    random.Random(3).shuffle(rows)  # the fit's held-out split: the first quarter after its seeded shuffle
    held = write_rows(tmp_path / "held.jsonl", rows[:8])
    capsys.readouterr()
    assert main(["--score", str(out), "--data", held, "--max-tokens", "64"]) == 0
    got = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (got["kind"], got["rows"]) == ("labelled", 8)
    assert got["accuracy"] == json.loads((out / "fit.json").read_text())["held_out_accuracy"]


def test_bad_numbers_are_refused_together_each_naming_its_flag_and_bound(tmp_path, capsys):
    data = write_rows(tmp_path / "rows.jsonl", labelled(4))
    assert main(["--data", data, "--out", str(tmp_path / "rm"), "--epochs", "0", "--lr", "0", "--limit", "-1"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: epochs: must be >= 1, got 0", "error: limit: must be >= 1, got -1", "error: lr: must be > 0, got 0.0"]
    assert not (tmp_path / "rm").exists()


def test_the_training_groups_flags_reach_the_fit_and_its_own_defaults_are_values(tmp_path, monkeypatch):
    """The program's config is the training groups' composition: --max-steps caps the steps --epochs make, AdamW takes
    --lr and --weight-decay, the clip --max-grad-norm, --threads this process's threads, --dtype bf16 computes under
    autocast; unset, the program's own defaults (lr 1e-5, weight decay 0.01) apply."""
    import torch

    seen, norms, casts = [], [], []
    adamw, clip, autocast = torch.optim.AdamW, torch.nn.utils.clip_grad_norm_, torch.autocast
    monkeypatch.setattr(torch.optim, "AdamW", lambda params, **kw: seen.append(kw) or adamw(params, **kw))
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda p, n: norms.append(n) or clip(p, n))
    monkeypatch.setattr(torch, "autocast", lambda device_type, dtype: casts.append((device_type, dtype)) or
                        autocast(device_type, dtype=dtype))
    data = write_rows(tmp_path / "rows.jsonl", labelled(40))
    assert main(["--data", data, "--model", "tiny-random", "--out", str(tmp_path / "a"), "--epochs", "5",
                 "--max-steps", "3", "--lr", "1e-3", "--weight-decay", "0.5", "--max-grad-norm", "0.25",
                 "--threads", "1", "--dtype", "bf16", "--devices", "cpu"]) == 0
    assert len(json.loads((tmp_path / "a" / "fit.json").read_text())["losses"]) == 3  # 5 epochs of 5 steps, capped
    assert seen == [{"lr": 1e-3, "weight_decay": 0.5}] and norms == [0.25] * 3 and torch.get_num_threads() == 1
    assert casts == [("cpu", torch.bfloat16)] * 3
    assert main(["--data", data, "--model", "tiny-random", "--out", str(tmp_path / "b"), "--batch-size", "40"]) == 0
    assert seen[1] == {"lr": 1e-5, "weight_decay": 0.01} and norms[3:] == [1.0] and casts[3:] == []


@pytest.fixture(autouse=True)
def _run_folders_in_tmp(tmp_path, monkeypatch):
    """A fit's run folder goes to --output-dir (runs/ by default): here, the test's own folder."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _threads_restored():
    """A fit sets this process's torch threads (--threads); the test worker's own count comes back after."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_sampled_labels_take_the_episode_shape_flags_and_more_than_one_turn_is_refused(tmp_path, monkeypatch, capsys):
    """--sample-from plays the math env with --system-prompt, --worked-example, --grader-timeout-s and
    --max-new-tokens as training would; a row is the question and one response, so --max-turns 2 is refused."""
    from nanorllm.envs import registry
    from nanorllm.rollout import engine

    settings, sampling = [], []
    load_env, engine_class = registry.load_env, engine.RolloutEngine
    monkeypatch.setattr(registry, "load_env", lambda name, s: settings.append(s) or load_env(name, s))
    monkeypatch.setattr(engine, "RolloutEngine", lambda policy, **kw: sampling.append(kw["sampling"]) or
                        engine_class(policy, **kw))
    out = tmp_path / "data.jsonl"
    assert main(["--sample-from", "tiny-random", "--out", str(out), "--limit", "2", "--samples-per-task", "2",
                 "--max-new-tokens", "3", "--system-prompt", "Be brief.", "--no-worked-example",
                 "--grader-timeout-s", "2.5"]) == 0
    (s,) = settings
    assert (s.max_turns, s.system_prompt, s.worked_example, s.grader_timeout_s) == (1, "Be brief.", False, 2.5)
    assert [(p.max_new_tokens, p.temperature) for p in sampling] == [(3, 1.0)]
    assert len(out.read_text().splitlines()) == 4
    assert main(["--sample-from", "tiny-random", "--out", str(tmp_path / "two.jsonl"), "--max-turns", "2"]) == 2
    assert "max_turns: --sample-from labels one-turn episodes" in capsys.readouterr().err
    assert not (tmp_path / "two.jsonl").exists()


def fit_weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["labelled", "pairs"])
def test_token_sized_passes_give_the_fit_one_pass_a_step_gives(tmp_path, monkeypatch, kind):
    """--micro-batch-tokens cuts a step's rows into passes (a pair's two rows in one); the step's gradient is the
    batch's mean loss's all the same, so the losses and the saved weights match the one-pass fit."""
    from nanorllm.supervised import fit as fit_module

    rows = labelled(24) if kind == "labelled" else [
        {"prompt": f"is {i} even?", "chosen": "yes it is" * (1 + i % 3), "rejected": "no"} for i in range(24)]
    data = write_rows(tmp_path / "rows.jsonl", rows)
    widths, pass_loss = [], fit_module.pass_loss_and_hits
    monkeypatch.setattr(fit_module, "pass_loss_and_hits",
                        lambda model, k, r, labels: widths.append(len(r)) or pass_loss(model, k, r, labels))
    runs = {}
    for budget in ("4096", "64"):
        widths.clear()
        out = tmp_path / f"rm{budget}"
        assert main(["--data", data, "--model", "tiny-random", "--out", str(out), "--epochs", "2", "--lr", "1e-3",
                     "--batch-size", "8", "--eval-frac", "0", "--micro-batch-tokens", budget]) == 0
        runs[budget] = json.loads((out / "fit.json").read_text())["losses"], fit_weights(out), list(widths)
    (one_loss, one_w, one_passes), (cut_loss, cut_w, cut_passes) = runs["4096"], runs["64"]
    assert one_passes == [8] * 6 and len(cut_passes) > 6 and sum(cut_passes) == 48  # every row once a step
    assert cut_loss == pytest.approx(one_loss, abs=1e-5) and abs(one_loss[-1] - one_loss[0]) > 1e-3
    # AdamW divides by sqrt(v): a gradient entry near 0 whose float sum order differs can move its weight by up to
    # lr a step (1e-3 here); measured: <= 1.4e-5 at lr 1e-2 labelled, 1e-4 for pairs
    for name, w in one_w.items():
        assert (cut_w[name] - w).abs().max() < 1e-4, name


@pytest.mark.slow
def test_a_fit_stopped_mid_run_resumes_from_its_checkpoint_to_the_uninterrupted_fit(tmp_path, monkeypatch, capsys):
    """A crash after step 3 (with --save-every 2): --resume continues from step 2 on the rows step 3 had, with
    AdamW's state, and ends with the losses and weights of the fit never stopped; the sinks hold each step once."""
    from nanorllm.supervised import fit as fit_module

    data = write_rows(tmp_path / "rows.jsonl", labelled(40))
    flags = ["--data", data, "--model", "tiny-random", "--epochs", "2", "--lr", "1e-2", "--batch-size", "8",
             "--eval-frac", "0.2", "--save-every", "2", "--eval-every", "3", "--report-to", "jsonl"]
    assert main(flags + ["--out", str(tmp_path / "whole"), "--run-name", "whole"]) == 0
    step, calls = fit_module.train_step, []

    def crash_at_fourth(*args):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt("stopped")
        return step(*args)

    monkeypatch.setattr(fit_module, "train_step", crash_at_fourth)
    with pytest.raises(KeyboardInterrupt):
        main(flags + ["--out", str(tmp_path / "resumed"), "--run-name", "cut"])
    assert not (tmp_path / "resumed").exists()
    assert [p.name for p in (tmp_path / "runs" / "cut" / "checkpoints").iterdir()] == ["step_2"]
    monkeypatch.setattr(fit_module, "train_step", step)
    assert main(flags + ["--out", str(tmp_path / "resumed"), "--resume", str(tmp_path / "runs" / "cut")]) == 0
    assert "[resume] from" in capsys.readouterr().out
    whole, resumed = (json.loads((tmp_path / n / "fit.json").read_text()) for n in ("whole", "resumed"))
    assert len(whole["losses"]) == 8 and resumed["losses"] == pytest.approx(whole["losses"], abs=1e-6)
    assert resumed["held_out_accuracy"] == whole["held_out_accuracy"]
    for name, w in fit_weights(tmp_path / "whole").items():
        assert (fit_weights(tmp_path / "resumed")[name] - w).abs().max() < 1e-6, name
    metrics = [json.loads(line) for line in (tmp_path / "runs" / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "fit/loss" in m] == list(range(1, 9))
    assert [m["step"] for m in metrics if "fit/held_out_accuracy" in m] == [0, 3, 6, 8]
    assert sorted(p.name for p in (tmp_path / "runs" / "cut" / "checkpoints").iterdir()) == [
        "step_4", "step_6", "step_8"]  # --keep-checkpoints 3


def test_resuming_a_folder_without_a_checkpoint_is_refused_before_anything_loads(tmp_path, capsys):
    data = write_rows(tmp_path / "rows.jsonl", labelled(8))
    (tmp_path / "empty").mkdir()
    assert main(["--data", data, "--out", str(tmp_path / "rm"), "--resume", str(tmp_path / "empty")]) == 2
    assert f"resume: '{tmp_path / 'empty'}' holds no checkpoint of a fit" in capsys.readouterr().err
    assert main(["--data", data, "--out", str(tmp_path / "p.jsonl"), "--to-pairs", "--resume", "x"]) == 2
    assert "resume: continues a fit" in capsys.readouterr().err
    assert not (tmp_path / "rm").exists() and not (tmp_path / "runs").exists()
