"""The GRPO variants users pick by name (rloo, reinforce++, Dr. GRPO, GSPO, entropy, lr schedule, several
updates a batch, DAPO overlong shaping): each on a batch small enough to work out by hand, the values
written here, not recomputed by the code under test; then the contradictory combinations the config
refuses, and real tiny-random runs with the flags on."""

import json
import signal

import pytest
import torch

from nanorllm.algos.advantages import compute_advantage, overlong_penalty
from nanorllm.algos.groups import group_by_task_id
from nanorllm.config import ConfigError, TrainConfig, parse_config
from nanorllm.core.types import RolloutResult, Step, StepSample, Trajectory
from nanorllm.run.lifecycle import main
from nanorllm.trainer import loss as loss_module
from nanorllm.trainer import update as update_module
from nanorllm.trainer.loss import compute_policy_loss
from nanorllm.trainer.schedule import lr_at
from nanorllm.trainer.step import mini_batches, train_step
from nanorllm.trainer.step_metrics import merge_updates
from tests.helpers import loss_settings
from tests.procs import read_scalars
from tests.test_loss import make_case
from tests.test_run import BASE, length_rule_grader, weights  # noqa: F401 (a fixture)
from tests.test_train_step import build_results, config, snapshot


def episode(task_id, k, reward, *, lengths=(1,), step_rewards=None):
    samples = [StepSample(task_id=task_id, episode_id=f"{task_id}#{k}", turn=t, prompt_ids=[5] * (t + 1),
                          response_ids=[6] * n, rollout_logprobs=[-1.0] * n) for t, n in enumerate(lengths)]
    steps = [Step(observation="q", reward=r) for r in step_rewards] if step_rewards else []
    return RolloutResult(trajectory=Trajectory(task_id=task_id, final_reward=reward, steps=steps),
                         step_samples=samples)


def advantages(results):
    return [r.step_samples[0].advantage for r in results]


# ---- advantage estimators ---------------------------------------------------------------------

def test_rloo_baseline_is_the_mean_of_the_other_episodes():
    a = [episode("a", k, r) for k, r in enumerate([1.0, 0.0, 0.0, 1.0])]
    b = [episode("b", k, r) for k, r in enumerate([1.0, 0.0, 0.0, 0.0])]
    c = [episode("c", k, r) for k, r in enumerate([1.0, 1.0])]
    compute_advantage(group_by_task_id(a + b + c), estimator="rloo")
    # a: 1 - (0+0+1)/3, 0 - (1+0+1)/3;  b: 1 - 0, 0 - 1/3;  c constant: 0
    assert advantages(a) == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert advantages(b) == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    assert advantages(c) == [0.0, 0.0]


def test_reinforce_plus_plus_whitens_over_the_steps_tokens_as_openrlhf_does():
    """Rewards [1, 0], 10 and 30 response tokens: a = [0.5, -0.5]; over the 40 tokens m = -0.25 and the population
    variance is 0.1875, so A = [0.75, -0.25] / 0.4330127 (openrlhf/trainer/ppo_utils/experience_maker.py,
    reinforce_baseline: var = sum / num_actions). The episode-level form gave [1, -1]."""
    a = [episode("a", k, r, lengths=(n,)) for k, (r, n) in enumerate([(1.0, 10), (0.0, 30)])]
    compute_advantage(group_by_task_id(a), estimator="reinforce++", eps=0.0)
    assert advantages(a) == pytest.approx([1.7320508, -0.5773503], rel=1e-6)


def test_reinforce_plus_plus_with_unbiased_std_gives_verls_numbers():
    """The same episodes with --adv-std unbiased: variance 0.1875 x 40/39 (verl/utils/torch_functional.py masked_var,
    unbiased=True, as masked_whiten uses it in verl/trainer/ppo/core_algos.py
    compute_reinforce_plus_plus_baseline_outcome_advantage)."""
    a = [episode("a", k, r, lengths=(n,)) for k, (r, n) in enumerate([(1.0, 10), (0.0, 30)])]
    compute_advantage(group_by_task_id(a), estimator="reinforce++", eps=0.0, std="unbiased")
    assert advantages(a) == pytest.approx([1.7102631, -0.5700877], rel=1e-6)


def test_reinforce_plus_plus_counts_a_constant_groups_tokens_and_every_turns_tokens():
    """A constant group's 40 tokens count as zeros in the step's statistics (as in both references): m = -10 / 80 =
    -0.125, variance 10 / 80 - 0.125^2 = 0.109375, so group a gets [0.625, -0.375] / 0.3307189; the constant group
    itself keeps 0 (the references give it 0.125 / 0.3307189, and it is dropped). An episode of two turns of 5 and 5
    tokens counts 10."""
    a = [episode("a", 0, 1.0, lengths=(5, 5)), episode("a", 1, 0.0, lengths=(30,))]
    c = [episode("c", k, 1.0, lengths=(20,)) for k in range(2)]
    compute_advantage(group_by_task_id(a + c), estimator="reinforce++", eps=0.0)
    assert [s.advantage for s in a[0].step_samples] == pytest.approx([1.8898224, 1.8898224], rel=1e-6)
    assert advantages(a) == pytest.approx([1.8898224, -1.1338934], rel=1e-6)
    assert advantages(c) == [0.0, 0.0]
    compute_advantage(group_by_task_id(a + c), estimator="reinforce++", eps=0.0, std="unbiased")  # / 79
    assert advantages(a) == pytest.approx([1.8779738, -1.1267843], rel=1e-6)


