import math
from collections import Counter

import pytest
import torch

from families import FAMILIES, tiny_family_policy
from helpers import HostReads
from nanorllm.config import TrainConfig
from nanorllm.core.types import RolloutResult, StepSample, Trajectory
from nanorllm.policy.base import SamplingParams
from nanorllm.trainer.collate import collate_train_batch
from nanorllm.trainer.loss import token_logprobs
from nanorllm.trainer.micro_batches import micro_batches
from nanorllm.trainer.step import train_step
from nanorllm.trainer.update import make_optimizer, proximal_logprobs

REWARDS = {"g0": [1.0, 0.0, 0.0, 1.0], "g1": [0.0, 1.0, 0.0, 0.0]}
TWO_TURNS = {("g0", 1), ("g0", 2), ("g1", 0), ("g1", 2), ("g1", 3)}  # wrong first answers that retried


def build_results(policy, rewards=REWARDS, two_turns=TWO_TURNS, *, max_new_tokens=8):
    """Episodes sampled from `policy`: one generate call per turn, rewards set by hand."""
    policy.seed(0)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0)
    keys = [(g, k) for g, rs in rewards.items() for k in range(len(rs))]
    prompts = {key: policy.first_prompt_ids([{"role": "user", "content": f"Question {key[0]}: 2 + {len(key[0])}?"}])
               for key in keys}
    samples = {key: [] for key in keys}
    live = list(keys)
    for turn in range(2):
        if not live:
            break
        gens = policy.generate([[]] * len(live), [prompts[key] for key in live], params)
        for key, gen in zip(live, gens):
            samples[key].append(StepSample(task_id=key[0], episode_id=f"{key[0]}#{key[1]}", turn=turn,
                                           prompt_ids=prompts[key], response_ids=gen.response_ids,
                                           rollout_logprobs=gen.logprobs, truncated=gen.truncated))
            prompts[key] = policy.next_prompt_ids(prompts[key], gen.response_ids,
                                                  {"role": "user", "content": "Try again."})
        live = [key for key in live if key in two_turns]
    results = []
    for key in keys:
        reward = rewards[key[0]][key[1]]
        for s in samples[key]:
            s.reward = reward
        results.append(RolloutResult(trajectory=Trajectory(task_id=key[0], final_reward=reward),
                                     step_samples=samples[key]))
    return results


def config(**kw):
    return TrainConfig(model="tiny-random", lr=1e-2, temperature=1.0,
                       micro_batch_tokens=kw.pop("micro_batch_tokens", 128), **kw)


def snapshot(policy):
    return [p.detach().clone() for p in policy.parameters()]


def max_change(policy, before):
    return max(float((p.detach() - b).abs().max()) for p, b in zip(policy.parameters(), before))


def test_build_results_shapes(tiny_policy):
    results = build_results(tiny_policy)
    assert [len(r.step_samples) for r in results] == [1, 2, 2, 1, 2, 1, 2, 2]
    two = results[1].step_samples
    assert two[1].prompt_ids[:len(two[0].prompt_ids) + len(two[0].response_ids)] == (
        two[0].prompt_ids + two[0].response_ids)
    batch = collate_train_batch([s for r in results for s in r.step_samples], pad_id=tiny_policy.pad_id)
    assert batch["input_ids"].shape[0] == 8


def test_one_step_updates_parameters_with_finite_metrics(fresh_tiny_policy):
    policy = fresh_tiny_policy
    results = build_results(policy)
    cfg = config()
    before = snapshot(policy)
    m = train_step(policy, make_optimizer(policy, cfg), results, cfg)
    assert max_change(policy, before) > 1e-3
    for key in ["loss/policy", "grad_norm", "entropy", "clip_ratio/low", "clip_ratio/high", "approx_kl"]:
        assert math.isfinite(m[key]), key
    assert m["train/skipped_nan"] == 0
    assert m["grad_norm"] > 0
    assert m["frac_reward_zero_std"] == 0.0
    samples = [s for r in results for s in r.step_samples]
    n_tokens = sum(len(s.response_ids) for s in samples)
    assert (m["train/samples"], m["train/tokens"]) == (len(samples), n_tokens)
    assert m["clip_ratio/low"] == 0.0 and m["clip_ratio/high"] == 0.0
    assert abs(m["approx_kl"]) < 1e-4
    expected = -sum(s.advantage * len(s.response_ids) for s in samples) / n_tokens
    assert m["loss/policy"] == pytest.approx(expected, abs=1e-4)
    assert 0 < m["entropy"] <= math.log(len(policy.tokenizer)) + 1e-4


