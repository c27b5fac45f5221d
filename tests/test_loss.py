import math

import pytest
import torch

from nanorllm.core.types import StepSample
from nanorllm.trainer.collate import collate_train_batch
from nanorllm.trainer.loss import compute_policy_loss, token_logprobs
from tests.helpers import loss_settings

PAD = 99


def sample(episode_id, turn, prompt, response, *, advantage=0.0, logprobs=None):
    return StepSample(task_id=episode_id.split("#")[0], episode_id=episode_id, turn=turn, prompt_ids=prompt,
                      response_ids=response, rollout_logprobs=logprobs or [-0.1 * (i + 1) for i in range(len(response))],
                      advantage=advantage)


# ---- collate --------------------------------------------------------------------------------

def test_collate_merges_extending_turns_and_pads_right():
    samples = [
        sample("a#0", 0, [10, 11], [12, 13], advantage=0.5, logprobs=[-0.1, -0.2]),
        sample("a#0", 1, [10, 11, 12, 13, 14], [15], advantage=0.5, logprobs=[-0.3]),
        sample("a#1", 0, [20], [21, 22, 23], advantage=-1.0, logprobs=[-1.0, -2.0, -3.0]),
    ]
    b = collate_train_batch(samples, pad_id=PAD)
    assert b["input_ids"].tolist() == [[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, PAD, PAD]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]
    assert b["loss_mask"].tolist() == [[0, 0, 1, 1, 0, 1], [0, 1, 1, 1, 0, 0]]
    assert b["positions"].tolist() == [[0, 1], [0, 2], [0, 4], [1, 0], [1, 1], [1, 2]]
    assert b["targets"].tolist() == [12, 13, 15, 21, 22, 23]
    assert b["old_logprobs"].tolist() == pytest.approx([-0.1, -0.2, -0.3, -1.0, -2.0, -3.0])
    assert b["advantages"].tolist() == [0.5, 0.5, 0.5, -1.0, -1.0, -1.0]
    assert b["sample_index"].tolist() == [0, 0, 1, 2, 2, 2]
    assert b["num_samples"] == 3


def test_collate_carries_each_tokens_policy_version():
    samples = [sample("a#0", 0, [1, 2], [3, 4]), sample("a#0", 1, [1, 2, 3, 4, 5], [6]), sample("b#0", 0, [7], [8])]
    samples[0].policy_version = samples[1].policy_version = 5
    samples[2].policy_version = 3
    assert collate_train_batch(samples, pad_id=PAD)["policy_version"].tolist() == [5, 5, 5, 3]


def test_collate_targets_are_the_masked_tokens():
    samples = [sample("a#0", 0, [1, 2, 3], [4, 5]), sample("a#0", 1, [1, 2, 3, 4, 5, 6, 7], [8, 9, 10]),
               sample("b#0", 0, [11], [12])]
    b = collate_train_batch(samples, pad_id=PAD)
    pos = b["positions"]
    assert torch.equal(b["targets"], b["input_ids"][pos[:, 0], pos[:, 1] + 1])
    scored = torch.zeros_like(b["loss_mask"])
    scored[pos[:, 0], pos[:, 1] + 1] = 1
    assert torch.equal(scored, b["loss_mask"])
    assert int(b["loss_mask"].sum()) == 6 == len(b["targets"])


def test_collate_non_extending_prompt_starts_new_row():
    samples = [sample("a#0", 0, [30, 31], [32]), sample("a#0", 1, [30, 33, 34], [35])]
    b = collate_train_batch(samples, pad_id=PAD)
    assert b["input_ids"].tolist() == [[30, 31, 32, PAD], [30, 33, 34, 35]]
    assert b["loss_mask"].tolist() == [[0, 0, 1, 0], [0, 0, 0, 1]]
    assert b["positions"].tolist() == [[0, 1], [1, 2]]


def test_collate_does_not_merge_across_episodes():
    samples = [sample("a#0", 0, [1, 2], [3]), sample("a#1", 0, [1, 2, 3, 4], [5])]
    b = collate_train_batch(samples, pad_id=PAD)
    assert b["input_ids"].shape == (2, 5)
    assert b["positions"].tolist() == [[0, 1], [1, 3]]


def test_collate_rejects_empty_prompt():
    with pytest.raises(ValueError, match="empty prompt"):
        collate_train_batch([sample("a#0", 0, [], [1, 2])], pad_id=PAD)