def test_reinforce_plus_plus_on_two_ranks_uses_the_summed_token_statistics():
    """Rank 0 holds group a, rank 1 the constant group c: each whitens with the step's token sums, as one rank would."""
    a = [episode("a", k, r, lengths=(n,)) for k, (r, n) in enumerate([(1.0, 10), (0.0, 30)])]
    c = [episode("c", k, 1.0, lengths=(20,)) for k in range(2)]
    other = {"a": {"n": 40.0, "sum": 0.0, "sq": 0.0}, "c": {"n": 40.0, "sum": -10.0, "sq": 10.0}}  # the other rank's
    for share, name in ((a, "a"), (c, "c")):
        compute_advantage(group_by_task_id(share), estimator="reinforce++", eps=0.0,
                          batch_stats=lambda s, o=other[name]: {k: s[k] + o[k] for k in s})
    assert advantages(a) == pytest.approx([1.8898224, -1.1338934], rel=1e-6)
    assert advantages(c) == [0.0, 0.0]


def test_grpo_with_unbiased_std_gives_verls_and_trls_numbers():
    """[1, 0, 0, 0]: the population std is 0.4330127, the unbiased one (torch.std: verl compute_grpo_outcome_advantage,
    TRL GRPOTrainer) sqrt(0.75 / 3) = 0.5, so the advantages are x0.866 those of the default."""
    a = [episode("a", k, r) for k, r in enumerate([1.0, 0.0, 0.0, 0.0])]
    compute_advantage(group_by_task_id(a), eps=0.0, std="unbiased")
    assert advantages(a) == pytest.approx([1.5, -0.5, -0.5, -0.5])
    compute_advantage(group_by_task_id(a), eps=0.0)
    assert advantages(a) == pytest.approx([1.7320508, -0.5773503, -0.5773503, -0.5773503], rel=1e-6)
    assert parse_config(["--adv-std", "unbiased"]).adv_std == "unbiased"
    with pytest.raises(ConfigError, match="adv_std: must be 'population' or 'unbiased', got 'sample'"):
        parse_config(["--adv-std", "sample"])


def test_rloo_with_turn_credit_compares_turns_of_one_index():
    # returns with gamma 0.5: e0 (wrong, right): 0.5, 1; e1 (right): 1; e2 (wrong, wrong): 0, 0
    eps = [episode("a", 0, 1.0, lengths=(1, 1), step_rewards=[0.0, 1.0]),
           episode("a", 1, 1.0, lengths=(1,), step_rewards=[1.0]),
           episode("a", 2, 0.0, lengths=(1, 1), step_rewards=[0.0, 0.0])]
    compute_advantage(group_by_task_id(eps), estimator="rloo", turn_credit="turn", turn_gamma=0.5)
    # first turns 0.5, 1, 0: 0.5 - 0.5, 1 - 0.25, 0 - 0.75; second turns 1, 0: 1 - 0, 0 - 1
    assert [s.advantage for s in eps[0].step_samples] == pytest.approx([0.0, 1.0])
    assert [s.advantage for s in eps[1].step_samples] == pytest.approx([0.75])
    assert [s.advantage for s in eps[2].step_samples] == pytest.approx([-0.75, -1.0])


def test_dapo_overlong_penalty_is_linear_over_the_buffer_and_shapes_the_advantage():
    kw = {"max_new_tokens": 8, "buffer": 4, "penalty": 1.0}
    assert overlong_penalty(episode("a", 0, 1.0, lengths=(4,)), **kw) == 0.0
    assert overlong_penalty(episode("a", 0, 1.0, lengths=(6,)), **kw) == -0.5
    assert overlong_penalty(episode("a", 0, 1.0, lengths=(8,)), **kw) == -1.0
    assert overlong_penalty(episode("a", 0, 1.0, lengths=(6, 7)), **kw) == -1.25  # summed over turns
    eps = [episode("a", k, r, lengths=(n,)) for k, (r, n) in enumerate([(1.0, 8), (1.0, 2), (0.0, 6), (0.0, 2)])]
    compute_advantage(group_by_task_id(eps), normalize_std=False,
                      reward_of=lambda r: r.reward + overlong_penalty(r, **kw))
    # shaped rewards 0, 1, -0.5, 0: mean 0.125
    assert advantages(eps) == pytest.approx([-0.125, 0.875, -0.625, -0.125])


# ---- aggregation, ratio level, entropy ------------------------------------------------------------