def test_constant_reward_groups_are_dropped_and_nothing_changes(fresh_tiny_policy):
    policy = fresh_tiny_policy
    results = build_results(policy, rewards={"g0": [1.0, 1.0, 1.0], "g1": [0.0, 0.0, 0.0]},
                            two_turns={("g1", 0)})
    cfg = config(drop_zero_std_groups=True)
    before = snapshot(policy)
    m = train_step(policy, make_optimizer(policy, cfg), results, cfg)
    assert max_change(policy, before) == 0.0
    assert m["frac_reward_zero_std"] == 1.0
    assert (m["train/samples"], m["train/tokens"], m["loss/policy"]) == (0, 0.0, 0.0)
    assert "grad_norm" not in m


def test_half_constant_groups_reported(fresh_tiny_policy):
    policy = fresh_tiny_policy
    results = build_results(policy, rewards={"g0": [1.0, 0.0], "g1": [0.0, 0.0]}, two_turns=set())
    m = train_step(policy, make_optimizer(policy, config()), results, config())
    assert m["frac_reward_zero_std"] == 0.5
    assert m["train/samples"] == 2


def _inject_nan_logprob(results):
    longest = max(results, key=lambda r: len(r.step_samples[-1].prompt_ids) + len(r.step_samples[-1].response_ids))
    longest.step_samples[-1].rollout_logprobs[0] = float("nan")


def _inject_nan_reward(results):
    results[0].trajectory.final_reward = float("nan")


@pytest.mark.parametrize("inject", [_inject_nan_logprob, _inject_nan_reward])
@pytest.mark.parametrize("micro_batch_tokens", [40, 4096])
def test_nan_skips_the_update(fresh_tiny_policy, inject, micro_batch_tokens):
    policy = fresh_tiny_policy
    results = build_results(policy)
    inject(results)
    cfg = config(micro_batch_tokens=micro_batch_tokens)
    samples = [s for r in results for s in r.step_samples]
    assert (len(micro_batches(samples, micro_batch_tokens)) > 2) == (micro_batch_tokens == 40)
    before = snapshot(policy)
    opt = make_optimizer(policy, cfg)
    m = train_step(policy, opt, results, cfg)
    assert m["train/skipped_nan"] == 1
    assert max_change(policy, before) == 0.0
    assert "grad_norm" not in m
    assert all(p.grad is None for p in policy.parameters())
    assert not opt.state


def _episodes(lengths):
    """Hand-made samples: `lengths[e]` lists (prompt, response) sizes per turn of episode e."""
    samples = []
    for e, turns in enumerate(lengths):
        prompt = []
        for t, (p, r) in enumerate(turns):
            prompt = prompt + [7] * p
            samples.append(StepSample(task_id="t", episode_id=f"t#{e}", turn=t, prompt_ids=prompt,
                                      response_ids=[8] * r, rollout_logprobs=[-1.0] * r))
            prompt = prompt + [8] * r
    return samples


def test_micro_batches_keep_episodes_whole_and_respect_budget():
    samples = _episodes([[(5, 3)], [(4, 2), (3, 4)], [(20, 10), (5, 5)], [(2, 1)], [(6, 6), (2, 2), (1, 1)],
                         [(3, 3)], [(60, 20)]])
    budget = 40
    chunks = micro_batches(samples, budget)
    flat = [s for c in chunks for s in c]
    assert sorted(map(id, flat)) == sorted(map(id, samples))
    for chunk in chunks:
        episodes = []
        for s in chunk:
            if not episodes or episodes[-1][0].episode_id != s.episode_id:
                episodes.append([s])
            else:
                episodes[-1].append(s)
        ids = [ep[0].episode_id for ep in episodes]
        assert len(ids) == len(set(ids))
        for ep in episodes:
            assert [s.turn for s in ep] == list(range(len(ep)))
            assert sum(1 for s in samples if s.episode_id == ep[0].episode_id) == len(ep)
        batch = collate_train_batch(chunk, pad_id=0)
        assert batch["input_ids"].shape[0] == len(episodes)
        assert batch["input_ids"].numel() <= budget or len(episodes) == 1
    assert any(len({s.episode_id for s in c}) > 1 for c in chunks)
    (big,) = [c for c in chunks if c[0].episode_id == "t#6"]
    assert len(big) == 1
    assert len(chunks) >= 4