# ---- loss -----------------------------------------------------------------------------------

def make_case(new_lp, ratios, advantages, sample_index=None, vocab=5):
    """Logits whose target logprobs are exactly `new_lp`, and old logprobs giving `ratios`."""
    n = len(new_lp)
    targets = torch.arange(n) % vocab
    logits = torch.full((n, vocab), 0.0)
    for i, lp in enumerate(new_lp):
        p = math.exp(lp)
        rest = math.log((1 - p) / (vocab - 1))
        logits[i] = rest
        logits[i, targets[i]] = lp
    new = torch.tensor(new_lp)
    batch = {
        "targets": targets,
        "old_logprobs": new - torch.log(torch.tensor(ratios)),
        "advantages": torch.tensor(advantages, dtype=torch.float32),
        "sample_index": torch.tensor(sample_index if sample_index is not None else list(range(n))),
    }
    return logits.requires_grad_(), batch


def test_make_case_logits_have_the_requested_logprobs():
    logits, batch = make_case([-0.5, -1.5, -2.0], [1.0, 1.0, 1.0], [0.0] * 3)
    lp, _ = token_logprobs(logits, batch["targets"])
    torch.testing.assert_close(lp, torch.tensor([-0.5, -1.5, -2.0]))


def test_ratio_one_gives_minus_mean_advantage():
    logits, batch = make_case([-0.5, -1.5, -2.0], [1.0, 1.0, 1.0], [1.0, -2.0, 0.5])
    loss, m = compute_policy_loss(logits, batch, loss_settings())
    assert loss.item() == pytest.approx(0.5 / 3, abs=1e-6)
    assert (m["tokens"], m["clip_low"], m["clip_high"]) == (3.0, 0.0, 0.0)
    assert m["approx_kl"] == pytest.approx(0.0, abs=1e-6)


def test_clipping_values_gradients_and_counts():
    # 0: A>0, ratio 1.5 -> clipped at 1.2   1: A<0, ratio 0.5 -> clipped at 0.8
    # 2: A>0, ratio 0.5 -> not clipped       3: A<0, ratio 1.5 -> not clipped
    ratios, adv = [1.5, 0.5, 0.5, 1.5], [2.0, -1.0, 1.0, -3.0]
    logits, batch = make_case([-1.0, -1.2, -0.7, -1.6], ratios, adv)
    loss, m = compute_policy_loss(logits, batch, loss_settings(clip_low=0.2, clip_high=0.2))
    per_token = [-2.0 * 1.2, 1.0 * 0.8, -1.0 * 0.5, 3.0 * 1.5]
    assert loss.item() == pytest.approx(sum(per_token) / 4, rel=1e-5)
    loss.backward()
    g = logits.grad
    assert torch.count_nonzero(g[0]) == 0 and torch.count_nonzero(g[1]) == 0
    probs = torch.softmax(logits.detach(), -1)
    for i in (2, 3):
        onehot = torch.nn.functional.one_hot(batch["targets"][i], 5).float()
        expected = -adv[i] * ratios[i] * (onehot - probs[i]) / 4
        torch.testing.assert_close(g[i], expected, rtol=1e-4, atol=1e-6)
        assert g[i].abs().max() > 1e-3
    assert (m["clip_high"], m["clip_low"]) == (1.0, 1.0)


def test_asymmetric_clip_bounds():
    logits, batch = make_case([-1.0, -1.0], [1.5, 0.5], [1.0, -1.0])
    loss, m = compute_policy_loss(logits, batch, loss_settings(clip_low=0.1, clip_high=0.3))
    assert loss.item() == pytest.approx((-1.3 + 0.9) / 2, rel=1e-5)
    assert (m["clip_high"], m["clip_low"]) == (1.0, 1.0)


def test_token_mean_vs_seq_mean():
    logits, batch = make_case([-1.0] * 4, [1.0] * 4, [1.0, 1.0, 1.0, 3.0], sample_index=[0, 0, 0, 1])
    token_mean, _ = compute_policy_loss(logits, batch, loss_settings(loss_agg="token-mean"))
    seq_mean, _ = compute_policy_loss(logits, batch, loss_settings(loss_agg="seq-mean"))
    assert token_mean.item() == pytest.approx((-1 - 1 - 1 - 3) / 4, rel=1e-6)
    assert seq_mean.item() == pytest.approx((-1 + -3) / 2, rel=1e-6)


