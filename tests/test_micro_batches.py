"""Micro-batches sized for the device, padding measured, rows bucketed by length when it is wasteful."""

from types import SimpleNamespace

import pytest
import torch

from nanorllm.trainer.collate import collate_train_batch
from nanorllm.trainer.micro_batches import (CPU_MICRO_BATCH_TOKENS, fitting_micro_batch_tokens, micro_batches, pad_frac,
                                            step_max_pad_frac, step_micro_batch_tokens)
from nanorllm.trainer.step import train_step
from nanorllm.trainer.update import make_optimizer
from test_train_step import _episodes, build_results, config, snapshot

ONE_LONG = {("g0", 1)}  # seven one-turn episodes and one two-turn: a padded single pass


def test_pad_frac_counts_pad_tokens_of_every_pass():
    samples = _episodes([[(5, 3)], [(4, 2), (3, 4)], [(2, 1)]])  # rows of 8, 13 and 3 tokens
    assert pad_frac(micro_batches(samples, 10_000)) == pytest.approx(1 - 24 / 39)
    assert pad_frac(micro_batches(samples, 13)) == 0.0  # one row a pass
    assert pad_frac([]) == 0.0


def test_bucketing_cuts_a_padded_pass_at_length_boundaries():
    lengths = [[(10, 2)]] * 6 + [[(10, 2), (10, 20)]] * 2  # rows of 12 and 42 tokens
    samples = _episodes(lengths)
    (whole,) = micro_batches(samples, 10_000)
    assert pad_frac([whole]) > 0.5
    chunks = micro_batches(samples, 10_000, max_pad_frac=0.2)
    rows = [collate_train_batch(c, pad_id=0)["attention_mask"].sum(1).tolist() for c in chunks]
    assert rows == [[12] * 6, [42] * 2]
    assert pad_frac(chunks) == 0.0
    assert micro_batches(samples, 10_000, max_pad_frac=0.6) == [whole]  # under the bound: left as it was


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean"])
def test_bucketing_lowers_pad_frac_and_leaves_loss_and_gradient_unchanged(tiny_policy_factory, loss_agg):
    out, deltas = {}, {}
    for bound in (1.0, 0.2):  # 1: never bucket
        policy = tiny_policy_factory()
        results = build_results(policy, two_turns=ONE_LONG)
        before = snapshot(policy)
        cfg = config(micro_batch_tokens=100_000, max_pad_frac=bound, loss_agg=loss_agg, max_grad_norm=1e6)
        out[bound] = train_step(policy, torch.optim.SGD(policy.model.parameters(), lr=1.0), results, cfg)
        deltas[bound] = [p.detach() - b for p, b in zip(policy.parameters(), before)]  # = -gradient
    whole, bucketed = out[1.0], out[0.2]
    assert (whole["perf/micro_batches"], bucketed["perf/micro_batches"]) == (1, 2)
    assert whole["perf/pad_frac"] > 0.3 and bucketed["perf/pad_frac"] < 0.1
    assert bucketed["train/padded_tokens"] < whole["train/padded_tokens"]
    assert bucketed["loss/policy"] == pytest.approx(whole["loss/policy"], abs=1e-6)
    assert bucketed["train/tokens"] == whole["train/tokens"]
    for a, b in zip(deltas[1.0], deltas[0.2]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert max(float(d.abs().max()) for d in deltas[0.2]) > 1e-3


def test_cpu_defaults_keep_the_4096_token_passes_and_no_bucketing(tiny_policy_factory):
    """micro_batch_tokens / max_pad_frac unset give exactly the update the 4096 setting gave."""
    policy = tiny_policy_factory()
    assert step_micro_batch_tokens(policy, None) == CPU_MICRO_BATCH_TOKENS and step_max_pad_frac(policy, None) is None
    assert step_micro_batch_tokens(policy, 128) == 128 and step_max_pad_frac(policy, 1.0) is None
    after = []
    for tokens in (None, 4096):
        policy = tiny_policy_factory()
        results = build_results(policy, two_turns=ONE_LONG)
        m = train_step(policy, make_optimizer(policy, config()), results, config(micro_batch_tokens=tokens))
        after.append(snapshot(policy))
    assert m["perf/pad_frac"] > 0.3  # bucketing would have split this pass on a GPU
    assert all(torch.equal(a, b) for a, b in zip(*after))


def test_a_gpu_pass_is_sized_by_free_memory_and_the_models_shape():
    smollm2 = dict(layers=30, hidden=576, intermediate=1536, vocab=49152)
    # 2.41 MB a token in bf16 (1.43 MB in the layers, 0.98 MB in the head): half of 139 GB holds 28,820
    assert fitting_micro_batch_tokens(139e9, dtype_bytes=2, **smollm2) == 28 * 1024
    fp32 = fitting_micro_batch_tokens(139e9, dtype_bytes=4, **smollm2)
    assert fp32 % 1024 == 0 and CPU_MICRO_BATCH_TOKENS < fp32 < 28 * 1024
    assert fitting_micro_batch_tokens(4e9, dtype_bytes=2, **smollm2) == CPU_MICRO_BATCH_TOKENS  # never below
    assert fitting_micro_batch_tokens(1e13, dtype_bytes=2, **smollm2) == 65536  # nor past compute-bound


def test_a_gpu_pass_counts_the_allocators_free_blocks_but_not_a_graph_pools(monkeypatch):
    """On cuda:0 the driver has 60 GiB free; torch's default pool holds 10 GiB free in its segments, a
    decode engine's graph pool 30 GiB (only its replays can use them) and cuda:1's pool 5 GiB: a pass is
    sized for 70 GiB."""
    GiB = 2**30
    segments = [dict(device=0, segment_pool_id=(0, 0), total_size=16 * GiB, allocated_size=6 * GiB),
                dict(device=0, segment_pool_id=(1, 0), total_size=32 * GiB, allocated_size=2 * GiB),
                dict(device=1, segment_pool_id=(0, 0), total_size=5 * GiB, allocated_size=0)]
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (60 * GiB, 141 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda *a, **k: segments)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 48 * GiB)  # device 0's segments
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 8 * GiB)
    shape = dict(layers=24, hidden=1024, intermediate=4096, vocab=32000)
    config = SimpleNamespace(num_hidden_layers=24, hidden_size=1024, intermediate_size=4096, vocab_size=32000)
    policy = SimpleNamespace(device=torch.device("cuda:0"), forward_dtype=lambda: torch.float32,
                             model=SimpleNamespace(config=config))
    expected = fitting_micro_batch_tokens(70 * GiB, dtype_bytes=4, **shape)
    assert expected != fitting_micro_batch_tokens(100 * GiB, dtype_bytes=4, **shape)  # what reserved - allocated gives
    assert step_micro_batch_tokens(policy, None) == expected


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_unset_micro_batch_tokens_follow_free_memory():
    from nanorllm.policy.hf_causal import HFCausalPolicy

    policy = HFCausalPolicy.from_name("tiny-random", device="cuda")
    assert step_micro_batch_tokens(policy, None) >= CPU_MICRO_BATCH_TOKENS
    assert step_max_pad_frac(policy, None) == 0.2


def test_a_cpu_update_hands_the_heap_back_once_its_passes_are_done(tiny_policy_factory, monkeypatch):
    # an update's passes are freed at other sizes than the next update's: held, they added up update by update
    # (a game's learner grew to 18.8 GB against a 7 GB pass); trimmed, the next update starts from live memory
    import nanorllm.policy.slot_cache as slot_cache

    policy = tiny_policy_factory()
    results = build_results(policy, two_turns=ONE_LONG)  # its rollout calls trim too: counted before the update's
    calls = []
    monkeypatch.setattr(slot_cache, "_LIBC", SimpleNamespace(malloc_trim=calls.append))
    m = train_step(policy, make_optimizer(policy, config()), results, config(micro_batch_tokens=16))
    assert m["perf/micro_batches"] > 1 and len(calls) == 1
