"""The learner forward's inputs worked out on the host: collate's shared-prefix count is the one the
tensors give, and the forward returns the same logits with it as without it, in the order of
`positions` whatever that order (the head's rows are gathered, not masked), or at every position without them."""

import torch

from nanorllm.policy.shared_columns import shared_columns_of
from nanorllm.trainer.loss import compute_policy_loss
from nanorllm.trainer.collate import collate_train_batch
from helpers import loss_settings
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


def test_without_positions_the_forward_gives_every_positions_logits_and_the_loss_reads_them_the_same(tiny_policy):
    """The seed's two lines, `policy.forward(input_ids, attention_mask)` then `compute_policy_loss(logits, batch,
    settings)`: (B, T, V) logits equal to the model's own, and the same loss as the learner's scored positions."""
    batch = collate_train_batch([s for r in build_results(tiny_policy) for s in r.step_samples],
                                pad_id=tiny_policy.pad_id)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        every = tiny_policy.forward(ids, mask).logits
        scored = tiny_policy.forward(ids, mask, batch["positions"], batch["shared_columns"]).logits
        plain = tiny_policy.model(input_ids=ids, attention_mask=mask).logits
    assert every.shape == (*ids.shape, len(tiny_policy.tokenizer))
    real = mask.bool()  # a pad position's logits may differ with the mask's form; no loss reads them
    torch.testing.assert_close(every[real], plain[real], rtol=0, atol=1e-5)
    torch.testing.assert_close(every[batch["positions"][:, 0], batch["positions"][:, 1]], scored, rtol=0, atol=1e-5)
    settings = loss_settings()
    whole, _ = compute_policy_loss(every, batch, settings)
    gathered, _ = compute_policy_loss(scored, batch, settings)
    torch.testing.assert_close(whole, gathered, rtol=0, atol=1e-6)