def test_unknown_loss_agg_raises():
    logits, batch = make_case([-1.0], [1.0], [1.0])
    with pytest.raises(ValueError, match="loss_agg"):
        compute_policy_loss(logits, batch, loss_settings(loss_agg="sum"))


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean", "seq-mean-token-sum-norm"])
def test_normalizer_makes_micro_batches_add_up(loss_agg):
    new_lp = [-0.3, -1.1, -0.8, -2.0, -0.6, -1.4, -0.9]
    ratios = [1.1, 0.7, 1.4, 0.95, 1.3, 0.6, 1.0]
    adv = [0.5, 0.5, 0.5, -1.0, -1.0, 2.0, 2.0]
    index = [0, 0, 0, 1, 1, 2, 2]
    logits, batch = make_case(new_lp, ratios, adv, sample_index=index)
    full, _ = compute_policy_loss(logits, batch, loss_settings(loss_agg=loss_agg))
    full.backward()
    normalizer = {"token-mean": 7, "seq-mean": 3, "seq-mean-token-sum-norm": 3 * 1}[loss_agg]  # max_new_tokens 1
    total, grads = 0.0, []
    for lo, hi, first_sample in [(0, 5, 0), (5, 7, 2)]:
        part_logits = logits.detach()[lo:hi].clone().requires_grad_()
        part = {k: v[lo:hi] for k, v in batch.items()}
        part["sample_index"] = part["sample_index"] - first_sample
        loss, _ = compute_policy_loss(part_logits, part | {"normalizer": normalizer}, loss_settings(loss_agg=loss_agg))
        loss.backward()
        total += loss.item()
        grads.append(part_logits.grad)
    assert total == pytest.approx(full.item(), rel=1e-5)
    torch.testing.assert_close(torch.cat(grads), logits.grad, rtol=1e-5, atol=1e-7)
    part_alone, _ = compute_policy_loss(logits[5:7], {k: v[5:7] - (2 if k == "sample_index" else 0)
                                                     for k, v in batch.items()}, loss_settings(loss_agg=loss_agg))
    assert part_alone.item() != pytest.approx(full.item(), rel=1e-3)


def test_kl_zero_when_ref_equals_new():
    logits, batch = make_case([-0.5, -1.5], [1.2, 0.9], [1.0, -1.0])
    base, _ = compute_policy_loss(logits, batch, loss_settings())
    new_lp, _ = token_logprobs(logits.detach(), batch["targets"])
    with_kl, m = compute_policy_loss(logits, batch | {"ref_logprobs": new_lp}, loss_settings(kl_coef=0.5))
    assert with_kl.item() == pytest.approx(base.item(), abs=1e-7)
    assert m["kl"] == pytest.approx(0.0, abs=1e-7)


def test_kl_positive_when_ref_differs():
    logits, batch = make_case([-0.5, -1.5], [1.0, 1.0], [1.0, -1.0])
    base, _ = compute_policy_loss(logits, batch, loss_settings())
    ref = torch.tensor([-0.7, -1.0])
    with_kl, m = compute_policy_loss(logits, batch | {"ref_logprobs": ref}, loss_settings(kl_coef=0.5))
    d = ref - torch.tensor([-0.5, -1.5])
    k3 = torch.exp(d) - d - 1
    assert m["kl"] == pytest.approx(float(k3.sum()), rel=1e-5)
    assert m["kl"] > 0
    assert with_kl.item() - base.item() == pytest.approx(0.5 * float(k3.mean()), rel=1e-4)


def test_kl_coef_without_ref_raises():
    logits, batch = make_case([-0.5], [1.0], [1.0])
    with pytest.raises(ValueError, match="ref_logprobs"):
        compute_policy_loss(logits, batch, loss_settings(kl_coef=0.1))


def test_entropy_metric_and_temperature():
    logits = torch.zeros(2, 4)
    lp, ent = token_logprobs(logits, torch.tensor([0, 3]), temperature=0.5)
    torch.testing.assert_close(lp, torch.full((2,), -math.log(4)))
    torch.testing.assert_close(ent, torch.full((2,), math.log(4)))
    logits = torch.tensor([[2.0, 0.0]])
    lp, _ = token_logprobs(logits, torch.tensor([0]), temperature=2.0)
    assert float(lp) == pytest.approx(-math.log1p(math.exp(-1.0)), rel=1e-6)


