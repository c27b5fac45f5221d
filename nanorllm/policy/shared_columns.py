"""How many leading columns every row of a learner batch shares: the prompt template computed once.

The learner's forward (HFCausalPolicy.forward) runs the leading tokens every row holds (chat markup,
system prompt, worked example) through the model once and expands their keys/values to every row.
It needs that count as a host number, and on a GPU reading it from the device would stall the host
until the device caught up, once per micro-batch. collate_train_batch builds the batch from Python
lists, so it counts them there (`shared_columns`); `shared_columns_of` is for a caller that has only
the tensors, and reads them.
"""

import itertools

import torch

MIN_SHARED_COLUMNS = 8  # leading tokens every row must share before they are computed once


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


def shared_columns_of(input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor) -> int:
    """`shared_columns` of a right-padded (B, T) batch scored at `positions` (N, 2), given as tensors.
    It reads them to the host: for callers outside the learner's loop (the startup parity check, tests)."""
    lengths = attention_mask.sum(1).tolist()
    rows = [ids[:n] for ids, n in zip(input_ids.tolist(), lengths)]
    return shared_columns(rows, min(positions[:, 1].tolist(), default=0))
