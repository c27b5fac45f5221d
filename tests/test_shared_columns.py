"""The learner forward's inputs worked out on the host: collate's shared-prefix count is the one the
tensors give, and the forward returns the same logits with it as without it, in the order of
`positions` whatever that order (the head's rows are gathered, not masked)."""

import torch

from nanorllm.policy.shared_columns import shared_columns_of
from nanorllm.trainer.collate import collate_train_batch
from test_train_step import build_results


def test_collates_count_is_the_one_the_tensors_give(tiny_policy):
    batch = collate_train_batch([s for r in build_results(tiny_policy) for s in r.step_samples],
                                pad_id=tiny_policy.pad_id)
    again = shared_columns_of(batch["input_ids"], batch["attention_mask"], batch["positions"])
    assert batch["shared_columns"] == again > 0  # the rows share their chat template


def test_the_forward_gives_the_same_logits_with_or_without_the_count_in_any_order(tiny_policy):
    batch = collate_train_batch([s for r in build_results(tiny_policy) for s in r.step_samples],
                                pad_id=tiny_policy.pad_id)
    args = (batch["input_ids"], batch["attention_mask"])
    perm = torch.randperm(batch["positions"].shape[0], generator=torch.Generator().manual_seed(0))
    twice = torch.cat([batch["positions"][:3], batch["positions"][:3]])  # a position scored twice
    with torch.no_grad():
        counted = tiny_policy.forward(*args, batch["positions"], batch["shared_columns"]).logits
        uncounted = tiny_policy.forward(*args, batch["positions"]).logits
        shuffled = tiny_policy.forward(*args, batch["positions"][perm]).logits
        repeated = tiny_policy.forward(*args, twice).logits
    assert counted.shape == (batch["positions"].shape[0], len(tiny_policy.tokenizer))
    assert torch.equal(counted, uncounted)
    torch.testing.assert_close(shuffled, counted[perm], rtol=0, atol=1e-6)
    torch.testing.assert_close(repeated, torch.cat([counted[:3], counted[:3]]), rtol=0, atol=1e-6)