def test_micro_batches_one_chunk_when_budget_is_large():
    samples = _episodes([[(5, 3)], [(4, 2), (3, 4)], [(2, 1)]])
    (chunk,) = micro_batches(samples, 10_000)
    assert len(chunk) == 4


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean", "seq-mean-token-sum-norm"])
def test_micro_batched_update_equals_single_batch_update(tiny_policy_factory, loss_agg):
    a, b = tiny_policy_factory(), tiny_policy_factory()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    results_a, results_b = build_results(a), build_results(b)
    samples = [s for r in results_a for s in r.step_samples]
    assert len(micro_batches(samples, 40)) > 2
    assert len(micro_batches(samples, 100_000)) == 1
    before = snapshot(a)
    out = []
    for policy, results, tokens in [(a, results_a, 40), (b, results_b, 100_000)]:
        cfg = config(micro_batch_tokens=tokens, loss_agg=loss_agg, max_grad_norm=1e6)
        opt = torch.optim.SGD(policy.model.parameters(), lr=1.0)
        out.append(train_step(policy, opt, results, cfg))
    ma, mb = out
    assert ma["loss/policy"] == pytest.approx(mb["loss/policy"], rel=1e-5, abs=1e-7)
    assert ma["grad_norm"] == pytest.approx(mb["grad_norm"], rel=1e-5)
    assert ma["train/padded_tokens"] < mb["train/padded_tokens"]
    for pa, pb, p0 in zip(a.parameters(), b.parameters(), before):
        torch.testing.assert_close(pa.detach() - p0, pb.detach() - p0, rtol=1e-4, atol=1e-6)
    assert max_change(a, before) > 1e-3


def test_kl_to_identical_reference_is_zero(fresh_tiny_policy, tiny_policy_factory):
    policy, ref = fresh_tiny_policy, tiny_policy_factory()
    results = build_results(policy)
    cfg = config(kl_coef=0.1)
    m = train_step(policy, make_optimizer(policy, cfg), results, cfg, ref_policy=ref)
    assert m["loss/kl"] == pytest.approx(0.0, abs=1e-6)
    assert m["train/skipped_nan"] == 0 and math.isfinite(m["loss/policy"])


def test_mask_truncated_episodes_give_no_gradient_and_are_counted(tiny_policy_factory):
    policy = tiny_policy_factory()
    results = build_results(policy)
    cut = results[0]  # g0#0, reward 1: its only turn was cut at max_new_tokens
    for r in results:
        for s in r.step_samples:
            s.truncated = r is cut
    tokens = sum(len(s.response_ids) for r in results for s in r.step_samples)
    m = train_step(policy, make_optimizer(policy, config()), results, config(mask_truncated=True))
    assert m["train/masked_truncated"] == 1
    assert m["train/tokens"] == tokens - sum(len(s.response_ids) for s in cut.step_samples)
    assert cut.step_samples[0].advantage > 0  # it still counts in its group's advantage
    assert train_step(policy, make_optimizer(policy, config()), results, config())["train/masked_truncated"] == 0

    policy = tiny_policy_factory()
    for r in results:
        for s in r.step_samples:
            s.truncated = True
    before = snapshot(policy)
    m = train_step(policy, make_optimizer(policy, config()), results, config(mask_truncated=True))
    assert (m["train/masked_truncated"], m["train/samples"]) == (8, 0)
    assert max_change(policy, before) == 0.0


# ---- off-policy correction and the mismatch split -------------------------------------------

@pytest.mark.parametrize("correction", ["tis", "mis", "decoupled"])
def test_correction_on_fresh_samples_matches_the_plain_update(tiny_policy_factory, correction):
    """Serial samples (lag 0, sampler = learner up to numerics): w = 1, so any correction is the plain update."""
    updated = []
    for corr in ("none", correction):
        policy = tiny_policy_factory()
        results = build_results(policy)
        cfg = config(off_policy_correction=corr)
        m = train_step(policy, make_optimizer(policy, cfg), results, cfg)
        updated.append(snapshot(policy))
    for a, b in zip(*updated):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert m["is_weight/mean"] == pytest.approx(1.0, abs=1e-4)
    assert m["is_weight/max"] == pytest.approx(1.0, abs=1e-3)
    assert m["is_weight/truncated_frac"] == 0.0 and m["is_weight/masked_frac"] == 0.0
    assert m["mismatch/kl_same_weights"] < 1e-5 and "mismatch/kl_lagged" not in m


