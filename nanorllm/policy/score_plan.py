"""ScorePlan: what the learner's forward must know about a batch as host numbers, worked out on the host.

On a GPU, every host read of a device value (int(t), nonzero, a boolean-mask index) stalls the host
until the device has caught up, so a micro-batch loop that reads once per pass cannot queue the next
pass while the last one runs. The forward (HFCausalPolicy.forward) needs three such things: how many
leading columns every row shares (computed once for all rows), which (b, t) logits to keep, and
where each position's logits land among the kept ones. collate_train_batch builds the batch from
Python lists and knows all three for free (`score_plan`); `plan_from_tensors` is for a caller that
has only the tensors, and reads them.
"""

import itertools
from dataclasses import dataclass, replace

import torch

MIN_SHARED_COLUMNS = 8  # leading tokens every row must share before they are computed once


@dataclass
class ScorePlan:
    shared: int  # leading columns every row holds the same real tokens in, 0 when not worth sharing
    keep: torch.Tensor  # (B, T) bool, True at the scored positions: the model's `logits_to_keep`
    order: torch.Tensor | None  # (N,) row of the kept logits (row-major) for each position; None: the same order

    def map(self, fn) -> "ScorePlan":
        """The plan with `fn` applied to its tensors (the copy to the batch's device)."""
        return replace(self, keep=fn(self.keep), order=None if self.order is None else fn(self.order))


def score_plan(rows: list[list[int]], positions: list[tuple[int, int]], width: int) -> ScorePlan:
    """The plan of a right-padded (len(rows), width) batch whose row b holds the real tokens rows[b],
    scored at `positions` (b, t), as CPU tensors."""
    flat = [b * width + t for b, t in positions]
    keep = torch.zeros(len(rows) * width, dtype=torch.bool)
    keep[flat] = True
    kept = sorted(set(flat))  # the order the model returns them in
    order = None
    if flat != kept:
        rank = {f: i for i, f in enumerate(kept)}
        order = torch.tensor([rank[f] for f in flat], dtype=torch.long)
    first_scored = min((t for _, t in positions), default=0)
    return ScorePlan(shared_columns(rows, first_scored), keep.view(len(rows), width), order)


def shared_columns(rows: list[list[int]], limit: int) -> int:
    """How many leading columns every row holds the same real tokens in, at most `limit` (the first
    scored position: its logits must come from the rows' own pass); 0 when that is under
    MIN_SHARED_COLUMNS or there is only one row."""
    if len(rows) < 2:
        return 0
    n = 0
    for column in itertools.islice(zip(*rows), limit):  # zip stops at the shortest row: its padding differs
        if column.count(column[0]) != len(column):
            break
        n += 1
    return n if n >= MIN_SHARED_COLUMNS else 0


def plan_from_tensors(input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor) -> ScorePlan:
    """`score_plan` of a right-padded batch given as tensors, on their device. It reads them to the
    host: for callers outside the learner's loop (the startup parity check, tests)."""
    lengths = attention_mask.sum(1).tolist()
    rows = [ids[:n] for ids, n in zip(input_ids.tolist(), lengths)]
    plan = score_plan(rows, [(b, t) for b, t in positions.tolist()], input_ids.shape[1])
    return plan.map(lambda t: t.to(input_ids.device))