def test_dr_grpo_aggregation_divides_token_sums_by_a_constant():
    # sample 0: three tokens, A = 1; sample 1: one token, A = -2; ratio 1, so each token's term is -A
    logits, batch = make_case([-0.5, -1.0, -1.5, -0.7], [1.0] * 4, [1.0, 1.0, 1.0, -2.0], sample_index=[0, 0, 0, 1])
    batch["num_samples"] = 2
    drgrpo, _ = compute_policy_loss(logits, batch, loss_settings(loss_agg="seq-mean-token-sum-norm", max_new_tokens=4))
    token_mean, _ = compute_policy_loss(logits, batch, loss_settings(loss_agg="token-mean"))
    seq_mean, _ = compute_policy_loss(logits, batch, loss_settings(loss_agg="seq-mean"))
    assert drgrpo.item() == pytest.approx((-3.0 + 2.0) / (2 * 4))  # -0.125
    assert token_mean.item() == pytest.approx((-3.0 + 2.0) / 4)  # -0.25
    assert seq_mean.item() == pytest.approx((-1.0 + 2.0) / 2)  # 0.5
    first, _ = compute_policy_loss(logits[:3], {k: v[:3] for k, v in batch.items() if k != "num_samples"}
                                   | {"normalizer": 8}, loss_settings(loss_agg="seq-mean-token-sum-norm"))
    assert first.item() == pytest.approx(-3.0 / 8)  # a micro-batch with the step's normaliser: its share


def test_gspo_ratio_is_the_responses_geometric_mean_clipped_per_response():
    # sample 0 ratios 1.21, 1.0 -> s = 1.1 > 1 + 4e-4, A = 1: clipped, no gradient
    # sample 1 ratios 0.81, 1.0 -> s = 0.9, A = 1: not clipped (A > 0 clips only above)
    # sample 2 ratio 1.0 -> s = 1, A = -1
    new_lp = [-0.5, -1.0, -0.8, -1.2, -0.3]
    logits, batch = make_case(new_lp, [1.21, 1.0, 0.81, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0, -1.0],
                              sample_index=[0, 0, 1, 1, 2])
    batch["num_samples"] = 3
    settings = loss_settings(loss_agg="seq-mean", ratio_level="sequence")  # clip 3e-4, 4e-4
    loss, m = compute_policy_loss(logits, batch, settings)
    assert loss.item() == pytest.approx((-1.0004 - 0.9 + 1.0) / 3, rel=1e-5)  # -0.3001333
    assert m["clip_high"].item() == 2.0 and m["clip_low"].item() == 0.0  # both tokens of sample 0
    loss.backward()
    g = logits.grad
    assert torch.count_nonzero(g[0]) == 0 and torch.count_nonzero(g[1]) == 0
    probs = torch.softmax(logits.detach(), -1)
    for i in (2, 3):  # d/dlogits of (1/3)(1/2)(-A s_t) = -(0.9 / 6)(onehot - p)
        onehot = torch.nn.functional.one_hot(batch["targets"][i], 5).float()
        torch.testing.assert_close(g[i], -(0.9 / 6) * (onehot - probs[i]), rtol=1e-4, atol=1e-7)
    token_level, _ = compute_policy_loss(logits, batch, loss_settings(loss_agg="seq-mean"))
    assert token_level.item() == pytest.approx((-1.105 - 0.905 + 1.0) / 3, rel=1e-5)  # per token: not the same


def test_entropy_term_lowers_the_loss_by_coef_times_the_mean_entropy():
    # one token, logprob -0.5 of 5: p = 0.6065307, the other four 0.0983673: H = 1.2157390
    logits, batch = make_case([-0.5], [1.0], [0.0])
    loss, m = compute_policy_loss(logits, batch, loss_settings(entropy_coef=0.1))
    assert loss.item() == pytest.approx(-0.12157390, rel=1e-5)
    assert m["entropy"].item() == pytest.approx(1.2157390, rel=1e-5)
    loss.backward()
    assert logits.grad.abs().max() > 1e-3  # the entropy's gradient, from the same logits


# ---- schedule, mini-batches ---------------------------------------------------------------------

def test_lr_schedules_by_step():
    kw = {"lr": 1.0, "warmup_steps": 2, "max_steps": 6}
    assert [lr_at(s, schedule="cosine", **kw) for s in range(6)] == pytest.approx(
        [1 / 3, 2 / 3, 1.0, 0.8535534, 0.5, 0.1464466], rel=1e-6)
    assert [lr_at(s, schedule="linear", **kw) for s in range(6)] == pytest.approx([1 / 3, 2 / 3, 1.0, 0.75, 0.5, 0.25])
    assert [lr_at(s, schedule="constant", lr=2.0, warmup_steps=0, max_steps=6) for s in range(3)] == [2.0] * 3


def test_mini_batches_keep_groups_whole_and_split_them_by_stream_position():
    samples = [StepSample(task_id=t, episode_id=f"{t}#{k}", turn=0, prompt_ids=[1], response_ids=[2],
                          rollout_logprobs=[-1.0]) for t in "abcde" for k in range(2)]
    group_of = {s.episode_id: f"{s.task_id}@{10 + 'abcde'.index(s.task_id)}" for s in samples}  # positions 10..14
    parts = mini_batches(samples, 2, group_of)
    assert [[s.task_id for s in p] for p in parts] == [list("aaccee"), list("bbdd")]
    assert [[s.task_id for s in p] for p in mini_batches(samples, 3, group_of)] == [list("cc"), list("aadd"), list("bbee")]
    assert [len(p) for p in mini_batches(samples[:2], 2, group_of)] == [2, 0]  # one group, two steps: one is empty