def test_kl_term_is_clamped_like_the_standard_implementations():
    logits, batch = make_case([-1.0, -1.0], [1.0, 1.0], [0.0, 0.0])
    ref = torch.tensor([-1.0 + 50.0, -1.0 - 50.0])  # log-ratios far beyond +-20
    loss, m = compute_policy_loss(logits, batch | {"ref_logprobs": ref}, loss_settings(kl_coef=1.0))
    assert m["kl"] == pytest.approx(20.0)  # each token's k3 capped at 10 (unclamped: e^50 and 49)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()
    # inside the clamps the k3 value is exact
    ref = torch.tensor([-1.0 + 0.5, -1.0 - 0.5])
    _, m = compute_policy_loss(logits, batch | {"ref_logprobs": ref}, loss_settings(kl_coef=1.0))
    assert m["kl"] == pytest.approx((math.exp(0.5) - 0.5 - 1) + (math.exp(-0.5) + 0.5 - 1), rel=1e-4)


# ---- off-policy correction ------------------------------------------------------------------
# make_case's ratios are pi / pi_rollout; without prox_logprobs pi_prox = pi, so w = ratio.

def _grads(logits, batch, prox_logprobs=None, **settings):
    logits = logits.detach().clone().requires_grad_()
    loss, m = compute_policy_loss(logits, batch | {"prox_logprobs": prox_logprobs}, loss_settings(**settings))
    loss.backward()
    return loss.item(), logits.grad, m


def test_tis_weights_the_policy_gradient_by_the_capped_ratio():
    ratios, adv = [3.0, 0.5, 1.5], [1.0, 1.0, -1.0]
    logits, batch = make_case([-1.0, -0.7, -1.3], ratios, adv)
    loss, g, m = _grads(logits, batch, off_policy_correction="tis", is_cap=2.0, clip_low=0.2, clip_high=0.2)
    assert loss == pytest.approx((-2.0 - 0.5 + 1.5) / 3, rel=1e-5)  # -A * min(w, 2): the PPO ratio is 1
    probs = torch.softmax(logits.detach(), -1)
    for i, w in enumerate([2.0, 0.5, 1.5]):
        onehot = torch.nn.functional.one_hot(batch["targets"][i], 5).float()
        torch.testing.assert_close(g[i], -adv[i] * w * (onehot - probs[i]) / 3, rtol=1e-4, atol=1e-6)
    assert (m["is_truncated"], m["is_masked"], m["clip_high"], m["clip_low"]) == (1.0, 0.0, 0.0, 0.0)
    assert m["is_weight_max"] == pytest.approx(3.0, rel=1e-5)
    assert m["is_weight_sum"] == pytest.approx(5.0, rel=1e-5)
    _, g_none, _ = _grads(logits, batch, clip_low=0.2, clip_high=0.2)
    assert torch.count_nonzero(g_none[0]) == 0 and g[0].abs().max() > 1e-3  # none clips it away, tis keeps it


def test_decoupled_equals_tis_with_one_step_per_batch():
    logits, batch = make_case([-0.3, -1.1, -0.8, -2.0], [1.7, 0.6, 2.9, 1.0], [0.5, -1.0, 2.0, -0.3])
    prox = torch.tensor([-0.5, -1.0, -0.8, -1.7])  # also when pi_prox differs from pi (dropout on)
    for kw in ({}, {"prox_logprobs": prox}):
        loss_t, g_t, _ = _grads(logits, batch, off_policy_correction="tis", **kw)
        loss_d, g_d, _ = _grads(logits, batch, off_policy_correction="decoupled", **kw)
        assert loss_t == loss_d
        assert torch.equal(g_t, g_d)


def test_tis_clips_around_the_proximal_policy_when_it_differs():
    # pi_prox = e^-1.5, pi = e^-1: ratio_prox = e^0.5 = 1.65 > 1.2 and A > 0 -> clipped at 1.2, no gradient;
    # w = pi_prox / pi_rollout = 1.5
    logits, batch = make_case([-1.0], [1.0], [1.0])
    batch["old_logprobs"] = torch.tensor([-1.5 - math.log(1.5)])
    loss, g, m = _grads(logits, batch, off_policy_correction="tis", prox_logprobs=torch.tensor([-1.5]), clip_high=0.2)
    assert loss == pytest.approx(-1.2 * 1.5, rel=1e-5)
    assert torch.count_nonzero(g) == 0 and m["clip_high"] == 1.0