def test_mismatch_is_split_by_each_samples_policy_lag(fresh_tiny_policy):
    policy = fresh_tiny_policy
    results = build_results(policy)
    policy.version = 3
    for i, r in enumerate(results):
        for s in r.step_samples:
            s.policy_version = 3 if i % 2 else 2
            if i % 2 == 0:
                s.rollout_logprobs = [x - 0.3 for x in s.rollout_logprobs]  # as if older weights sampled them
    cfg = config()
    m = train_step(policy, make_optimizer(policy, cfg), results, cfg)
    assert m["mismatch/kl_same_weights"] < 1e-5
    assert m["mismatch/kl_lagged"] == pytest.approx(math.exp(0.3) - 1 - 0.3, rel=1e-3)
    assert "is_weight/mean" not in m  # only with a correction


def test_proximal_logprobs_equal_the_grad_forwards_values(tiny_policy):
    """Why no extra forward runs with dropout off: pi_prox recomputed is bit-identical to pi."""
    results = build_results(tiny_policy)
    batch = collate_train_batch([s for r in results for s in r.step_samples], pad_id=tiny_policy.pad_id)
    tiny_policy.model.train(False)
    out = tiny_policy.forward(batch["input_ids"], batch["attention_mask"], batch["positions"])
    lp, _ = token_logprobs(out.logits, batch["targets"], 1.0)
    assert torch.equal(proximal_logprobs(tiny_policy, batch, 1.0), lp.detach())


def test_correction_with_dropout_on_recomputes_the_proximal_logprobs(fresh_tiny_policy, monkeypatch):
    import nanorllm.trainer.loss as loss_mod
    calls = []
    real = loss_mod.proximal_logprobs
    monkeypatch.setattr(loss_mod, "proximal_logprobs", lambda *a: calls.append(1) or real(*a))
    policy = fresh_tiny_policy
    results = build_results(policy)
    cfg = config(off_policy_correction="tis", disable_dropout=False)
    m = train_step(policy, make_optimizer(policy, cfg), results, cfg)
    assert len(calls) == len(micro_batches([s for r in results for s in r.step_samples], cfg.micro_batch_tokens))
    assert math.isfinite(m["is_weight/mean"]) and m["train/skipped_nan"] == 0


def test_turn_credit_reaches_the_update(fresh_tiny_policy):
    """All episodes solved, two only on their retry: no episode-level signal, a turn-level one, so the group trains
    and does not count as a zero-std group (the update's test and the metric's are one)."""
    policy = fresh_tiny_policy
    results = build_results(policy, rewards={"g0": [1.0, 1.0, 1.0, 1.0]}, two_turns={("g0", 1), ("g0", 2)})
    cfg = config(turn_credit="turn", turn_gamma=0.5)
    before = snapshot(policy)
    m = train_step(policy, make_optimizer(policy, cfg), results, cfg)
    assert m["frac_reward_zero_std"] == 0.0 and m["train/samples"] == 6
    assert max_change(policy, before) > 1e-3
    first = [r.step_samples[0].advantage for r in results]
    assert first[0] == first[3] > 0 > first[1] == first[2]


def count_host_syncs(monkeypatch, fn) -> list[str]:
    """The host reads of device values while `fn` runs: HostReads' ops, plus `tolist`, which reads
    the data without dispatching an op."""
    reads = HostReads()
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: reads.seen.append("tolist") or real(self))
    try:
        with reads:
            fn()
    finally:
        monkeypatch.undo()
    return reads.seen