def test_merging_updates_adds_sums_and_averages_the_loss():
    a = {"tokens": 3.0, "loss": 0.5, "is_weight_max": 1.5, "grad_norm": 2.0, "skipped_nan": 0.0, "zero_std": 1.0}
    b = {"tokens": 5.0, "loss": -0.1, "is_weight_max": 1.2, "grad_norm": 4.0, "skipped_nan": 0.0, "zero_std": 0.0}
    m = merge_updates([a, b])
    assert (m["tokens"], m["loss"], m["is_weight_max"], m["grad_norm"], m["zero_std"], m["optimizer_steps"]) == (
        8.0, pytest.approx(0.2), 1.5, 3.0, 1.0, 2.0)


# ---- several updates per batch, on the tiny model ------------------------------------------------

@pytest.mark.slow
def test_two_mini_batches_equal_two_steps_on_their_groups(tiny_policy_factory):
    """updates_per_batch 2 on groups g0, g1 = a step on g0, then a step on g1 (grpo advantages are per group,
    and each mini-batch is normalised by its own tokens)."""
    a, b = tiny_policy_factory(), tiny_policy_factory()
    results_a, results_b = build_results(a), build_results(b)
    for r in results_a + results_b:
        r.group_id = f"{r.task_id}@{int(r.task_id[1:])}"  # stream positions 0, 1: two mini-batches
    opt_a = torch.optim.SGD(a.model.parameters(), lr=1.0)
    opt_b = torch.optim.SGD(b.model.parameters(), lr=1.0)
    m = train_step(a, opt_a, results_a, config(updates_per_batch=2, max_grad_norm=1e6))
    assert m["train/optimizer_steps"] == 2
    for task in ("g0", "g1"):
        train_step(b, opt_b, [r for r in results_b if r.task_id == task], config(max_grad_norm=1e6))
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-4, atol=1e-6)


def test_epochs_with_a_correction_clip_around_the_batchs_first_policy(tiny_policy_factory, monkeypatch):
    """decoupled, 2 epochs: pi_prox is computed once, before the first step, and both epochs use it; the
    second epoch's logprobs have moved away from it."""
    policy = tiny_policy_factory()
    results = build_results(policy)
    seen, calls = [], []
    real_loss, real_prox = loss_module.compute_policy_loss, update_module.proximal_logprobs
    monkeypatch.setattr(loss_module, "compute_policy_loss", lambda logits, batch, settings: (
        seen.append((batch["prox_logprobs"].clone(), batch["targets"].clone(), logits.detach().clone())),
        real_loss(logits, batch, settings))[1])
    monkeypatch.setattr(update_module, "proximal_logprobs", lambda *a: calls.append(1) or real_prox(*a))
    cfg = config(epochs=2, off_policy_correction="decoupled", micro_batch_tokens=100_000)
    m = train_step(policy, torch.optim.SGD(policy.model.parameters(), lr=1.0), results, cfg)
    assert m["train/optimizer_steps"] == 2 and len(calls) == 1 and len(seen) == 2
    (prox1, targets, logits1), (prox2, _, logits2) = seen
    torch.testing.assert_close(prox1, prox2)
    lp1 = torch.log_softmax(logits1 / cfg.temperature, -1).gather(-1, targets[:, None])[:, 0]
    lp2 = torch.log_softmax(logits2 / cfg.temperature, -1).gather(-1, targets[:, None])[:, 0]
    torch.testing.assert_close(lp1, prox1, rtol=1e-4, atol=1e-5)  # epoch 1: the weights that made pi_prox
    assert (lp2 - prox2).abs().max() > 1e-3  # epoch 2: the ratio is no longer 1


# ---- bad input ------------------------------------------------------------------------------------

def test_contradictory_combinations_are_refused_together_with_their_reasons():
    with pytest.raises(ConfigError) as err:
        parse_config(["--adv-estimator", "reinforce++", "--turn-credit", "turn", "--ratio-level", "sequence",
                      "--off-policy-correction", "tis", "--updates-per-batch", "9", "--tasks-per-step", "8",
                      "--overlong-buffer", "40", "--epochs", "0", "--gspo-clip-high", "0", "--adv-estimator=ppo"])
    problems = err.value.problems
    fields = sorted(p.split(":")[0] for p in problems)
    assert fields == sorted(["adv_estimator", "ratio_level", "ratio_level", "updates_per_batch", "overlong_buffer",
                             "overlong_buffer", "epochs", "gspo_clip_high"]), problems
    text = "\n".join(problems)
    assert "adv_estimator: must be one of grpo, rloo, reinforce++, rae, got 'ppo'" in text
    assert "updates_per_batch: 9 mini-batches need at least as many groups, but tasks_per_step is 8" in text
    assert "off_policy_correction 'tis' weighs tokens by theirs on top" in text
    assert "needs loss_agg seq-mean" in text and "overlong_buffer: 40 is more than max_new_tokens (32)" in text
    with pytest.raises(ConfigError) as err:
        parse_config(["--adv-estimator", "reinforce++", "--turn-credit", "turn", "--warmup-steps", "24"])
    assert [p.split(":")[0] for p in err.value.problems] == ["adv_estimator", "warmup_steps"]
    assert "returns of first and later turns differ in scale" in err.value.problems[0]


