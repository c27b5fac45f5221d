"""Packed rows: one row of end-to-end sequences scores every token as its own padded row does."""

from collections import Counter

import pytest
import torch

from families import FAMILIES, tiny_family_policy

from nanorllm.core.types import RolloutResult, StepSample, Trajectory
from nanorllm.trainer.collate import collate_train_batch
from nanorllm.trainer.loss import token_logprobs
from nanorllm.trainer.micro_batches import micro_batches
from nanorllm.trainer.step import train_step
from nanorllm.trainer.update import score
from test_train_step import _episodes, build_results, config, count_host_syncs, snapshot


# (prompt, response) tokens per turn of each episode of a group: rows of 40, 8, 18 and 60 tokens
LENGTHS = [[(30, 10)], [(5, 3)], [(6, 4), (3, 5)], [(40, 20)]]


def varied_results(vocab: int, seed: int = 0) -> list[RolloutResult]:
    """Two groups of four episodes of lengths far apart (several fit one packed row), random tokens."""
    g = torch.Generator().manual_seed(seed)
    results = []
    for task in ("g0", "g1"):
        for e, turns in enumerate(LENGTHS):
            prompt, samples = [], []
            for t, (p, r) in enumerate(turns):
                prompt = prompt + torch.randint(3, vocab, (p,), generator=g).tolist()
                response = torch.randint(3, vocab, (r,), generator=g).tolist()
                samples.append(StepSample(task_id=task, episode_id=f"{task}#{e}", turn=t, prompt_ids=prompt,
                                          response_ids=response, rollout_logprobs=[-5.0] * r, reward=float(e % 2)))
                prompt = prompt + response
            results.append(RolloutResult(trajectory=Trajectory(task_id=task, final_reward=float(e % 2)),
                                         step_samples=samples))
    return results


def _logprobs(policy, batch):
    with torch.no_grad():
        return token_logprobs(score(policy, batch).logits, batch["targets"], 1.0)[0]