@pytest.mark.parametrize("off_policy_correction", ["none", "tis"])
@pytest.mark.parametrize("prefix", [True, False])
def test_the_micro_batch_loop_asks_the_device_for_no_number(tiny_policy_factory, monkeypatch, off_policy_correction,
                                                            prefix):
    """More micro-batches, not more host reads: metrics stay tensors until the step's one transfer
    (its tolist), the forward's shared-prefix count comes from collate, and the head's rows are
    gathered by indices computed on the device. Without a shared prefix (dropout on, one row, a short
    common prompt), the forward passes its causal masks built, as on CUDA: transformers' own check
    whether it may skip them would read the device once a micro-batch."""
    reads = {}
    for tokens in (4096, 256):
        policy = tiny_policy_factory()
        results = build_results(policy)
        cfg = config(micro_batch_tokens=tokens, off_policy_correction=off_policy_correction, kl_coef=0.1)
        chunks = micro_batches([s for r in results for s in r.step_samples], tokens)
        assert all(len({s.episode_id for s in c}) > 1 for c in chunks)  # every forward shares its prompt prefix
        # SGD: the CPU AdamW reads each parameter's step count (the fused CUDA one, make_optimizer's there, does not)
        opt, ref = torch.optim.SGD(policy.model.parameters(), lr=cfg.lr), tiny_policy_factory()
        ref.model.requires_grad_(False).eval()  # as the run holds its reference
        for p in (policy, ref):
            p.share_prefix, p.prebuilt_masks = prefix, True  # the learner's and the reference's forward, as on CUDA
        out = {}
        reads[len(chunks)] = Counter(count_host_syncs(monkeypatch, lambda: out.update(
            train_step(policy, opt, results, cfg, ref_policy=ref))))
        assert out["train/skipped_nan"] == 0 and out["perf/micro_batches"] == len(chunks)
    assert sorted(reads) == [1, 3]
    assert reads[1] == reads[3] == Counter({"tolist": 1}), reads


@pytest.mark.parametrize("family", FAMILIES)
def test_prebuilt_masks_give_the_logits_transformers_own_masks_give(family):
    """`full_masks` builds what the model would: padded and unpadded rows, and Gemma2's sliding-window
    layers (a window shorter than the rows) their own mask."""
    policy = tiny_family_policy(family, **({"sliding_window": 4} if family == "gemma2" else {}))
    ids = torch.randint(3, 200, (3, 12))
    for mask in (torch.ones(3, 12, dtype=torch.long), (torch.arange(12) < torch.tensor([[12], [7], [9]])).long()):
        positions = mask.nonzero()[:, :2]  # every real token
        policy.share_prefix = False
        logits = {}
        for prebuilt in (False, True):
            policy.prebuilt_masks = prebuilt
            with torch.no_grad():
                logits[prebuilt] = policy.forward(ids, mask, positions).logits
        torch.testing.assert_close(logits[True], logits[False], rtol=0, atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("autocast", [False, True])
def test_a_training_forward_over_padded_rows_passes_one_additive_mask_with_the_same_logits(family, autocast,
                                                                                          monkeypatch):
    """With gradients on and padding present the forward builds its masks and makes them additive in the query's
    dtype itself, as SDPA would: the logits are the boolean masks' to the bit, and autograd keeps one (B, 1, T, T)
    mask for every layer instead of SDPA's copy a layer."""
    from nanorllm.policy import hf_causal

    policy = tiny_family_policy(family, **({"sliding_window": 4} if family == "gemma2" else {}))
    policy.compute_dtype = torch.bfloat16 if autocast else None
    policy.share_prefix = False
    ids = torch.randint(3, 200, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 7:] = 0  # right padding
    mask[2, :4] = 0  # left padding
    positions = mask.nonzero()[:, :2]
    logits, masks_kept = {}, {}
    for made_additive in (True, False):
        if not made_additive:  # the boolean masks go to SDPA as transformers builds them
            monkeypatch.setattr(hf_causal, "additive", lambda masks, dtype: masks)
        kept = set()

        def pack(t, kept=kept):
            if t.dim() == 4 and t.shape[-2:] == (12, 12) and t.shape[1] == 1:
                kept.add(t.untyped_storage().data_ptr())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logits[made_additive] = policy.forward(ids, mask, positions).logits
        masks_kept[made_additive] = len(kept)
    assert logits[True].requires_grad and torch.equal(logits[True], logits[False])
    if policy.model.config._attn_implementation == "eager":  # Gemma2's: transformers builds its masks additive
        assert masks_kept[True] == masks_kept[False]
    else:
        assert masks_kept == {False: policy.model.config.num_hidden_layers, True: 1}