def test_the_variants_pass_validation_as_the_learning_table_sets_them():
    for flags in (["--adv-estimator", "rloo"], ["--adv-estimator", "reinforce++"],
                  ["--no-adv-normalize-std", "--loss-agg", "seq-mean-token-sum-norm"],
                  ["--ratio-level", "sequence", "--loss-agg", "seq-mean"], ["--updates-per-batch", "2"],
                  ["--entropy-coef", "0.001"], ["--lr-schedule", "cosine", "--warmup-steps", "2"],
                  ["--adv-estimator", "rloo", "--turn-credit", "turn"], ["--overlong-buffer", "8"]):
        parse_config(flags)


def test_a_refused_combination_exits_2_and_writes_nothing(tmp_path, capsys):
    rc = main([*BASE, "--output-dir", str(tmp_path), "--run-name", "bad", "--ratio-level", "sequence",
               "--off-policy-correction", "mis"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "ratio_level: sequence (GSPO)" in err and "needs loss_agg seq-mean" in err
    assert not (tmp_path / "bad").exists()


# ---- real runs ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_run_with_the_variants_on_trains_and_logs_them(tmp_path, length_rule_grader):
    run = tmp_path / "v"
    assert main([*BASE, "--output-dir", str(tmp_path), "--run-name", "v", "--max-steps", "3",
                 "--adv-estimator", "rloo", "--no-adv-normalize-std", "--loss-agg", "seq-mean-token-sum-norm",
                 "--updates-per-batch", "2", "--epochs", "2", "--entropy-coef", "0.01", "--lr-schedule", "cosine",
                 "--warmup-steps", "1", "--overlong-buffer", "4"]) == 0
    s = read_scalars(run)
    assert [v for _, v in s["train/optimizer_steps"]] == [4, 4, 4]
    assert [v for _, v in s["lr"]] == pytest.approx([5e-4, 1e-3, 5e-4], rel=1e-5)  # warmup, then cosine over 2
    assert all(v <= 0 for _, v in s["train/overlong_penalty"])
    assert json.loads((run / "config.json").read_text())["adv_estimator"] == "rloo"


@pytest.mark.slow
def test_resume_continues_the_lr_schedule_and_the_updates_exactly(tmp_path, length_rule_grader):
    flags = ["--lr-schedule", "cosine", "--warmup-steps", "1", "--updates-per-batch", "2", "--max-steps", "4"]
    full = tmp_path / "full"
    assert main([*BASE, "--output-dir", str(tmp_path), "--run-name", "full", *flags]) == 0
    part = tmp_path / "part"
    assert main([*BASE, "--output-dir", str(tmp_path), "--run-name", "part", *flags[:-1], "2"]) == 0
    assert main(["--resume", str(part), "--max-steps", "4"]) == 0
    a, b = weights(full / "final_model"), weights(part / "final_model")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    lr_full, lr_part = read_scalars(full)["lr"], read_scalars(part)["lr"]
    assert [s for s, _ in lr_part] == [1, 2, 3, 4]
    assert [v for _, v in lr_part] == pytest.approx([v for _, v in lr_full], rel=1e-6)
    assert [v for _, v in lr_full] == pytest.approx([5e-4, 1e-3, 7.5e-4, 2.5e-4], rel=1e-5)


@pytest.mark.slow
def test_two_ranks_give_the_one_rank_update_for_the_variants(tiny_policy):
    """N ranks == one big batch for Dr. GRPO's constant normaliser (over micro-batches), reinforce++'s step-wide
    std (summed over the ranks), GSPO and two mini-batches a batch (each group in the same mini-batch on either
    rank count); full forward (train mode), as in tests/test_ranks.py, within 1e-5. Two AdamW steps are held to
    1e-4: AdamW's g / sqrt(v) magnifies float summation order where a gradient is near zero (one process,
    micro-batches of 40 tokens vs one pass, moves the same two steps by 1.5e-4; plain SGD by 4e-9)."""
    from nanorllm.bench.learner_ranks import steps_on_ranks

    results = build_results(tiny_policy)
    for r in results:
        r.group_id = f"{r.task_id}@{int(r.task_id[1:])}"  # as the task stream names groups
    full = {"disable_dropout": False}
    cases = [(config(loss_agg="seq-mean-token-sum-norm", adv_normalize_std=False, micro_batch_tokens=40, **full),
              results, 1e-5),
             (config(adv_estimator="reinforce++", **full), results, 1e-5),
             (config(ratio_level="sequence", loss_agg="seq-mean", **full), results, 1e-5),
             (config(updates_per_batch=2, **full), results, 1e-4)]
    one, two = steps_on_ranks(1, [c[:2] for c in cases]), steps_on_ranks(2, [c[:2] for c in cases])
    start = steps_on_ranks(1, [(config(), [])])[0]["params"]  # nothing to train: the initial weights
    for a, b, (_, _, tol) in zip(one, two, cases):
        assert float((a["params"] - b["params"]).abs().max()) <= tol
        assert float((a["params"] - start).abs().max()) > 1e-3


# ---- DAPO dynamic sampling ------------------------------------------------------------------------

def test_fill_batch_is_refused_where_it_cannot_work():
    with pytest.raises(ConfigError) as err:
        parse_config(["--fill-batch", "--no-drop-zero-std-groups", "--fill-batch-cap", "0.5"])
    text = "\n".join(err.value.problems)
    assert "drop_zero_std_groups must be true" in text and "fill_batch_cap: must be >= 1, got 0.5" in text
    assert "fill_batch: with max_policy_lag 1 the pipeline has drawn later steps' tasks" in text
    assert "use --max-policy-lag 0 (or --serial)" in text
    parse_config(["--fill-batch", "--max-policy-lag", "0"])  # the pipeline without steps ahead: accepted


def test_overlong_shaping_with_fill_batch_drops_an_all_correct_group_instead_of_training_it():
    """DAPO keeps a group when 0 < correct < G. max_new_tokens 128, buffer 32: four correct answers of 50, 60, 70 and
    97 tokens are shaped to [1, 1, 1, 0.96875]; advantages from those would be [0.577, 0.577, 0.577, -1.732] (a
    correct answer punished like a wrong one). The group carries no signal for fill-batch, the update and the
    zero_std count alike: advantage 0, dropped. A mixed group beside it keeps its shaped advantage."""
    from nanorllm.algos.advantages import carries_signal, silent_groups
    from nanorllm.algos.groups import flatten_step_samples
    from nanorllm.trainer.source import mixed_groups

    kw = {"max_new_tokens": 128, "buffer": 32, "penalty": 1.0}
    solved = [episode("a", k, 1.0, lengths=(n,)) for k, n in enumerate([50, 60, 70, 97])]
    mixed = [episode("b", k, r, lengths=(n,)) for k, (r, n) in enumerate([(1.0, 50), (0.0, 97)])]
    assert [r.reward + overlong_penalty(r, **kw) for r in solved] == [1.0, 1.0, 1.0, 0.96875]
    groups = group_by_task_id(solved + mixed)
    silent = silent_groups(groups)
    assert silent == {"a"} and not carries_signal(solved) and carries_signal(mixed)
    assert mixed_groups(TrainConfig(), solved + mixed) == 1  # fill-batch: one group with signal, one to replace
    compute_advantage(groups, reward_of=lambda r: r.reward + overlong_penalty(r, **kw), silent=silent, eps=0.0)
    assert advantages(solved) == [0.0, 0.0, 0.0, 0.0]
    assert advantages(mixed) == [1.0, -1.0]  # shaped [1, -0.03125]: mean 0.484375, std 0.515625
    assert [s.episode_id for s in flatten_step_samples(groups, drop_zero_std=True, silent=silent)] == ["b#0", "b#1"]
    compute_advantage(groups, reward_of=lambda r: r.reward + overlong_penalty(r, **kw), eps=0.0)  # silent by default
    assert advantages(solved) == [0.0, 0.0, 0.0, 0.0]


def test_overlong_shaping_in_a_step_trains_only_the_groups_fill_batch_counts_mixed(tiny_policy_factory):
    """train_step with a buffer as long as the responses: g0's episodes, all correct, have 1 or 2 turns, so their
    shaped rewards differ; it still trains nothing and counts as a zero-std group, as fill-batch counts it."""
    from nanorllm.trainer.source import mixed_groups

    policy = tiny_policy_factory()
    results = build_results(policy, rewards={"g0": [1.0, 1.0, 1.0, 1.0], "g1": [1.0, 0.0, 0.0, 1.0]})
    cfg = config(max_new_tokens=8, overlong_buffer=8)
    assert len({r.reward + overlong_penalty(r, max_new_tokens=8, buffer=8, penalty=1.0)
                for r in results if r.task_id == "g0"}) > 1
    assert mixed_groups(cfg, results) == 1
    m = train_step(policy, torch.optim.SGD(policy.model.parameters(), lr=1e-2), results, cfg)
    assert m["frac_reward_zero_std"] == 0.5
    assert m["train/samples"] == sum(len(r.step_samples) for r in results if r.task_id == "g1") == 7


def test_an_env_error_does_not_make_an_all_correct_group_count_as_mixed_for_fill_batch():
    """[correct, correct, correct, env error]: the update trains the three correct ones, a constant group, so
    fill-batch must count it constant and draw a replacement (before, it counted it mixed: fill_rate 1.0)."""
    from nanorllm.trainer.source import FillRounds, fill_seed

    def ep(gid, reward, reason="correct"):
        return RolloutResult(trajectory=Trajectory(task_id=gid, final_reward=reward, termination_reason=reason),
                             step_samples=[], group_id=gid)

    class Stream:
        position = 0

        def take(self, n, avoid=frozenset()):
            self.position += n
            return [({"task_id": f"t{i}"}, f"t{i}@{i}") for i in range(self.position - n, self.position)]

    first = [ep("a", 1.0), ep("a", 1.0), ep("a", 1.0), ep("a", 0.0, "error"), ep("b", 1.0), ep("b", 0.0)]
    cfg = TrainConfig(tasks_per_step=2, fill_batch_cap=2.0)
    fill, drawn = FillRounds(cfg, Stream(), 5, first), []
    assert fill.mixed == 1
    for round_, picked, seed in fill.rounds():
        drawn.append((round_, [g for _, g in picked], seed))
        fill.add([ep(g, r) for _, g in picked for r in (1.0, 0.0)])
    assert drawn == [(1, ["t0@0"], fill_seed(cfg, 5, 1))]
    assert fill.metrics() == {"rollout/extra_groups": 1, "rollout/fill_rate": 1.0}


def _fill_run(tmp_path, name, *args):
    rc = main([*BASE[:-1], "--output-dir", str(tmp_path), "--run-name", name, "--fill-batch", *args])
    assert rc == 0
    return tmp_path / name


@pytest.mark.slow
def test_fill_batch_draws_extra_tasks_until_the_step_has_mixed_groups_and_resumes_exactly(
        tmp_path, length_rule_grader):
    from nanorllm.faultsuite.ledger import position, read_rollouts

    full = _fill_run(tmp_path, "full", "--max-steps", "3", "--rollout-dump-size", "1000")
    s = read_scalars(full)
    extra = [int(v) for _, v in s["rollout/extra_groups"]]
    assert all(v == 1.0 for _, v in s["rollout/fill_rate"])  # about half the groups are mixed: 3 x 4 is plenty
    assert sum(extra) > 0  # some step did need more tasks
    groups = sorted({r["group_id"] for r in read_rollouts(full)}, key=position)
    assert [position(g) for g in groups] == list(range(3 * 4 + sum(extra)))  # every drawn task once, in order
    state = json.loads((full / "checkpoints" / "step_3" / "trainer_state.json").read_text())
    assert state["stream_position"] == 3 * 4 + sum(extra)
    assert [int(v) for _, v in s["train/samples"]] and all(v > 0 for _, v in s["train/samples"])
    part = _fill_run(tmp_path, "part", "--max-steps", "1", "--rollout-dump-size", "1000")
    assert main(["--resume", str(part), "--max-steps", "3"]) == 0
    a, b = weights(full / "final_model"), weights(part / "final_model")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    assert sorted({r["group_id"] for r in read_rollouts(part)}, key=position) == groups


@pytest.mark.slow
def test_fill_batch_stops_at_its_cap_and_trains_on_what_it_has(tmp_path, monkeypatch):
    import nanorllm.envs.math_env as math_env
    from nanorllm.envs.grader import Verdict

    monkeypatch.setattr(math_env, "judge", lambda response, gold, **kw: Verdict(False, "x"))  # every group constant
    run = _fill_run(tmp_path, "cap", "--max-steps", "2", "--fill-batch-cap", "2.5")
    s = read_scalars(run)
    assert [int(v) for _, v in s["rollout/extra_groups"]] == [6, 6]  # 2.5 x 4 = 10 tasks drawn, 6 beyond the 4
    assert [v for _, v in s["rollout/fill_rate"]] == [0.0, 0.0]
    assert [int(v) for _, v in s["train/samples"]] == [0, 0]
    state = json.loads((run / "checkpoints" / "step_2" / "trainer_state.json").read_text())
    assert state["stream_position"] == 20


@pytest.mark.slow
def test_the_pipeline_trains_with_several_updates_a_correction_and_a_schedule(tmp_path, length_rule_grader):
    """Workers sample while the learner makes 2 x 2 optimizer steps a batch against the batch's first policy;
    the weights they get are published once a step (version = step), and the run finishes like any other."""
    from nanorllm.faultsuite.ledger import position, read_rollouts

    args = [a for a in BASE if a != "--serial"]
    assert main([*args, "--output-dir", str(tmp_path), "--run-name", "p", "--num-workers", "1", "--max-steps", "3",
                 "--updates-per-batch", "2", "--epochs", "2", "--off-policy-correction", "decoupled",
                 "--adv-estimator", "rloo", "--lr-schedule", "linear", "--rollout-dump-size", "1000"]) == 0
    s = read_scalars(tmp_path / "p")
    assert [int(v) for _, v in s["train/optimizer_steps"]] == [4, 4, 4]
    assert [v for _, v in s["lr"]] == pytest.approx([1e-3, 2e-3 / 3, 1e-3 / 3], rel=1e-5)
    assert all(v <= 1 for _, v in s["pipeline/policy_lag_max"])
    groups = {r["group_id"] for r in read_rollouts(tmp_path / "p")}
    assert sorted(position(g) for g in groups) == list(range(3 * 4))  # every group once


@pytest.mark.slow
def test_two_sharded_ranks_make_the_one_rank_steps_with_a_correction_over_two_mini_batches(tiny_policy):
    """FSDP (every forward a collective): tis over 2 mini-batches of one group, so rank 1 holds nothing and
    runs idle forwards for the batch's pi_prox and idle passes for both steps, as the other rank does."""
    from nanorllm.bench.learner_ranks import steps_on_ranks

    one_group = build_results(tiny_policy, rewards={"g0": [1.0, 0.0, 0.0, 1.0], "g1": [1.0, 0.0, 1.0, 0.0]},
                              two_turns={("g0", 1)})
    for r in one_group:
        r.group_id = f"{r.task_id}@{int(r.task_id[1:])}"
    cases = [(config(off_policy_correction="tis", updates_per_batch=2, micro_batch_tokens=40,
                     disable_dropout=False), [r for r in one_group if r.task_id == "g0"]),
             (config(off_policy_correction="tis", updates_per_batch=2, epochs=2, micro_batch_tokens=40,
                     disable_dropout=False), one_group)]
    one = steps_on_ranks(1, cases)
    two = steps_on_ranks(2, cases, parallel="fsdp")
    start = steps_on_ranks(1, [(config(), [])])[0]["params"]
    for a, b in zip(one, two):
        assert float((a["params"] - b["params"]).abs().max()) <= 1e-5
        assert float((a["params"] - start).abs().max()) > 1e-3


@pytest.mark.slow
def test_fill_batch_in_the_synchronous_pipeline_draws_what_serial_draws(tmp_path):
    """The tiny model never answers right: every group is constant, so each step draws its cap (3 x 4 tasks) in
    three rounds. Serial and the lag-0 pipeline (its extra rounds as extra jobs) sample the same episodes for the
    same 24 stream positions, each once, and count the same extra groups."""
    from nanorllm.faultsuite.ledger import position, read_rollouts
    from tests.procs import run_train

    common = ["--max-steps", "2", "--seed", "3", "--fill-batch", "--max-new-tokens", "6", "--rollout-dump-size", "1000"]
    rc1, out1, _ = run_train([*common, "--serial", "--run-name", "s"], tmp_path)
    rc2, out2, _ = run_train([*common, "--num-workers", "1", "--max-policy-lag", "0", "--run-name", "p"], tmp_path)
    assert rc1 == 0 and rc2 == 0, out1 + out2
    key = lambda r: r["group_id"] + str(r["turns"])  # noqa: E731
    serial, pipe = (sorted(read_rollouts(tmp_path / n), key=key) for n in ("s", "p"))
    assert [(r["group_id"], [t["response"] for t in r["turns"]]) for r in serial] == \
           [(r["group_id"], [t["response"] for t in r["turns"]]) for r in pipe]
    assert sorted({position(r["group_id"]) for r in pipe}) == list(range(24))
    assert len(pipe) == 24 * 2  # every group's two episodes, none twice
    for run in ("s", "p"):
        s = read_scalars(tmp_path / run)
        assert [int(v) for _, v in s["rollout/extra_groups"]] == [8, 8]
        assert [v for _, v in s["rollout/fill_rate"]] == [0.0, 0.0]


@pytest.mark.slow
def test_a_worker_killed_during_fill_batch_loses_and_doubles_no_group(tmp_path):
    """The fault suite's worker SIGKILL, with --fill-batch in the lag-0 pipeline (the tiny model's groups are all
    constant, so every step runs extra rounds): the run finishes, and every stream position any step drew, the
    extra ones too, was trained exactly once (its 2 episodes, no more)."""
    from collections import Counter

    from nanorllm.faultsuite import suite
    from nanorllm.faultsuite.ledger import position, read_rollouts

    o, = suite._signal_a_worker(tmp_path, "kill_fill", "worker SIGKILL, fill-batch", signal.SIGKILL,
                                "died (killed by SIGKILL)", ["--fill-batch", "--max-policy-lag", "0"])
    assert o.ok, f"{o.row()} {o.notes}\n{o.output[-4000:]}"
    state = json.loads((tmp_path / "kill_fill" / "checkpoints" / "step_40" / "trainer_state.json").read_text())
    per_position = Counter(position(r["group_id"]) for r in read_rollouts(tmp_path / "kill_fill"))
    assert state["stream_position"] > 40 * 4  # extra tasks were drawn
    assert sorted(per_position) == list(range(state["stream_position"]))
    assert set(per_position.values()) == {2}


def test_rloo_and_unnormalised_grpo_make_the_same_adamw_steps_while_the_norm_clip_binds_on_every_step(
        tiny_policy_factory):
    """For groups of one size n, rloo's advantage is n/(n-1) x that of grpo --no-adv-normalize-std: one direction,
    a constant scale, which a --max-grad-norm that binds on every step removes (pre-clip norms 0.47-0.84 against
    1e-3), so two steps of AdamW, the optimizer that trains and keeps every step's history, are the same. Not with
    an entropy term (it is not scaled), not with unequal group sizes (n/(n-1) differs by group), and not for
    reinforce++, whose token-weighted mean shifts every advantage when response lengths differ."""
    from nanorllm.trainer.update import make_optimizer

    def two_steps(*, drop=None, **kw):
        policy = tiny_policy_factory()
        before = snapshot(policy)
        results = [r for r in build_results(policy) if r.step_samples[0].episode_id != drop]
        cfg = config(max_grad_norm=1e-3, **kw)
        optimizer = make_optimizer(policy, cfg)
        assert isinstance(optimizer, torch.optim.AdamW)
        for _ in range(2):
            assert train_step(policy, optimizer, results, cfg)["grad_norm"] > 100 * cfg.max_grad_norm
        return [p.detach() - b for p, b in zip(policy.parameters(), before)]

    def gap(a, b):
        return max(float((x - y).abs().max()) for x, y in zip(a, b))

    rloo, grpo = two_steps(adv_estimator="rloo"), two_steps(adv_normalize_std=False)
    assert max(float(d.abs().max()) for d in rloo) == pytest.approx(0.02, rel=0.01)  # two AdamW steps of lr 1e-2
    assert gap(rloo, grpo) < 1e-5  # AdamW's g / sqrt(v) magnifies float summation order where g is near 0
    entropy = {"entropy_coef": 0.1}
    assert gap(two_steps(adv_estimator="rloo", **entropy), two_steps(adv_normalize_std=False, **entropy)) > 5e-3
    assert gap(two_steps(adv_estimator="rloo", drop="g1#3"), two_steps(adv_normalize_std=False, drop="g1#3")) > 5e-3
    assert gap(rloo, two_steps(adv_estimator="reinforce++")) > 5e-3