def test_mis_masks_tokens_outside_the_band():
    ratios, adv = [3.0, 0.4, 1.5, 0.5], [1.0, 1.0, -1.0, 1.0]
    logits, batch = make_case([-1.0, -0.7, -1.3, -0.9], ratios, adv)
    loss, g, m = _grads(logits, batch, off_policy_correction="mis", is_band=(0.5, 2.0))
    assert loss == pytest.approx((0 + 0 + 1.5 - 0.5) / 4, rel=1e-5)  # masked tokens still count in the mean
    assert torch.count_nonzero(g[0]) == 0 and torch.count_nonzero(g[1]) == 0
    assert g[2].abs().max() > 1e-3 and g[3].abs().max() > 1e-3
    assert (m["is_masked"], m["is_truncated"]) == (2.0, 0.0)


def test_dual_clip_bounds_negative_advantage_tokens():
    # A = -1, ratio 5: PPO term 5, dual-clip -> 3 (no gradient); A = -1, ratio 2: 2 stays;
    # A = +1, ratio 5: clipped at 1.2 as before (dual-clip is for A < 0 only)
    logits, batch = make_case([-1.0, -1.2, -0.8], [5.0, 2.0, 5.0], [-1.0, -1.0, 1.0])
    loss_plain, g_plain, _ = _grads(logits, batch, clip_high=0.2)
    assert loss_plain == pytest.approx((5.0 + 2.0 - 1.2) / 3, rel=1e-5)
    loss, g, _ = _grads(logits, batch, clip_high=0.2, dual_clip=3.0)
    assert loss == pytest.approx((3.0 + 2.0 - 1.2) / 3, rel=1e-5)
    assert torch.count_nonzero(g[0]) == 0 and g_plain[0].abs().max() > 1e-3
    torch.testing.assert_close(g[1:], g_plain[1:])


def test_dual_clip_does_not_bind_under_a_correction():
    # with a correction the PPO ratio is 1 (one step per batch); the large w is capped by is_cap instead
    logits, batch = make_case([-1.0], [5.0], [-1.0])
    loss, _, _ = _grads(logits, batch, off_policy_correction="tis", is_cap=2.0, dual_clip=3.0)
    assert loss == pytest.approx(2.0, rel=1e-5)


def test_mismatch_split_by_lag():
    logits, batch = make_case([-1.0, -1.0, -1.0, -1.0], [1.0, 1.5, 0.5, 2.0], [1.0] * 4)
    batch["lag"] = torch.tensor([0, 0, 1, 2])
    _, m = compute_policy_loss(logits, batch, loss_settings())
    k3 = lambda w: w - 1 - math.log(w)  # noqa: E731  (k3 of pi_rollout vs pi, w = pi / pi_rollout)
    assert (m["tokens_same_weights"], m["tokens_lagged"]) == (2.0, 2.0)
    assert m["kl_same_weights"] == pytest.approx(k3(1.5), rel=1e-4)
    assert m["kl_lagged"] == pytest.approx(k3(0.5) + k3(2.0), rel=1e-4)
    assert m["approx_kl"] == pytest.approx(float(m["kl_same_weights"] + m["kl_lagged"]), rel=1e-6)


def test_loss_metrics_stay_detached_tensors_so_micro_batches_add_them_without_a_sync():
    logits, batch = make_case([-1.0, -2.0], [1.0, -1.0], [1.0, 1.0])
    batch["lag"] = torch.tensor([0, 1])
    _, m = compute_policy_loss(logits.requires_grad_(), batch | {"ref_logprobs": torch.tensor([-1.0, -2.0])},
                               loss_settings(kl_coef=0.1))
    assert set(m) >= {"tokens", "clip_low", "approx_kl", "entropy", "kl", "is_weight_max", "kl_lagged"}
    for k, v in m.items():
        assert torch.is_tensor(v) and v.dim() == 0 and not v.requires_grad, k
    assert float(m["tokens"]) == 2.0 and float(m["tokens_same_weights"]) == 1.0


def test_unknown_correction_raises():
    logits, batch = make_case([-1.0], [1.0], [1.0])
    with pytest.raises(ValueError, match="correction"):
        compute_policy_loss(logits, batch, loss_settings(off_policy_correction="ppo2"))
