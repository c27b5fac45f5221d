"""The forward's plan: collate's, worked out from lists, is the one the tensors give, and the forward
returns the same logits with it as without it, in the order of `positions` whatever that order."""

import torch

from nanorllm.policy.score_plan import plan_from_tensors, score_plan
from nanorllm.trainer.collate import collate_train_batch
from test_train_step import build_results


def test_collates_plan_is_the_one_the_tensors_give(tiny_policy):
    batch = collate_train_batch([s for r in build_results(tiny_policy) for s in r.step_samples],
                                pad_id=tiny_policy.pad_id)
    plan, again = batch["plan"], plan_from_tensors(batch["input_ids"], batch["attention_mask"], batch["positions"])
    assert plan.shared == again.shared > 0  # the rows share their chat template
    assert torch.equal(plan.keep, again.keep) and plan.keep.sum() == batch["positions"].shape[0]
    assert plan.order is None and again.order is None  # collate lists positions row by row, in order


def test_order_maps_the_kept_logits_back_to_the_positions():
    positions = [(1, 1), (0, 2), (0, 0), (1, 1)]  # out of row-major order, one twice
    plan = score_plan([[5, 6, 7], [5, 6]], positions, width=3)
    assert plan.keep.tolist() == [[True, False, True], [False, True, False]]
    assert plan.order.tolist() == [2, 1, 0, 2]  # kept in row-major order: (0, 0), (0, 2), (1, 1)
    assert plan.shared == 0  # two rows, but fewer shared columns than are worth it


def test_the_forward_gives_the_same_logits_with_or_without_the_plan_in_any_order(tiny_policy):
    batch = collate_train_batch([s for r in build_results(tiny_policy) for s in r.step_samples],
                                pad_id=tiny_policy.pad_id)
    args = (batch["input_ids"], batch["attention_mask"])
    perm = torch.randperm(batch["positions"].shape[0], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        planned = tiny_policy.forward(*args, batch["positions"], batch["plan"]).logits
        unplanned = tiny_policy.forward(*args, batch["positions"]).logits
        shuffled = tiny_policy.forward(*args, batch["positions"][perm]).logits
    assert torch.equal(planned, unplanned)
    assert torch.equal(shuffled, planned[perm])