def test_packed_rows_give_the_padded_rows_logprobs_token_for_token(tiny_policy):
    samples = [s for r in varied_results(len(tiny_policy.tokenizer)) for s in r.step_samples]
    padded = collate_train_batch(samples, pad_id=tiny_policy.pad_id)
    packed = collate_train_batch(samples, pad_id=tiny_policy.pad_id, pack=True)
    (B, T), (R, W) = padded["input_ids"].shape, packed["input_ids"].shape
    assert W == T and R < B and packed["shared_columns"] == 0
    assert packed["attention_mask"].sum() == padded["num_tokens"] > R * T - T  # pads only in one row's width
    assert torch.equal(packed["targets"], padded["targets"]) and packed["loss_mask"].sum() == padded["loss_mask"].sum()
    real = packed["position_ids"][packed["attention_mask"] == 1]
    assert (real == 0).sum() == B  # every row restarts its positions at 0
    torch.testing.assert_close(_logprobs(tiny_policy, packed), _logprobs(tiny_policy, padded), rtol=0, atol=1e-5)
    crossing = {**packed, "position_ids": None}  # causal rows: a later sequence sees the earlier ones
    assert (_logprobs(tiny_policy, crossing) - _logprobs(tiny_policy, padded)).abs().max() > 1e-3


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean"])
def test_a_packed_update_has_the_padded_updates_loss_and_gradient(tiny_policy_factory, loss_agg):
    out, deltas = {}, {}
    for packing in (False, True):
        policy = tiny_policy_factory()
        results = varied_results(len(policy.tokenizer))
        before = snapshot(policy)
        cfg = config(micro_batch_tokens=100_000, packing=packing, loss_agg=loss_agg, max_grad_norm=1e6)
        out[packing] = train_step(policy, torch.optim.SGD(policy.model.parameters(), lr=1.0), results, cfg)
        deltas[packing] = [p.detach() - b for p, b in zip(policy.parameters(), before)]  # = -gradient
    assert out[True]["loss/policy"] == pytest.approx(out[False]["loss/policy"], abs=1e-6)
    assert out[True]["train/padded_tokens"] < out[False]["train/padded_tokens"]
    assert out[False]["perf/pad_frac"] == pytest.approx(1 - 252 / 480)  # rows of 40, 8, 18, 60 tokens, twice
    assert out[True]["perf/pad_frac"] == pytest.approx(1 - 252 / 300)  # rows (60) (60) (40 18) (40 18) (8 8, a 44-token tail)
    for a, b in zip(deltas[False], deltas[True]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert max(float(d.abs().max()) for d in deltas[True]) > 1e-3


def test_rows_too_alike_to_share_a_packed_row_keep_the_padded_layout(tiny_policy):
    """No packed row would hold two sequences: the packed batch is the padded one, shared template included."""
    samples = [s for r in build_results(tiny_policy) for s in r.step_samples]
    packed = collate_train_batch(samples, pad_id=tiny_policy.pad_id, pack=True)
    padded = collate_train_batch(samples, pad_id=tiny_policy.pad_id)
    assert "position_ids" not in packed and packed["shared_columns"] == padded["shared_columns"] > 0
    assert all(torch.equal(packed[k], padded[k]) for k in ("input_ids", "attention_mask", "positions"))


def test_packed_micro_batches_bound_the_sum_of_row_lengths():
    samples = _episodes([[(10, 2)]] * 6 + [[(10, 2), (10, 20)]] * 2)  # rows of 12 and 42 tokens
    chunks = micro_batches(samples, 60, pack=True)
    sums = [int(collate_train_batch(c, pad_id=0, pack=True)["attention_mask"].sum()) for c in chunks]
    assert sums == [60, 54, 42] and max(sums) <= 60
    assert len(micro_batches(samples, 60)) == 4  # padded: rows x longest bounds the same passes more tightly


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_rows_keep_their_attention_apart_in_every_family(family):
    """Sliding-window layers (Gemma2, a window shorter than the rows) get their own packed mask too."""
    policy = tiny_family_policy(family, **({"sliding_window": 4} if family == "gemma2" else {}))
    policy.share_prefix = False
    ids = torch.randint(3, 200, (3, 12))
    lengths = [12, 7, 9]
    mask = (torch.arange(12) < torch.tensor(lengths)[:, None]).long()
    positions = torch.tensor([(b, t) for b, n in enumerate(lengths) for t in range(n - 1)])  # (N, 2)
    packed_ids = torch.cat([ids[b, :n] for b, n in enumerate(lengths)])[None]
    offsets = torch.tensor([0, *lengths[:-1]]).cumsum(0)
    packed_positions = torch.stack([torch.zeros_like(positions[:, 0]), offsets[positions[:, 0]] + positions[:, 1]], 1)
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        padded = policy.forward(ids, mask, positions).logits
        packed = policy.forward(packed_ids, torch.ones_like(packed_ids), packed_positions, 0, position_ids).logits
    torch.testing.assert_close(packed, padded, rtol=0, atol=1e-4)


def test_a_packed_step_asks_the_device_for_one_number(tiny_policy_factory, monkeypatch):
    """The packed masks are built from position_ids on the device: the step's one read stays its tolist."""
    reads = {}
    for tokens in (100_000, 130):
        policy = tiny_policy_factory()
        policy.prebuilt_masks = True  # as on CUDA: a pass left in the padded layout passes its masks built too
        results = varied_results(len(policy.tokenizer))
        cfg = config(micro_batch_tokens=tokens, packing=True)
        out = {}
        opt = torch.optim.SGD(policy.model.parameters(), lr=cfg.lr)
        seen = count_host_syncs(monkeypatch, lambda: out.update(train_step(policy, opt, results, cfg)))
        reads[int(out["perf/micro_batches"])] = Counter(seen)
    assert sorted(reads) == [1, 3]
    assert reads[1] == reads[3] == Counter({"tolist": 1}), reads
